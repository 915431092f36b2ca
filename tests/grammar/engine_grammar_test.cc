// End to end: the Engine on a small in-memory DeepSeek model with the real DeepSeek V3
// vocabulary generates under grammars from the CompileService, masked through
// GrammarMaskProvider, at temperature 1 with several seeds (and n > 1, whose
// completions share one provider). Every output must be a sentence of the grammar
// (checked token by token on a fresh matcher), end with EOS exactly where the grammar
// accepts, parse, and validate (by hand here; the JSON outputs also go to
// grammar_engine_samples.jsonl for the ajv check, CTest grammar_engine_ajv_check).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "grammar/compile_service.h"
#include "grammar/mask_provider.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "grammar/test_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "support/build_paths.h"

namespace dsi::grammar {
namespace {

using engine::Engine;
using engine::FinishReason;
using engine::GenerateRequest;
using engine::TokenEvent;

constexpr int64_t kWait = 60'000'000'000;

const Tokenizer& real_tokenizer() { return test_util::real_tokenizer(); }

constexpr const char* kSchema = R"({"type":"object","properties":{
    "name":{"type":"string","minLength":1,"maxLength":12},
    "age":{"type":"integer","minimum":0,"maximum":120},
    "role":{"enum":["admin","user","guest"]},
    "tags":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":3},
    "active":{"type":"boolean"}},
  "required":["name","age","role"],"additionalProperties":false})";

constexpr const char* kRegex = "[A-Z]{2}-[0-9]{3,5}( [a-z]{1,8}){0,2}";

