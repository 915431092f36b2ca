#include "server/engine_rpc.h"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "server/structured_output.h"

namespace dsi::server {

namespace {

using nlohmann::json;

// A field reader that names the field in its errors.
class Reader {
public:
    Reader(const json& j, std::string prefix) : j_(j), prefix_(std::move(prefix)) {}

    template <class T>
    Status get(const char* key, T* out, bool required = false) const {
        auto it = j_.find(key);
        if (it == j_.end() || it->is_null()) {
            return required ? invalid_argument(prefix_ + key + ": missing") : Status::ok();
        }
        bool ok = false;
        if constexpr (std::is_same_v<T, bool>) {
            ok = it->is_boolean();
        } else if constexpr (std::is_integral_v<T>) {
            ok = it->is_number_integer();
        } else if constexpr (std::is_floating_point_v<T>) {
            ok = it->is_number();
        } else {
            ok = it->is_string();
        }
        if (!ok) return invalid_argument(prefix_ + key + ": wrong type");
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
            const auto v = it->get<int64_t>();
            if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
                v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
                return invalid_argument(prefix_ + key + ": out of range");
            }
            *out = static_cast<T>(v);
        } else {
            *out = it->get<T>();
        }
        return Status::ok();
    }

    template <class T>
    Status list(const char* key, std::vector<T>* out) const {
        auto it = j_.find(key);
        if (it == j_.end() || it->is_null()) return Status::ok();
        if (!it->is_array()) return invalid_argument(prefix_ + key + ": must be an array");
        out->clear();
        out->reserve(it->size());
        for (const json& v : *it) {
            if constexpr (std::is_integral_v<T>) {
                if (!v.is_number_integer()) {
                    return invalid_argument(prefix_ + key + ": must hold integers");
                }
                const auto x = v.get<int64_t>();
                if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) {
                    return invalid_argument(prefix_ + key + ": value out of range");
                }
                out->push_back(static_cast<T>(x));
            } else {
                if (!v.is_string()) return invalid_argument(prefix_ + key + ": must hold strings");
                out->push_back(v.get<std::string>());
            }
        }
        return Status::ok();
    }

private:
    const json& j_;
    std::string prefix_;
};

json pairs_json(const std::vector<std::pair<int32_t, float>>& v) {
    json a = json::array();
    for (const auto& [id, x] : v) a.push_back(json::array({id, x}));
    return a;
}

Status read_pairs(const json& a, const std::string& field,
                  std::vector<std::pair<int32_t, float>>* out) {
    if (!a.is_array()) return invalid_argument(field + ": must be an array");
    for (const json& p : a) {
        if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number()) {
            return invalid_argument(field + ": each entry must be [token id, number]");
        }
        const auto id = p[0].get<int64_t>();
        if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
            return invalid_argument(field + ": token id out of range");
        }
        out->emplace_back(static_cast<int32_t>(id), p[1].get<float>());
    }
    return Status::ok();
}

Result<grammar::GrammarKind> parse_grammar_kind(std::string_view s) {
    for (auto k : {grammar::GrammarKind::kJsonSchema, grammar::GrammarKind::kJsonObject,
                   grammar::GrammarKind::kRegex, grammar::GrammarKind::kEbnf}) {
        if (s == grammar::grammar_kind_name(k)) return k;
    }
    return invalid_argument("grammar.kind: unknown kind '" + std::string(s) + "'");
}

Result<engine::FinishReason> parse_reason(std::string_view s) {
    using engine::FinishReason;
    for (auto r : {FinishReason::kNone, FinishReason::kStop, FinishReason::kLength,
                   FinishReason::kAbort, FinishReason::kDeadline, FinishReason::kError}) {
        if (s == engine::finish_reason_name(r)) return r;
    }
    return invalid_argument("reason: unknown finish reason '" + std::string(s) + "'");
}

