#include "server/api.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "server/structured_output.h"

namespace dsi::server {
namespace {

using J = nlohmann::json;

std::string anthropic_error_type(int status) {
    switch (status) {
        case 400:
            return "invalid_request_error";
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 413:
            return "request_too_large";
        case 429:
            return "rate_limit_error";
        case 503:
        case 529:
            return "overloaded_error";
        default:
            return status < 500 ? "invalid_request_error" : "api_error";
    }
}

std::string openai_error_type(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 404:
            return "not_found_error";
        case 429:
            return "rate_limit_error";
        default:
            return status < 500 ? "invalid_request_error" : "server_error";
    }
}

// Fills the engine's sampling from the protocol's, with the server's limits.
Status fill_sampling(const ApiContext& ctx, const protocol::SamplingRequest& p,
                     int64_t prompt_tokens, uint64_t seed, SamplingParams* out) {
    out->temperature = p.temperature.value_or(1.0);
    if (p.top_p) out->top_p = *p.top_p;
    if (p.top_k) out->top_k = *p.top_k;
    if (p.presence_penalty) out->presence_penalty = *p.presence_penalty;
    if (p.frequency_penalty) out->frequency_penalty = *p.frequency_penalty;
    out->seed = p.seed.value_or(seed);
    out->stop = p.stop;
    if (prompt_tokens > ctx.limits.max_prompt_tokens) {
        return invalid_argument("prompt: " + std::to_string(prompt_tokens) +
                                " tokens, over the server's limit of " +
                                std::to_string(ctx.limits.max_prompt_tokens));
    }
    const int64_t room = ctx.max_model_len > 0 ? ctx.max_model_len - prompt_tokens : INT64_MAX;
    if (room < 1) {
        return invalid_argument("prompt: " + std::to_string(prompt_tokens) +
                                " tokens leave no room in the model's context of " +
                                std::to_string(ctx.max_model_len));
    }
    if (p.max_tokens) {
        if (*p.max_tokens > ctx.limits.max_tokens) {
            return invalid_argument("max_tokens: " + std::to_string(*p.max_tokens) +
                                    " is over the server's limit of " +
                                    std::to_string(ctx.limits.max_tokens));
        }
        if (*p.max_tokens > room) {
            return invalid_argument("max_tokens: prompt (" + std::to_string(prompt_tokens) +
                                    ") + max_tokens (" + std::to_string(*p.max_tokens) +
                                    ") is over the model's context of " +
                                    std::to_string(ctx.max_model_len));
        }
        out->max_tokens = *p.max_tokens;
    } else {
        out->max_tokens = std::min(ctx.limits.default_max_tokens, room);
    }
    Status s = validate_sampling(*out, ctx.tokenizer->vocab_size());
    if (!s.is_ok()) return invalid_argument(s.message());
    return Status::ok();
}

Status check_model(const ApiContext& ctx, const std::string& model) {
    if (model != ctx.model_id) {
        return not_found("model: '" + model + "' does not exist (this server serves '" +
                         ctx.model_id + "')");
    }
    return Status::ok();
}

// Compiles the request's grammar (waits here, before the engine) into its mask.
Status attach_grammar(const ApiContext& ctx, const std::optional<StructuredRequest>& so,
                      engine::GenerateRequest* request) {
    if (!so) return Status::ok();
    if (ctx.structured_output == nullptr) {
        return unimplemented(so->field + ": structured output is not enabled on this server");
    }
    DSI_ASSIGN_OR_RETURN(request->mask, ctx.structured_output->provider(*so));
    return Status::ok();
}

// The engine's deadline for `timeout_ms`, on the clock the engine reads.
int64_t deadline_ns(const ApiContext& ctx, std::optional<int64_t> timeout_ms) {
    if (!timeout_ms) return 0;
    Env* env = ctx.env != nullptr ? ctx.env : Env::default_env();
    return env->now_ns() + *timeout_ms * 1000000;
}

}  // namespace

std::optional<Endpoint> endpoint_for_path(std::string_view path) {
    if (path == "/v1/chat/completions") return Endpoint::kChatCompletions;
    if (path == "/v1/completions") return Endpoint::kCompletions;
    if (path == "/v1/responses") return Endpoint::kResponses;
    if (path == "/v1/messages") return Endpoint::kMessages;
    return std::nullopt;
}

std::string_view endpoint_name(Endpoint e) {
    switch (e) {
        case Endpoint::kChatCompletions:
            return "chat_completions";
        case Endpoint::kCompletions:
            return "completions";
        case Endpoint::kResponses:
            return "responses";
        case Endpoint::kMessages:
            return "messages";
    }
    return "unknown";
}

HttpReply error_reply(Endpoint e, int status, std::string_view message) {
    // The message may quote the client's bytes: invalid UTF-8 becomes U+FFFD rather
    // than a throw from dump() (fuzz_http, issue 22).
    HttpReply r;
    r.status = status;
    if (e == Endpoint::kMessages) {
        r.body = J{{"type", "error"},
                   {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}}
                     .dump(-1, ' ', false, J::error_handler_t::replace);
    } else {
        r.body = J{{"error",
                    {{"message", message},
                     {"type", openai_error_type(status)},
                     {"param", nullptr},
                     {"code", nullptr}}}}
                     .dump(-1, ' ', false, J::error_handler_t::replace);
    }
    return r;
}

