// Evaluation of a model on held-out generated tasks (tools/eval/eval.h).
#include "eval/eval.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "base/env.h"
#include "grammar/compile_service.h"
#include "grammar/mask_provider.h"
#include "grammar/vocabulary.h"
#include "model/deepseek.h"
#include "model/weights.h"
#include "protocol/adapters.h"
#include "protocol/encoder.h"
#include "protocol/output_parser.h"
#include "protocol/prompt.h"
#include "protocol/request.h"
#include "protocol/structured_output.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace dsi::tools {
namespace {

using nlohmann::json;
using protocol::Role;

struct Generation {
    std::vector<int32_t> ids;
    int64_t drafts = 0;
    int64_t accepted = 0;
};

int32_t argmax(const float* v, int64_t n) {
    int32_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
        if (v[i] > v[best]) best = static_cast<int32_t>(i);
    }
    return best;
}

// Greedy choice among the tokens `mask` allows for `output` (all without a mask);
// -1 when the mask allows none.
int32_t choose(const float* logits, int64_t n, TokenMaskProvider* mask,
               const std::vector<int32_t>& output, TokenMask* scratch) {
    if (mask == nullptr) return argmax(logits, n);
    scratch->reset(n, true);
    mask->fill(output, *scratch);
    int32_t best = -1;
    for (int64_t i = 0; i < n; ++i) {
        if (scratch->allowed(static_cast<int32_t>(i)) && (best < 0 || logits[i] > logits[best])) {
            best = static_cast<int32_t>(i);
        }
    }
    return best;
}

// Greedy completion of `prompt` with first-draft MTP statistics; with `mask`, each
// token is the best one the structured-output mask allows (as the server's sampler).
Result<Generation> generate(DeepseekModel& m, const std::vector<int32_t>& prompt, int max_tokens,
                            int32_t eos, TokenMaskProvider* mask = nullptr) {
    const int64_t V = m.config().vocab_size;
    const int64_t H = m.config().hidden_size;
    const bool has_mtp = m.config().num_nextn_predict_layers > 0;
    const int64_t P = static_cast<int64_t>(prompt.size());
    auto cache = m.new_kv_cache(P + max_tokens + 2);
    ForwardOutput out;
    DSI_RETURN_IF_ERROR(m.forward(prompt, 0, *cache, true, out));
    std::vector<float> draft_logits;
    if (has_mtp && P > 1) {  // the MTP layer's KV rows for the prompt
        std::span<const int32_t> next(prompt.data() + 1, static_cast<size_t>(P - 1));
        std::span<const float> hid(out.hidden.data(), static_cast<size_t>((P - 1) * H));
        DSI_RETURN_IF_ERROR(m.mtp_forward(next, hid, 0, *cache, draft_logits));
    }
    Generation g;
    TokenMask scratch;
    std::vector<float> hidden(out.hidden.end() - H, out.hidden.end());
    int32_t next = choose(out.logits.data() + (P - 1) * V, V, mask, g.ids, &scratch);
    int32_t pending_draft = -1;
    int64_t pos = P;
    while (next >= 0) {
        if (pending_draft >= 0) {
            ++g.drafts;
            g.accepted += pending_draft == next;
        }
        g.ids.push_back(next);
        if (next == eos || static_cast<int>(g.ids.size()) >= max_tokens) break;
        if (has_mtp) {  // draft the token after `next` from the last hidden state
            DSI_RETURN_IF_ERROR(m.mtp_forward(std::span<const int32_t>(&next, 1), hidden,
                                              pos - 1, *cache, draft_logits));
            pending_draft = argmax(draft_logits.data(), V);
        }
        DSI_RETURN_IF_ERROR(m.forward(std::span<const int32_t>(&next, 1), pos, *cache, false, out));
        hidden.assign(out.hidden.begin(), out.hidden.end());
        next = choose(out.logits.data(), V, mask, g.ids, &scratch);
        ++pos;
    }
    return g;
}