// 32 hex digits (TransferId::to_string).
Result<transfer::TransferId> parse_transfer_id(const std::string& s) {
    if (s.size() != 32 || s.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
        return invalid_argument("handoff.id: must be 32 hex digits");
    }
    transfer::TransferId id;
    id.hi = std::strtoull(s.substr(0, 16).c_str(), nullptr, 16);
    id.lo = std::strtoull(s.substr(16).c_str(), nullptr, 16);
    return id;
}

Result<StatusCode> parse_code(std::string_view s) {
    for (int c = 0; c <= static_cast<int>(StatusCode::kDataLoss); ++c) {
        if (s == status_code_name(static_cast<StatusCode>(c))) return static_cast<StatusCode>(c);
    }
    return invalid_argument("error.code: unknown status code '" + std::string(s) + "'");
}

}  // namespace

std::string chain_key_hex(const kv::BlockKey& key) {
    return transfer::TransferId{key.hi, key.lo}.to_string();
}

bool parse_chain_key_hex(std::string_view s, kv::BlockKey* key) {
    Result<transfer::TransferId> id = parse_transfer_id(std::string(s));
    if (!id.is_ok()) return false;
    *key = kv::BlockKey{id->lo, id->hi};
    return true;
}

std::string encode_generation(const Generation& g, int64_t timeout_ms) {
    const engine::GenerateRequest& r = g.request;
    const SamplingParams& s = r.sampling;
    json sp = {{"temperature", s.temperature},
               {"top_k", s.top_k},
               {"top_p", s.top_p},
               {"min_p", s.min_p},
               {"repetition_penalty", s.repetition_penalty},
               {"frequency_penalty", s.frequency_penalty},
               {"presence_penalty", s.presence_penalty},
               {"logit_bias", pairs_json(s.logit_bias)},
               {"stop_token_ids", s.stop_token_ids},
               {"stop", s.stop},
               {"ignore_eos", s.ignore_eos},
               {"max_tokens", s.max_tokens},
               {"min_tokens", s.min_tokens},
               {"logprobs", s.logprobs},
               {"n", s.n},
               // As a string: 64 bits survive every JSON reader.
               {"seed", std::to_string(s.seed)}};
    json j = {{"prompt", r.prompt},
              {"sampling", std::move(sp)},
              {"cache_salt", r.cache_salt},
              {"agent_traffic", r.agent_traffic},
              {"timeout_ms", timeout_ms}};
    if (!r.resume_output.empty()) j["resume"] = r.resume_output;
    if (g.handoff) {
        j["handoff"] = {{"address", g.handoff->address}, {"id", g.handoff->id.to_string()}};
    }
    if (g.swa_pull) {
        j["swa_pull"] = {{"address", g.swa_pull->address},
                         {"key", chain_key_hex(g.swa_pull->key.chain)},
                         {"position", g.swa_pull->key.position}};
    }
    if (g.structured) {
        // The whole spec: a field added to grammar::GrammarSpec must be added here and in
        // decode_generation (engine_rpc_test round-trips a spec with every field set).
        const grammar::GrammarSpec& spec = g.structured->spec;
        j["grammar"] = {{"kind", grammar::grammar_kind_name(spec.kind)},
                        {"text", spec.text},
                        {"flexible_whitespace", spec.flexible_whitespace},
                        {"any_property_order", spec.any_property_order},
                        {"field", g.structured->field}};
    }
    // The salt may hold bytes that are not UTF-8: replace rather than throw (a salt
    // from an API key file is the key holder's text; from a request it is checked).
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<Generation> decode_generation(const ApiContext& ctx, std::string_view body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
        return invalid_argument("engine rpc: body is not a JSON object");
    }
    Generation g;
    engine::GenerateRequest& r = g.request;
    Reader top(j, "");
    DSI_RETURN_IF_ERROR(top.list("prompt", &r.prompt));
    if (r.prompt.empty()) return invalid_argument("prompt: must not be empty");
    if (static_cast<int64_t>(r.prompt.size()) > ctx.limits.max_prompt_tokens) {
        return invalid_argument("prompt: " + std::to_string(r.prompt.size()) +
                                " tokens is over the limit of " +
                                std::to_string(ctx.limits.max_prompt_tokens));
    }
    const int64_t vocab = ctx.tokenizer != nullptr ? ctx.tokenizer->vocab_size() : 0;
    for (int32_t id : r.prompt) {
        if (id < 0 || (vocab > 0 && id >= vocab)) {
            return invalid_argument("prompt: token id " + std::to_string(id) +
                                    " is outside the vocabulary");
        }
    }
    DSI_RETURN_IF_ERROR(top.list("resume", &r.resume_output));
    for (int32_t id : r.resume_output) {
        if (id < 0 || (vocab > 0 && id >= vocab)) {
            return invalid_argument("resume: token id " + std::to_string(id) +
                                    " is outside the vocabulary");
        }
    }
    DSI_RETURN_IF_ERROR(top.get("cache_salt", &r.cache_salt));
    DSI_RETURN_IF_ERROR(top.get("agent_traffic", &r.agent_traffic));
    int64_t timeout_ms = 0;
    DSI_RETURN_IF_ERROR(top.get("timeout_ms", &timeout_ms));
    if (timeout_ms < 0) return invalid_argument("timeout_ms: must be >= 0");
    if (timeout_ms > 0) {
        Env* env = ctx.env != nullptr ? ctx.env : Env::default_env();
        r.deadline_ns = env->now_ns() + timeout_ms * 1000000;
    }
    if (auto hit = j.find("handoff"); hit != j.end() && !hit->is_null()) {
        if (!hit->is_object()) return invalid_argument("handoff: must be an object");
        Reader hr(*hit, "handoff.");
        serving::HandoffTarget t;
        std::string id;
        DSI_RETURN_IF_ERROR(hr.get("address", &t.address, /*required=*/true));
        DSI_RETURN_IF_ERROR(hr.get("id", &id, /*required=*/true));
        if (t.address.empty() || t.address.size() > 300) {
            return invalid_argument("handoff.address: must be host:port");
        }
        DSI_ASSIGN_OR_RETURN(t.id, parse_transfer_id(id));
        g.handoff = std::move(t);
    }
    if (auto pit = j.find("swa_pull"); pit != j.end() && !pit->is_null()) {
        if (!pit->is_object()) return invalid_argument("swa_pull: must be an object");
        Reader pr(*pit, "swa_pull.");
        serving::SwaPullTarget t;
        std::string key;
        DSI_RETURN_IF_ERROR(pr.get("address", &t.address, /*required=*/true));
        DSI_RETURN_IF_ERROR(pr.get("key", &key, /*required=*/true));
        DSI_RETURN_IF_ERROR(pr.get("position", &t.key.position, /*required=*/true));
        if (t.address.empty() || t.address.size() > 300) {
            return invalid_argument("swa_pull.address: must be host:port");
        }
        if (!parse_chain_key_hex(key, &t.key.chain)) {
            return invalid_argument("swa_pull.key: must be 32 hex digits");
        }
        if (t.key.position <= 0 || t.key.position % kv::kBlockTokens != 0) {
            return invalid_argument("swa_pull.position: must be a positive multiple of 128");
        }
        g.swa_pull = std::move(t);
    }
    auto sit = j.find("sampling");
    if (sit == j.end() || !sit->is_object()) return invalid_argument("sampling: missing");
    Reader sr(*sit, "sampling.");
    SamplingParams& s = r.sampling;
    DSI_RETURN_IF_ERROR(sr.get("temperature", &s.temperature));
    DSI_RETURN_IF_ERROR(sr.get("top_k", &s.top_k));
    DSI_RETURN_IF_ERROR(sr.get("top_p", &s.top_p));
    DSI_RETURN_IF_ERROR(sr.get("min_p", &s.min_p));
    DSI_RETURN_IF_ERROR(sr.get("repetition_penalty", &s.repetition_penalty));
    DSI_RETURN_IF_ERROR(sr.get("frequency_penalty", &s.frequency_penalty));
    DSI_RETURN_IF_ERROR(sr.get("presence_penalty", &s.presence_penalty));
    if (auto it = sit->find("logit_bias"); it != sit->end()) {
        DSI_RETURN_IF_ERROR(read_pairs(*it, "sampling.logit_bias", &s.logit_bias));
    }
    DSI_RETURN_IF_ERROR(sr.list("stop_token_ids", &s.stop_token_ids));
    DSI_RETURN_IF_ERROR(sr.list("stop", &s.stop));
    DSI_RETURN_IF_ERROR(sr.get("ignore_eos", &s.ignore_eos));
    DSI_RETURN_IF_ERROR(sr.get("max_tokens", &s.max_tokens, /*required=*/true));
    DSI_RETURN_IF_ERROR(sr.get("min_tokens", &s.min_tokens));
    DSI_RETURN_IF_ERROR(sr.get("logprobs", &s.logprobs));
    DSI_RETURN_IF_ERROR(sr.get("n", &s.n));
    std::string seed;
    DSI_RETURN_IF_ERROR(sr.get("seed", &seed, /*required=*/true));
    if (seed.empty() || seed.size() > 20 ||
        seed.find_first_not_of("0123456789") != std::string::npos) {
        return invalid_argument("sampling.seed: must be a decimal string");
    }
    errno = 0;
    s.seed = std::strtoull(seed.c_str(), nullptr, 10);
    if (errno != 0) return invalid_argument("sampling.seed: out of range");
    if (s.max_tokens > ctx.limits.max_tokens) {
        return invalid_argument("sampling.max_tokens: over the limit of " +
                                std::to_string(ctx.limits.max_tokens));
    }
    DSI_RETURN_IF_ERROR(validate_sampling(s, vocab));
    if (auto git = j.find("grammar"); git != j.end() && !git->is_null()) {
        if (!git->is_object()) return invalid_argument("grammar: must be an object");
        Reader gr(*git, "grammar.");
        std::string kind;
        protocol::StructuredRequest so;
        DSI_RETURN_IF_ERROR(gr.get("kind", &kind, /*required=*/true));
        DSI_ASSIGN_OR_RETURN(so.spec.kind, parse_grammar_kind(kind));
        DSI_RETURN_IF_ERROR(gr.get("text", &so.spec.text));
        DSI_RETURN_IF_ERROR(gr.get("flexible_whitespace", &so.spec.flexible_whitespace));
        DSI_RETURN_IF_ERROR(gr.get("any_property_order", &so.spec.any_property_order));
        DSI_RETURN_IF_ERROR(gr.get("field", &so.field));
        if (ctx.structured_output == nullptr) {
            return unimplemented(so.field + ": structured output is not enabled on this engine");
        }
        DSI_ASSIGN_OR_RETURN(r.mask, ctx.structured_output->provider(so));
        g.structured = std::move(so);
    }
    return g;
}