HttpReply error_reply(Endpoint e, const Status& status) {
    const int code = http_status(status.code());
    if (code == 400 && e != Endpoint::kCompletions &&
        !protocol::is_unrecognized_field_error(status)) {
        HttpReply r;
        r.status = 400;
        r.body = protocol::json_error_body(e, status);
        return r;
    }
    return error_reply(e, code, status.message());
}

HttpReply models_reply(const ApiContext& ctx, int64_t created_s) {
    HttpReply r;
    r.body = J{{"object", "list"},
               {"data", J::array({J{{"id", ctx.model_id},
                                    {"object", "model"},
                                    {"created", created_s},
                                    {"owned_by", "dsinfer"}}})}}
                 .dump();
    return r;
}

Result<ApiKey> parse_api_key(std::string_view spec) {
    const size_t colon = spec.find(':');
    ApiKey k;
    k.key = std::string(spec.substr(0, colon));
    if (colon != std::string_view::npos) {
        k.cache_salt = std::string(spec.substr(colon + 1));
        if (k.cache_salt.empty()) return invalid_argument("api key: empty salt after ':'");
    }
    auto visible = [](std::string_view v) {
        return std::all_of(v.begin(), v.end(), [](char ch) { return ch > 0x20 && ch < 0x7f; });
    };
    if (k.key.empty() || !visible(k.key) || !visible(k.cache_salt)) {
        return invalid_argument("api key: expected KEY or KEY:SALT of visible ASCII characters");
    }
    return k;
}

std::string effective_cache_salt(std::string_view key_salt, std::string_view request_salt) {
    if (key_salt.empty()) return std::string(request_salt);
    // A request's salt has no control characters (protocol/request.h), so no request
    // can spell this namespace, and the key's salt (no NUL: it came from argv or a
    // file line) ends where the NUL does.
    std::string salt = "\x01key\x00";
    salt.append(key_salt);
    salt.push_back('\0');
    salt.append(request_salt);
    return salt;
}

Result<Prepared> prepare_request(const ApiContext& ctx, Endpoint e, std::string_view body,
                                 uint64_t seed, std::string_view key_salt) {
    protocol::RequestOptions options;
    options.max_json_depth = ctx.limits.max_json_depth;
    options.encoding = ctx.encoding;
    DSI_ASSIGN_OR_RETURN(protocol::Request req, protocol::parse_api_request(e, body, options));
    protocol::Conversation& conv = req.conversation;
    Prepared p;
    p.endpoint = e;
    p.stream = conv.stream;
    p.include_usage = conv.include_usage;
    p.model = conv.model;
    p.logprobs = req.logprobs;
    p.speculative_usage = req.speculative_usage;
    DSI_RETURN_IF_ERROR(check_model(ctx, p.model));
    if (e == Endpoint::kCompletions) {
        if (ctx.tokenizer->add_bos_token()) p.request.prompt.push_back(ctx.tokenizer->bos_id());
        ctx.tokenizer->encode_into(*req.prompt, &p.request.prompt);
        if (p.request.prompt.empty()) return invalid_argument("prompt: must not be empty");
    } else {
        Result<protocol::Prompt> prompt =
            protocol::encode_conversation(ctx.encoding, conv, ctx.special);
        if (!prompt.is_ok()) return prompt.status();
        const std::vector<Segment> segments = prompt->segments();
        p.request.prompt = ctx.tokenizer->encode_segments(segments, ctx.encode_threads);
        if (p.request.prompt.empty()) return invalid_argument("messages: empty prompt");
        p.thinking_prompt = !prompt->pieces().empty() && ctx.special.think_begin >= 0 &&
                            prompt->pieces().back().id == ctx.special.think_begin;
    }
    DSI_RETURN_IF_ERROR(fill_sampling(ctx, conv.sampling,
                                      static_cast<int64_t>(p.request.prompt.size()), seed,
                                      &p.request.sampling));
    p.request.sampling.logprobs = p.logprobs;
    p.request.sampling.ignore_eos = req.ignore_eos;
    p.stop = conv.sampling.stop;
    p.request.cache_salt = effective_cache_salt(key_salt, req.cache_salt);
    p.request.agent_traffic = req.traffic_class == protocol::TrafficClass::kAgent;
    p.request.deadline_ns = deadline_ns(ctx, req.timeout_ms);
    DSI_RETURN_IF_ERROR(attach_grammar(ctx, req.grammar, &p.request));
    p.structured = std::move(req.grammar);
    return p;
}

namespace {

protocol::RenderOptions render_options(const Prepared& p, std::string id, int64_t created_s) {
    protocol::RenderOptions o;
    o.api = p.endpoint;
    o.stream = p.stream;
    o.include_usage = p.include_usage;
    o.thinking_prompt = p.thinking_prompt;
    o.logprobs = p.logprobs;
    o.id = std::move(id);
    o.model = p.model;
    o.created_s = created_s;
    o.prompt_tokens = static_cast<int64_t>(p.request.prompt.size());
    o.stop = p.stop;
    o.speculative_usage = p.speculative_usage;
    o.ignore_eos = p.request.sampling.ignore_eos;
    return o;
}

}  // namespace

Renderer::Renderer(const ApiContext& ctx, const Prepared& prepared, std::string id,
                   int64_t created_s)
    : impl_(*ctx.tokenizer, ctx.special, render_options(prepared, std::move(id), created_s)) {}

HttpReply Renderer::reply() const {
    HttpReply r;
    r.body = impl_.reply_body();
    return r;
}

}  // namespace dsi::server