size_t code_points(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

// The schema above, by hand: "" when valid, else why not.
std::string validate_person(const std::string& text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return "not JSON";
    if (!j.is_object()) return "not an object";
    for (const char* k : {"name", "age", "role"}) {
        if (!j.contains(k)) return std::string("missing ") + k;
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string& k = it.key();
        const auto& v = it.value();
        if (k == "name") {
            if (!v.is_string()) return "name type";
            size_t n = code_points(v.get<std::string>());
            if (n < 1 || n > 12) return "name length";
        } else if (k == "age") {
            if (!v.is_number_integer()) return "age type";
            if (v.get<int64_t>() < 0 || v.get<int64_t>() > 120) return "age range";
        } else if (k == "role") {
            if (v != "admin" && v != "user" && v != "guest") return "role enum";
        } else if (k == "tags") {
            if (!v.is_array() || v.size() > 3) return "tags";
            for (const auto& t : v) {
                if (!t.is_string() || code_points(t.get<std::string>()) > 6) return "tag";
            }
        } else if (k == "active") {
            if (!v.is_boolean()) return "active type";
        } else {
            return "additional property " + k;
        }
    }
    return "";
}

struct Out {
    std::vector<int32_t> tokens;
    FinishReason reason = FinishReason::kNone;
};

TEST(EngineGrammar, SampledOutputsAreValidAndEosOnlyWhereAccepted) {
    const Tokenizer& tok = real_tokenizer();
    auto vocab = Vocabulary::from_tokenizer(tok);
    ModelConfig c = synthetic_preset("tiny-v3").value();
    c.vocab_size = tok.vocab_size();
    c.bos_token_id = tok.bos_id();
    c.eos_token_id = tok.eos_id();
    c.num_hidden_layers = 2;
    auto model = DeepseekModel::load(synthetic_memory_model(c, 77), {2});
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();

    // Compile off the engine: requests wait for their grammar, then enter.
    CompileService svc;
    std::map<std::string, std::shared_ptr<const CompiledGrammar>> grammars;
    for (const GrammarSpec& spec : {GrammarSpec{GrammarKind::kJsonSchema, kSchema},
                                    GrammarSpec{GrammarKind::kRegex, kRegex}}) {
        auto h = svc.submit(spec, vocab);
        ASSERT_TRUE(h.is_ok()) << h.status().to_string();
        CompileResult r = (*h)->wait_for(kWait);
        ASSERT_TRUE(r.is_ok()) << r.status().to_string();
        grammars[grammar_kind_name(spec.kind)] = *r;
    }

    engine::EngineOptions o;
    o.num_kv_blocks = 256;
    o.scheduler.step_budget_ns = 1e12;
    auto eng = Engine::create(model->get(), o, Env::default_env());
    ASSERT_TRUE(eng.is_ok()) << eng.status().to_string();

    struct Req {
        std::string kind;
        std::shared_ptr<GrammarMaskProvider> provider;
        int32_t n;
    };
    std::map<engine::RequestId, Req> reqs;
    std::map<std::pair<engine::RequestId, int32_t>, Out> outs;
    const std::vector<int32_t> prompt = tok.encode("Reply with the record: ");
    for (const std::string kind : {"json_schema", "regex"}) {
        for (uint64_t seed = 1; seed <= 6; ++seed) {
            GenerateRequest r;
            r.prompt = prompt;
            r.prompt.push_back(static_cast<int32_t>(seed * 7));  // vary the context too
            r.sampling.temperature = 1.0;
            r.sampling.seed = seed * 1000 + (kind == "regex");
            r.sampling.max_tokens = 256;
            r.sampling.n = seed == 6 ? 3 : 1;  // completions sharing one provider
            auto provider = std::make_shared<GrammarMaskProvider>(grammars[kind]);
            r.mask = provider;
            auto id = (*eng)->add_request(std::move(r), [&](const TokenEvent& ev) {
                Out& out = outs[{ev.request_id, ev.index}];
                if (ev.token >= 0) out.tokens.push_back(ev.token);
                if (ev.finished) out.reason = ev.reason;
            });
            ASSERT_TRUE(id.is_ok()) << id.status().to_string();
            reqs[*id] = Req{kind, provider, seed == 6 ? 3 : 1};
        }
    }
    ASSERT_TRUE((*eng)->run().is_ok());

    std::ofstream samples(std::string(DSINFER_BINARY_DIR) + "/grammar_engine_samples.jsonl");
    const nlohmann::json schema_json = nlohmann::json::parse(kSchema);
    int checked = 0;
    int64_t total_tokens = 0;
    std::set<std::string> distinct;
    int64_t fills = 0, fill_ns = 0, fill_ns_max = 0;
    for (const auto& [id, req] : reqs) {
        for (int32_t index = 0; index < req.n; ++index) {
            const Out& out = outs[{id, index}];
            SCOPED_TRACE(req.kind + " request " + std::to_string(id) + "." +
                         std::to_string(index));
            ASSERT_EQ(out.reason, FinishReason::kStop);
            ASSERT_FALSE(out.tokens.empty());
            ASSERT_EQ(out.tokens.back(), tok.eos_id());
            // Token by token on a fresh matcher: every token allowed, EOS only at the end
            // and only where the grammar accepts.
            GrammarMatcher m(grammars[req.kind]);
            for (size_t i = 0; i + 1 < out.tokens.size(); ++i) {
                ASSERT_NE(out.tokens[i], tok.eos_id());
                ASSERT_TRUE(m.advance(out.tokens[i])) << "token " << i;
            }
            ASSERT_TRUE(m.is_accepted());
            ASSERT_TRUE(m.advance(tok.eos_id()));
            std::vector<int32_t> body(out.tokens.begin(), out.tokens.end() - 1);
            const std::string text = tok.decode(body);
            total_tokens += static_cast<int64_t>(out.tokens.size());
            distinct.insert(text);
            if (req.kind == "regex") {
                EXPECT_TRUE(std::regex_match(text, std::regex(kRegex))) << text;
            } else {
                EXPECT_EQ(validate_person(text), "") << text;
                samples << nlohmann::json{{"schema", schema_json}, {"output", text}}.dump()
                        << "\n";
            }
            ++checked;
        }
        GrammarMaskProvider::Stats ps = req.provider->stats();
        EXPECT_EQ(ps.rejected_tokens, 0);
        fills += ps.fills;
        fill_ns += ps.fill_ns_total;
        fill_ns_max = std::max(fill_ns_max, ps.fill_ns_max);
    }
    EXPECT_EQ(checked, 2 * (5 + 3));
    // Temperature 1 with different seeds: the outputs are not all the same.
    EXPECT_GT(distinct.size(), 8u);
    std::printf("engine grammar: vocab %d, %d outputs, %lld tokens, %zu distinct\n",
                tok.vocab_size(), checked, static_cast<long long>(total_tokens), distinct.size());
    std::printf("engine grammar: %lld mask fills, mean %.1f us, max %.1f us (cold + warm)\n",
                static_cast<long long>(fills), fills ? fill_ns / 1e3 / fills : 0.0,
                fill_ns_max / 1e3);
}

// The provider answers for the output it is given: after a preemption (shorter
// output) or for interleaved completions, its mask equals a fresh matcher's.
TEST(EngineGrammar, ProviderFollowsTheOutputItIsGiven) {
    auto vocab = Vocabulary::from_tokenizer(real_tokenizer());
    auto g = compile_grammar({GrammarKind::kRegex, "(ab|cd)+"});
    ASSERT_TRUE(g.is_ok());
    auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), vocab);
    GrammarMaskProvider p(cg, /*max_matchers=*/2);
    const Tokenizer& tok = real_tokenizer();
    auto ids = [&](const char* s) { return tok.encode(s); };
    const int64_t model_vocab = vocab->size() + 100;  // padded model rows: never allowed
    auto expect_fresh = [&](const std::vector<int32_t>& out) {
        TokenMask got(model_vocab);
        p.fill(out, got);
        GrammarMatcher m(cg);
        for (int32_t t : out) ASSERT_TRUE(m.advance(t));
        TokenBitmask want(vocab->size());
        m.fill_mask(&want);
        for (int32_t t = 0; t < model_vocab; ++t) {
            ASSERT_EQ(got.allowed(t), t < vocab->size() && want.test(t)) << t;
        }
    };
    std::vector<std::string> seqs = {"", "ab", "abcd", "cd", "ab", "abab", "cdcdab", "ab"};
    for (const std::string& s : seqs) expect_fresh(ids(s.c_str()));
    // A token outside the grammar: nothing allowed (the engine ends that completion).
    TokenMask m(model_vocab);
    p.fill(ids("zz"), m);
    for (int32_t t = 0; t < model_vocab; ++t) ASSERT_FALSE(m.allowed(t));
    EXPECT_LE(p.stats().matchers, 2);
    EXPECT_EQ(p.stats().rejected_tokens, 1);
}

}  // namespace
}  // namespace dsi::grammar