std::string encode_update(const Update& u) {
    json tokens = json::array();
    for (const TokenOut& t : u.tokens) {
        json o = {{"id", t.token}, {"text", t.text}, {"logprob", t.logprob}};
        if (!t.top_logprobs.empty()) o["top"] = pairs_json(t.top_logprobs);
        tokens.push_back(std::move(o));
    }
    json j = {{"tokens", std::move(tokens)},
              {"finished", u.finished},
              {"reason", engine::finish_reason_name(u.reason)},
              {"cached", u.cached_prompt_tokens},
              {"spec", json::array({u.speculative.draft_tokens, u.speculative.accepted_tokens,
                                    u.speculative.verify_steps})}};
    if (!u.error.is_ok()) {
        j["error"] = {{"code", status_code_name(u.error.code())}, {"message", u.error.message()}};
    }
    if (u.handoff) {
        j["handoff"] = {{"ok", u.handoff->ok},
                        {"blocks", u.handoff->blocks},
                        {"bytes", u.handoff->bytes},
                        {"us", u.handoff->micros},
                        {"error", u.handoff->error}};
    }
    // Token text is whole UTF-8 characters from the engine's detokenizer; replace
    // anything else rather than throw.
    return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

Result<Update> decode_update(std::string_view line) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
        return invalid_argument("engine rpc update: not a JSON object");
    }
    Update u;
    Reader top(j, "update.");
    DSI_RETURN_IF_ERROR(top.get("finished", &u.finished, /*required=*/true));
    std::string reason;
    DSI_RETURN_IF_ERROR(top.get("reason", &reason, /*required=*/true));
    DSI_ASSIGN_OR_RETURN(u.reason, parse_reason(reason));
    DSI_RETURN_IF_ERROR(top.get("cached", &u.cached_prompt_tokens));
    if (auto it = j.find("spec"); it != j.end()) {
        if (!it->is_array() || it->size() != 3 || !(*it)[0].is_number_integer() ||
            !(*it)[1].is_number_integer() || !(*it)[2].is_number_integer()) {
            return invalid_argument("update.spec: must be [drafts, accepted, verify steps]");
        }
        u.speculative.draft_tokens = (*it)[0].get<int64_t>();
        u.speculative.accepted_tokens = (*it)[1].get<int64_t>();
        u.speculative.verify_steps = (*it)[2].get<int64_t>();
    }
    auto tit = j.find("tokens");
    if (tit == j.end() || !tit->is_array()) return invalid_argument("update.tokens: missing");
    for (const json& t : *tit) {
        if (!t.is_object()) return invalid_argument("update.tokens: entries must be objects");
        Reader tr(t, "update.tokens.");
        TokenOut out;
        DSI_RETURN_IF_ERROR(tr.get("id", &out.token, /*required=*/true));
        DSI_RETURN_IF_ERROR(tr.get("text", &out.text));
        DSI_RETURN_IF_ERROR(tr.get("logprob", &out.logprob));
        if (auto it = t.find("top"); it != t.end()) {
            DSI_RETURN_IF_ERROR(read_pairs(*it, "update.tokens.top", &out.top_logprobs));
        }
        u.tokens.push_back(std::move(out));
    }
    if (auto hit = j.find("handoff"); hit != j.end() && !hit->is_null()) {
        if (!hit->is_object()) return invalid_argument("update.handoff: must be an object");
        Reader hr(*hit, "update.handoff.");
        HandoffResult h;
        DSI_RETURN_IF_ERROR(hr.get("ok", &h.ok, /*required=*/true));
        DSI_RETURN_IF_ERROR(hr.get("blocks", &h.blocks));
        DSI_RETURN_IF_ERROR(hr.get("bytes", &h.bytes));
        DSI_RETURN_IF_ERROR(hr.get("us", &h.micros));
        DSI_RETURN_IF_ERROR(hr.get("error", &h.error));
        if (!u.finished) return invalid_argument("update.handoff: only on the final update");
        u.handoff = std::move(h);
    }
    if (auto eit = j.find("error"); eit != j.end()) {
        if (!eit->is_object()) return invalid_argument("update.error: must be an object");
        Reader er(*eit, "update.error.");
        std::string code, message;
        DSI_RETURN_IF_ERROR(er.get("code", &code, /*required=*/true));
        DSI_RETURN_IF_ERROR(er.get("message", &message));
        DSI_ASSIGN_OR_RETURN(StatusCode c, parse_code(code));
        if (c == StatusCode::kOk) return invalid_argument("update.error.code: must not be ok");
        u.error = Status(c, std::move(message));
    }
    return u;
}

}  // namespace dsi::server