std::string trim(const std::string& s) {
    const size_t a = s.find_first_not_of(" \n\t");
    const size_t b = s.find_last_not_of(" \n\t");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

bool type_ok(const json& v, const std::string& type) {
    if (type == "string") return v.is_string();
    if (type == "integer") return v.is_number_integer();
    if (type == "number") return v.is_number();
    if (type == "boolean") return v.is_boolean();
    if (type == "array") return v.is_array();
    if (type == "object") return v.is_object();
    return true;
}

// Scores one completion; returns metric name -> 0/1.
std::map<std::string, int> score(const json& check, const protocol::Completion& c) {
    std::map<std::string, int> r;
    const std::string kind = check.value("kind", "");
    const std::string content = trim(c.content);
    if (kind == "number") {
        const std::string n = check["answer"].dump();
        r["correct"] = std::regex_search(content, std::regex("(^|[^0-9])" + n + "([^0-9]|$)"));
    } else if (kind == "contains") {
        r["correct"] = content.find(check["answer"].get<std::string>()) != std::string::npos;
    } else if (kind == "exact") {
        r["correct"] = content == check["answer"].get<std::string>();
    } else if (kind == "json") {
        json v = json::parse(content, nullptr, false);
        bool valid = !v.is_discarded() && v.is_object();
        if (valid) {
            const json& schema = check["schema"];
            for (const auto& key : schema.value("required", json::array())) {
                const std::string k = key.get<std::string>();
                const std::string t = schema["properties"][k].value("type", "");
                valid = valid && v.contains(k) && type_ok(v[k], t);
            }
        }
        r["json_valid"] = valid;
        r["correct"] = valid && v == check["answer"];
    } else if (kind == "tool_call") {
        const bool form = !c.tool_calls.empty() && !c.malformed;
        r["tool_form"] = form;
        r["tool_name"] = form && c.tool_calls[0].name == check["name"].get<std::string>();
        json args = form ? json::parse(c.tool_calls[0].arguments, nullptr, false) : json();
        r["correct"] = r["tool_name"] && !args.is_discarded() && args == check["arguments"];
    } else if (kind == "english") {
        int words = 0;
        bool ascii = !content.empty();
        bool in_word = false;
        for (unsigned char ch : content) {
            ascii = ascii && ch >= 0x20 && ch < 0x7f;
            const bool alpha = std::isalpha(ch) != 0;
            words += alpha && !in_word;
            in_word = alpha;
        }
        r["correct"] = ascii && words >= 3;
    }
    return r;
}

Result<double> heldout_loss(DeepseekModel& m, const std::string& prefix, int limit,
                            int64_t* tokens) {
    Env* env = Env::default_env();
    DSI_ASSIGN_OR_RETURN(std::string tok, env->read_file(prefix + ".tok"));
    DSI_ASSIGN_OR_RETURN(std::string msk, env->read_file(prefix + ".msk"));
    DSI_ASSIGN_OR_RETURN(std::string idx, env->read_file(prefix + ".idx"));
    const auto* ids = reinterpret_cast<const int32_t*>(tok.data());
    const auto* off = reinterpret_cast<const int64_t*>(idx.data());
    const int64_t n = static_cast<int64_t>(idx.size() / 8) - 1;
    const int64_t V = m.config().vocab_size;
    double sum = 0;
    *tokens = 0;
    for (int64_t e = 0; e < n && (limit <= 0 || e < limit); ++e) {
        std::vector<int32_t> seq(ids + off[e], ids + off[e + 1]);
        auto cache = m.new_kv_cache(static_cast<int64_t>(seq.size()));
        ForwardOutput out;
        DSI_RETURN_IF_ERROR(m.forward(seq, 0, *cache, true, out));
        for (size_t t = 0; t + 1 < seq.size(); ++t) {
            if (msk[off[e] + t + 1] != 2) continue;
            const float* l = out.logits.data() + t * V;
            const float mx = l[argmax(l, V)];
            double z = 0;
            for (int64_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(l[i] - mx));
            sum += std::log(z) + mx - l[seq[t + 1]];
            ++*tokens;
        }
    }
    return *tokens ? sum / static_cast<double>(*tokens) : 0.0;
}

}  // namespace

Result<nlohmann::json> evaluate_model(DeepseekModel& model, const Tokenizer& tokenizer,
                                      const EvalOptions& o) {
    const protocol::SpecialTokens sp = protocol::SpecialTokens::from_tokenizer(tokenizer);
    using Families = std::map<std::string, std::map<std::string, std::pair<int64_t, int64_t>>>;
    Families fam, gfam;  // task -> metric -> (hits, n); gfam: under the grammar
    std::pair<int64_t, int64_t> closed{0, 0};
    int64_t drafts = 0, accepted = 0, out_tokens = 0, cases = 0;
    json samples = json::array();
    json grammar_samples = json::array();
    std::unique_ptr<grammar::CompileService> compiler;
    std::shared_ptr<const grammar::Vocabulary> vocab;
    if (o.grammar) {
        grammar::CompileServiceOptions co;
        co.num_workers = 1;
        grammar::JsonSchemaOptions jo;
        jo.space_after_separators = !o.compact_json;
        co.compile = [jo](const grammar::GrammarSpec& spec) {
            return protocol::compile_request_grammar(spec, jo);
        };
        compiler = std::make_unique<grammar::CompileService>(std::move(co));
        vocab = grammar::Vocabulary::from_tokenizer(tokenizer);
    }
    auto tally = [](Families& f, const std::string& task, const std::map<std::string, int>& hits) {
        for (const auto& [metric, hit] : hits) {
            for (const std::string& t : {task, std::string("all")}) {
                f[t][metric].first += hit;
                f[t][metric].second += 1;
            }
        }
    };
    // The conversation cut after its last user message, encoded as `serve` would.
    auto encode = [&](protocol::Conversation conv) -> Result<std::vector<int32_t>> {
        size_t last_user = 0;
        for (size_t i = 0; i < conv.messages.size(); ++i) {
            if (conv.messages[i].role == Role::kUser) last_user = i;
        }
        conv.messages.resize(last_user + 1);
        DSI_ASSIGN_OR_RETURN(protocol::Prompt prompt,
                             protocol::encode_conversation(protocol::ChatEncoding::kDeepSeekV32,
                                                           conv, sp));
        return prompt.encode(tokenizer);
    };
    std::ifstream in(o.cases);
    if (!in) return not_found("cannot read " + o.cases);
    std::string line;
    while (std::getline(in, line) && (o.limit <= 0 || cases < o.limit)) {
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.contains("request")) continue;
        const std::string kind = j["check"].value("kind", "");
        const bool structured = kind == "json" || kind == "tool_call";
        if (o.structured_only && !structured) continue;
        const int max_tokens = structured ? std::max(o.max_tokens, o.structured_max_tokens)
                                          : o.max_tokens;
        auto conv = protocol::parse_chat_completions_request(j["request"].dump());
        if (!conv.is_ok()) return conv.status().with_context(o.cases);
        DSI_ASSIGN_OR_RETURN(std::vector<int32_t> ids, encode(*conv));
        DSI_ASSIGN_OR_RETURN(Generation gen, generate(model, ids, max_tokens, sp.eos));
        protocol::ParserOptions po;
        po.thinking = conv->thinking;
        protocol::Completion c =
            protocol::fold_events(protocol::parse_completion(tokenizer, sp, po, gen.ids));
        const std::string task = j.value("task", "?");
        tally(fam, task, score(j["check"], c));
        if (conv->thinking) {
            closed.second += 1;
            closed.first += std::find(gen.ids.begin(), gen.ids.end(), sp.think_end) != gen.ids.end();
        }
        drafts += gen.drafts;
        accepted += gen.accepted;
        out_tokens += static_cast<int64_t>(gen.ids.size());
        if (samples.size() < 40) {
            samples.push_back({{"task", task},
                               {"reasoning", c.reasoning},
                               {"content", c.content},
                               {"tool_calls", c.tool_calls.empty() ? "" : c.tool_calls[0].name + " " +
                                                                      c.tool_calls[0].arguments}});
        }
        if (o.grammar && structured) {
            // The grammar the server applies: the request's response_format, or a tool
            // call forced by tool_choice "required" (thinking off, as the server does).
            // Member order kept: a schema's property order is its output order.
            protocol::OrderedJson body = protocol::OrderedJson::parse(line)["request"];
            if (kind == "tool_call") body["tool_choice"] = "required";
            DSI_ASSIGN_OR_RETURN(protocol::Request req,
                                 protocol::parse_api_request(protocol::ApiProtocol::kChatCompletions,
                                                             body.dump()));
            if (!req.grammar) return invalid_argument(o.cases + ": a " + kind + " case without a grammar");
            auto handle = compiler->submit(req.grammar->spec, vocab);
            if (!handle.is_ok()) return handle.status().with_context(req.grammar->field);
            grammar::CompileResult compiled = (*handle)->wait_for(int64_t{60} * 1000000000);
            if (!compiled.is_ok()) return compiled.status().with_context(req.grammar->field);
            grammar::GrammarMaskProvider mask(std::move(compiled).value());
            DSI_ASSIGN_OR_RETURN(std::vector<int32_t> gids, encode(req.conversation));
            DSI_ASSIGN_OR_RETURN(Generation g, generate(model, gids, max_tokens, sp.eos, &mask));
            protocol::ParserOptions gpo;
            gpo.thinking = req.conversation.thinking;
            protocol::Completion gc =
                protocol::fold_events(protocol::parse_completion(tokenizer, sp, gpo, g.ids));
            tally(gfam, task, score(j["check"], gc));
            if (grammar_samples.size() < 40) {
                grammar_samples.push_back(
                    {{"task", task},
                     {"content", gc.content},
                     {"tool_calls", gc.tool_calls.empty() ? "" : gc.tool_calls[0].name + " " +
                                                                 gc.tool_calls[0].arguments}});
            }
        }
        ++cases;
    }
    json res;
    res["cases"] = cases;
    res["output_tokens"] = out_tokens;
    auto report = [](const Families& f, json& into) {
        for (const auto& [task, metrics] : f) {
            for (const auto& [metric, hn] : metrics) {
                into["accuracy"][task][metric] = static_cast<double>(hn.first) / hn.second;
                into["counts"][task][metric] = {hn.first, hn.second};
            }
        }
    };
    report(fam, res);
    if (o.grammar) {
        report(gfam, res["with_grammar"]);
        res["with_grammar"]["samples"] = grammar_samples;
    }
    res["reasoning_closed"] = closed.second ? static_cast<double>(closed.first) / closed.second : 0.0;
    res["mtp_first_draft_acceptance"] = drafts ? static_cast<double>(accepted) / drafts : 0.0;
    res["mtp_drafts"] = drafts;
    if (!o.loss_set.empty()) {
        int64_t n = 0;
        DSI_ASSIGN_OR_RETURN(double loss, heldout_loss(model, o.loss_set, o.loss_limit, &n));
        res["heldout_loss_nats"] = loss;
        res["heldout_loss_tokens"] = n;
    }
    res["samples"] = samples;
    return res;
}

}  // namespace dsi::tools
