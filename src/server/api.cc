#include "server/api.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "server/structured_output.h"

namespace dsi::server {
namespace {

using J = nlohmann::json;

protocol::ApiProtocol api_of(Endpoint e) {
    switch (e) {
        case Endpoint::kResponses:
            return protocol::ApiProtocol::kResponses;
        case Endpoint::kMessages:
            return protocol::ApiProtocol::kMessages;
        default:
            return protocol::ApiProtocol::kChatCompletions;
    }
}

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

// A JSON member of an expected kind, or INVALID_ARGUMENT naming it.
Result<const J*> member_of(const J& j, const char* key, J::value_t kind, const char* kind_name) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return static_cast<const J*>(nullptr);
    const bool ok = it->type() == kind ||
                    (kind == J::value_t::number_integer && it->is_number_unsigned()) ||
                    (kind == J::value_t::number_float && it->is_number());
    if (!ok) return invalid_argument(std::string(key) + ": expected " + kind_name);
    return &*it;
}

std::string token_string(const Tokenizer& tk, int32_t id) {
    return utf8_lossy(tk.decode(std::span<const int32_t>(&id, 1)));
}

J token_bytes(const Tokenizer& tk, int32_t id) {
    const std::string b = tk.decode(std::span<const int32_t>(&id, 1));
    J out = J::array();
    for (unsigned char c : b) out.push_back(static_cast<int>(c));
    return out;
}

// Fills the engine's sampling from the protocol's, with the server's limits.
Status fill_sampling(const ApiContext& ctx, const protocol::SamplingParams& p,
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
        if (*p.max_tokens < 1) return invalid_argument("max_tokens: must be >= 1");
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

// Top-level request fields each API defines (OpenAI / Anthropic API references, 2025),
// plus the extensions dsinfer reads (DeepSeek `thinking`, vLLM / llama.cpp `ignore_eos`). OpenAI answers any other field with 400
// "Unrecognized request argument supplied: X"; Anthropic with 400 "X: Extra inputs are
// not permitted". Fields the official SDKs send are all listed.
constexpr std::string_view kUnrecognizedField = "Unrecognized request argument supplied: ";
constexpr std::string_view kCommonOpenAiFields[] = {
    "model", "stream", "stream_options", "temperature", "top_p", "seed", "user", "metadata",
    "store", "service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
    "ignore_eos", "thinking", "guided_regex", "guided_grammar"};
constexpr std::string_view kChatFields[] = {
    "messages", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
    "logprobs", "max_completion_tokens", "max_tokens", "modalities", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "reasoning_effort",
    "response_format", "stop", "tool_choice", "tools", "top_logprobs", "verbosity",
    "web_search_options"};
constexpr std::string_view kCompletionsFields[] = {
    "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens",
    "n", "presence_penalty", "stop", "suffix"};
constexpr std::string_view kResponsesFields[] = {
    "input", "background", "conversation", "include", "instructions", "max_output_tokens",
    "max_tool_calls", "parallel_tool_calls", "previous_response_id", "prompt", "reasoning",
    "text", "tool_choice", "tools", "top_logprobs", "truncation"};
constexpr std::string_view kMessagesFields[] = {
    "model", "messages", "max_tokens", "container", "context_management", "mcp_servers",
    "metadata", "output_config", "service_tier", "stop_sequences", "stream", "system",
    "temperature", "thinking", "tool_choice", "tools", "top_k", "top_p"};

bool known_field(Endpoint e, std::string_view key) {
    auto in = [&](auto& list) { return std::find(std::begin(list), std::end(list), key) != std::end(list); };
    switch (e) {
        case Endpoint::kMessages:
            return in(kMessagesFields);
        case Endpoint::kChatCompletions:
            return in(kCommonOpenAiFields) || in(kChatFields);
        case Endpoint::kCompletions:
            return in(kCommonOpenAiFields) || in(kCompletionsFields);
        case Endpoint::kResponses:
            return in(kCommonOpenAiFields) || in(kResponsesFields);
    }
    return false;
}

// Responses: logprobs are on when `include` has "message.output_text.logprobs";
// `top_logprobs` (0-20) alternatives per token.
Status responses_logprobs(const J& j, int32_t* logprobs) {
    bool on = false;
    if (auto it = j.find("include"); it != j.end() && !it->is_null()) {
        if (!it->is_array()) return invalid_argument("include: expected an array");
        for (const J& v : *it) {
            if (!v.is_string()) return invalid_argument("include: expected strings");
            on = on || v.get<std::string>() == "message.output_text.logprobs";
        }
    }
    auto top = member_of(j, "top_logprobs", J::value_t::number_integer, "an integer");
    if (!top.is_ok()) return top.status();
    const int64_t k = *top != nullptr ? (*top)->get<int64_t>() : 0;
    if (k < 0 || k > 20) return invalid_argument("top_logprobs: must be in [0, 20]");
    if (on) *logprobs = static_cast<int32_t>(k);
    return Status::ok();
}

// vLLM / llama.cpp extension `ignore_eos` (load generators ask for exact output lengths).
Status apply_ignore_eos(const J& j, SamplingParams* sp) {
    auto v = member_of(j, "ignore_eos", J::value_t::boolean, "a boolean");
    if (!v.is_ok()) return v.status();
    if (*v != nullptr) sp->ignore_eos = (*v)->get<bool>();
    return Status::ok();
}

Status check_known_fields(Endpoint e, const J& j) {
    for (const auto& [key, value] : j.items()) {
        if (known_field(e, key)) continue;
        if (e == Endpoint::kMessages) {
            return invalid_argument(key + ": Extra inputs are not permitted");
        }
        return invalid_argument(std::string(kUnrecognizedField) + key);
    }
    return Status::ok();
}

// Responses object: every output_text part of every message item gets `logprobs`.
void set_output_text_logprobs(J& response, const J& logprobs) {
    if (!response.contains("output") || !response["output"].is_array()) return;
    for (J& item : response["output"]) {
        if (item.value("type", "") != "message" || !item.contains("content")) continue;
        for (J& part : item["content"]) {
            if (part.value("type", "") == "output_text") part["logprobs"] = logprobs;
        }
    }
}

// Legacy completions usage (with the request's prefix-cache hit).
J completions_usage(const protocol::ResponseMeta& m, int64_t completion_tokens) {
    return J{{"prompt_tokens", m.prompt_tokens},
             {"completion_tokens", completion_tokens},
             {"total_tokens", m.prompt_tokens + completion_tokens},
             {"prompt_tokens_details", {{"cached_tokens", m.cached_tokens}}}};
}

Status check_model(const ApiContext& ctx, const std::string& model) {
    if (model != ctx.model_id) {
        return not_found("model: '" + model + "' does not exist (this server serves '" +
                         ctx.model_id + "')");
    }
    return Status::ok();
}

// The request's grammar (structured_output.h), or nullopt. Reads only; compile later.
Result<std::optional<StructuredRequest>> structured_request(Endpoint e, const J& j,
                                                            std::string_view body) {
    if (e == Endpoint::kMessages) return std::optional<StructuredRequest>();
    const StructuredApi api = e == Endpoint::kChatCompletions ? StructuredApi::kChatCompletions
                              : e == Endpoint::kResponses     ? StructuredApi::kResponses
                                                              : StructuredApi::kCompletions;
    return read_structured_request(api, j, body);
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

// Legacy /v1/completions: {"model", "prompt": string, "max_tokens", "temperature",
// "top_p", "seed", "stop", "stream", "stream_options", "logprobs": int, "n": 1}.
Result<Prepared> prepare_completions(const ApiContext& ctx, const J& j, std::string_view body,
                                     uint64_t seed) {
    Prepared p;
    p.endpoint = Endpoint::kCompletions;
    protocol::SamplingParams sp;
    auto model = member_of(j, "model", J::value_t::string, "a string");
    if (!model.is_ok()) return model.status();
    if (*model == nullptr) return invalid_argument("model: required");
    p.model = (*model)->get<std::string>();
    auto prompt = member_of(j, "prompt", J::value_t::string, "a string");
    if (!prompt.is_ok()) return prompt.status();
    if (*prompt == nullptr) return invalid_argument("prompt: required");
    auto stream = member_of(j, "stream", J::value_t::boolean, "a boolean");
    if (!stream.is_ok()) return stream.status();
    p.stream = *stream != nullptr && (*stream)->get<bool>();
    if (auto it = j.find("stream_options"); it != j.end() && it->is_object()) {
        auto iu = member_of(*it, "include_usage", J::value_t::boolean, "a boolean");
        if (!iu.is_ok()) return iu.status().with_context("stream_options");
        p.include_usage = *iu != nullptr && (*iu)->get<bool>();
    }
    for (const char* key : {"temperature", "top_p", "presence_penalty", "frequency_penalty"}) {
        auto v = member_of(j, key, J::value_t::number_float, "a number");
        if (!v.is_ok()) return v.status();
        if (*v == nullptr) continue;
        const double d = (*v)->get<double>();
        if (std::string_view(key) == "temperature") sp.temperature = d;
        if (std::string_view(key) == "top_p") sp.top_p = d;
        if (std::string_view(key) == "presence_penalty") sp.presence_penalty = d;
        if (std::string_view(key) == "frequency_penalty") sp.frequency_penalty = d;
    }
    auto mt = member_of(j, "max_tokens", J::value_t::number_integer, "an integer");
    if (!mt.is_ok()) return mt.status();
    sp.max_tokens = *mt != nullptr ? (*mt)->get<int64_t>() : 16;  // OpenAI's default
    auto sd = member_of(j, "seed", J::value_t::number_integer, "an integer");
    if (!sd.is_ok()) return sd.status();
    if (*sd != nullptr) sp.seed = (*sd)->get<uint64_t>();
    auto n = member_of(j, "n", J::value_t::number_integer, "an integer");
    if (!n.is_ok()) return n.status();
    if (*n != nullptr && (*n)->get<int64_t>() != 1)
        return invalid_argument("n: only 1 is supported");
    auto lp = member_of(j, "logprobs", J::value_t::number_integer, "an integer");
    if (!lp.is_ok()) return lp.status();
    if (*lp != nullptr) {
        const int64_t k = (*lp)->get<int64_t>();
        if (k < 0 || k > 5) return invalid_argument("logprobs: must be in [0, 5]");
        p.logprobs = static_cast<int32_t>(k);
    }
    if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
        if (it->is_string()) {
            sp.stop.push_back(it->get<std::string>());
        } else if (it->is_array() && it->size() <= 4) {
            for (const J& s : *it) {
                if (!s.is_string()) return invalid_argument("stop: expected strings");
                sp.stop.push_back(s.get<std::string>());
            }
        } else {
            return invalid_argument("stop: expected a string or up to 4 strings");
        }
    }
    DSI_RETURN_IF_ERROR(check_model(ctx, p.model));
    const std::string& text = (*prompt)->get_ref<const std::string&>();
    if (ctx.tokenizer->add_bos_token()) p.request.prompt.push_back(ctx.tokenizer->bos_id());
    ctx.tokenizer->encode_into(text, &p.request.prompt);
    if (p.request.prompt.empty()) return invalid_argument("prompt: must not be empty");
    DSI_RETURN_IF_ERROR(fill_sampling(ctx, sp, static_cast<int64_t>(p.request.prompt.size()), seed,
                                      &p.request.sampling));
    p.request.sampling.logprobs = p.logprobs;
    DSI_RETURN_IF_ERROR(apply_ignore_eos(j, &p.request.sampling));
    p.stop = sp.stop;
    DSI_ASSIGN_OR_RETURN(auto so, structured_request(Endpoint::kCompletions, j, body));
    DSI_RETURN_IF_ERROR(attach_grammar(ctx, so, &p.request));
    return p;
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
    HttpReply r;
    r.status = status;
    if (e == Endpoint::kMessages) {
        r.body = J{{"type", "error"},
                   {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}}
                     .dump();
    } else {
        r.body = J{{"error",
                    {{"message", message},
                     {"type", openai_error_type(status)},
                     {"param", nullptr},
                     {"code", nullptr}}}}
                     .dump();
    }
    return r;
}

HttpReply error_reply(Endpoint e, const Status& status) {
    const int code = http_status(status.code());
    const bool unrecognized = status.message().rfind(kUnrecognizedField, 0) == 0;
    if (code == 400 && e != Endpoint::kCompletions && !unrecognized) {
        HttpReply r;
        r.status = 400;
        r.body = protocol::json_error_body(api_of(e), status);
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

Result<Prepared> prepare_request(const ApiContext& ctx, Endpoint e, std::string_view body,
                                 uint64_t seed) {
    J j = J::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument("body: not valid JSON");
    if (!j.is_object()) return invalid_argument("body: expected a JSON object");
    DSI_RETURN_IF_ERROR(check_known_fields(e, j));
    if (e == Endpoint::kCompletions) return prepare_completions(ctx, j, body, seed);

    Result<protocol::Conversation> conv = protocol::parse_request(api_of(e), body);
    if (!conv.is_ok()) return conv.status();
    DSI_ASSIGN_OR_RETURN(auto so, structured_request(e, j, body));
    auto parallel = member_of(j, "parallel_tool_calls", J::value_t::boolean, "a boolean");
    if (!parallel.is_ok()) return parallel.status();
    DSI_ASSIGN_OR_RETURN(auto forced_tool,
                         read_tool_choice(*conv, ctx.encoding,
                                          *parallel == nullptr || (*parallel)->get<bool>()));
    if (forced_tool) {
        if (so) return invalid_argument("tool_choice: cannot be combined with " + so->field);
        so = std::move(forced_tool);
    }
    // With a grammar the output is the final answer only: thinking off (the prompt
    // closes the think block), so the mask covers every output token.
    if (so) conv->thinking = false;
    Prepared p;
    p.endpoint = e;
    p.stream = conv->stream;
    p.include_usage = conv->include_usage;
    p.model = conv->model;
    DSI_RETURN_IF_ERROR(check_model(ctx, p.model));
    if (e == Endpoint::kChatCompletions) {
        auto lp = member_of(j, "logprobs", J::value_t::boolean, "a boolean");
        if (!lp.is_ok()) return lp.status();
        auto top = member_of(j, "top_logprobs", J::value_t::number_integer, "an integer");
        if (!top.is_ok()) return top.status();
        if (*lp != nullptr && (*lp)->get<bool>()) {
            const int64_t k = *top != nullptr ? (*top)->get<int64_t>() : 0;
            if (k < 0 || k > 20) return invalid_argument("top_logprobs: must be in [0, 20]");
            p.logprobs = static_cast<int32_t>(k);
        } else if (*top != nullptr) {
            return invalid_argument("top_logprobs: requires logprobs: true");
        }
        auto n = member_of(j, "n", J::value_t::number_integer, "an integer");
        if (!n.is_ok()) return n.status();
        if (*n != nullptr && (*n)->get<int64_t>() != 1) {
            return invalid_argument("n: only 1 is supported");
        }
    }
    if (e == Endpoint::kResponses) DSI_RETURN_IF_ERROR(responses_logprobs(j, &p.logprobs));
    Result<protocol::Prompt> prompt =
        protocol::encode_conversation(ctx.encoding, *conv, ctx.special);
    if (!prompt.is_ok()) return prompt.status();
    const std::vector<Segment> segments = prompt->segments();
    p.request.prompt = ctx.tokenizer->encode_segments(segments, ctx.encode_threads);
    if (p.request.prompt.empty()) return invalid_argument("messages: empty prompt");
    p.thinking_prompt = !prompt->pieces().empty() && ctx.special.think_begin >= 0 &&
                        prompt->pieces().back().id == ctx.special.think_begin;
    DSI_RETURN_IF_ERROR(fill_sampling(ctx, conv->sampling,
                                      static_cast<int64_t>(p.request.prompt.size()), seed,
                                      &p.request.sampling));
    p.request.sampling.logprobs = p.logprobs;
    if (e != Endpoint::kMessages) DSI_RETURN_IF_ERROR(apply_ignore_eos(j, &p.request.sampling));
    p.stop = conv->sampling.stop;
    DSI_RETURN_IF_ERROR(attach_grammar(ctx, so, &p.request));
    return p;
}

Renderer::Renderer(const ApiContext& ctx, const Prepared& prepared, std::string id,
                   int64_t created_s)
    : ctx_(ctx), prepared_(prepared), id_(std::move(id)), created_s_(created_s) {
    prepared_.request.prompt.clear();  // not needed here; keep the renderer small
    prepared_.request.prompt.shrink_to_fit();
    meta_.id = id_;
    meta_.model = prepared.model;
    meta_.created_s = created_s;
    meta_.prompt_tokens = static_cast<int64_t>(prepared.request.prompt.size());
    meta_.include_usage = prepared.include_usage;
    if (prepared.endpoint != Endpoint::kCompletions) {
        protocol::ParserOptions po;
        po.thinking = prepared.thinking_prompt;
        po.tool_call_id_prefix = "call_" + id_ + "_";
        parser_ = std::make_unique<protocol::OutputParser>(*ctx.tokenizer, ctx.special, po);
        if (prepared.stream) {
            writer_ = std::make_unique<protocol::StreamWriter>(api_of(prepared.endpoint), meta_);
        }
        if (!prepared.stop.empty()) stop_ = std::make_unique<StopMatcher>(prepared.stop);
        logprobs_ = J::array();
    } else {
        logprobs_ = J{{"tokens", J::array()},
                      {"token_logprobs", J::array()},
                      {"top_logprobs", J::array()},
                      {"text_offset", J::array()}};
    }
}

Renderer::~Renderer() = default;

std::vector<protocol::Event> Renderer::consume(const Update& u) {
    std::vector<protocol::Event> raw;
    meta_.cached_tokens = std::max(meta_.cached_tokens, u.cached_prompt_tokens);
    for (const TokenOut& t : u.tokens) {
        ++num_tokens_;
        if (prepared_.thinking_prompt && !saw_think_end_) {
            if (t.token == ctx_.special.think_end) {
                saw_think_end_ = true;
            } else {
                ++num_reasoning_tokens_;
            }
        }
        // Responses: logprobs belong to the output_text part (no reasoning tokens).
        const bool in_reasoning = prepared_.thinking_prompt &&
                                  (!saw_think_end_ || t.token == ctx_.special.think_end);
        if (prepared_.logprobs >= 0 &&
            !(prepared_.endpoint == Endpoint::kResponses && in_reasoning)) {
            const Tokenizer& tk = *ctx_.tokenizer;
            if (prepared_.endpoint == Endpoint::kCompletions) {
                logprobs_["text_offset"].push_back(text_.size());
                logprobs_["tokens"].push_back(token_string(tk, t.token));
                logprobs_["token_logprobs"].push_back(t.logprob);
                J top = J::object();
                for (const auto& [id, lp] : t.top_logprobs) top[token_string(tk, id)] = lp;
                logprobs_["top_logprobs"].push_back(top);
            } else {
                J top = J::array();
                for (const auto& [id, lp] : t.top_logprobs) {
                    top.push_back(J{{"token", token_string(tk, id)},
                                    {"logprob", lp},
                                    {"bytes", token_bytes(tk, id)}});
                }
                logprobs_.push_back(J{{"token", token_string(tk, t.token)},
                                      {"logprob", t.logprob},
                                      {"bytes", token_bytes(tk, t.token)},
                                      {"top_logprobs", top}});
            }
        }
        if (parser_) {
            if (!parser_->done()) parser_->push(std::span<const int32_t>(&t.token, 1), &raw);
        } else if (t.token != ctx_.tokenizer->eos_id()) {  // EOS ends the text, not part of it
            text_ += t.text;
        }
    }
    if (u.finished) {
        finished_ = true;
        reason_ = u.reason;
        if (parser_ && !parser_->done()) {
            const bool length = u.reason == engine::FinishReason::kLength ||
                                u.reason == engine::FinishReason::kDeadline ||
                                u.reason == engine::FinishReason::kAbort;
            parser_->finish(
                length ? protocol::FinishReason::kLength : protocol::FinishReason::kStop, &raw);
        }
    }
    if (!stop_) return raw;
    // Stop strings end the engine's sequence; cut the content text at the match too
    // (the parser reads ids, so it still sees the whole last token).
    std::vector<protocol::Event> out;
    for (protocol::Event& e : raw) {
        if (e.kind == protocol::EventKind::kContentDelta) {
            if (stop_->stopped()) continue;
            StopMatcher::Piece piece = stop_->push(e.text);
            if (piece.text.empty()) continue;
            e.text = std::move(piece.text);
        } else if (e.kind == protocol::EventKind::kFinish && !stop_->stopped()) {
            std::string held = stop_->flush();
            if (!held.empty()) {
                protocol::Event c;
                c.kind = protocol::EventKind::kContentDelta;
                c.text = std::move(held);
                out.push_back(std::move(c));
            }
        }
        out.push_back(std::move(e));
    }
    return out;
}

std::string Renderer::completion_chunk(std::string_view text, const char* finish) {
    J choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (finish != nullptr) choice["finish_reason"] = finish;
    if (prepared_.logprobs >= 0) {
        J lp = J{{"tokens", J::array()},
                 {"token_logprobs", J::array()},
                 {"top_logprobs", J::array()},
                 {"text_offset", J::array()}};
        const size_t n = logprobs_["tokens"].size();
        for (size_t i = logprobs_sent_; i < n; ++i) {
            for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
                lp[k].push_back(logprobs_[k][i]);
            }
        }
        logprobs_sent_ = n;
        choice["logprobs"] = lp;
    }
    J c = {{"id", id_},
           {"object", "text_completion"},
           {"created", created_s_},
           {"model", meta_.model},
           {"choices", J::array({choice})}};
    return "data: " + c.dump() + "\n\n";
}

std::string Renderer::chat_logprobs_chunk(std::string data) {
    if (prepared_.logprobs < 0 || logprobs_sent_ >= logprobs_.size()) return data;
    J c = J::parse(data, nullptr, false);
    if (c.is_discarded() || !c.contains("choices") || c["choices"].empty()) return data;
    J& choice = c["choices"][0];
    const J& delta = choice["delta"];
    const bool carries = delta.contains("content") || delta.contains("reasoning_content") ||
                         !choice["finish_reason"].is_null();
    if (!carries) return data;
    J content = J::array();
    for (size_t i = logprobs_sent_; i < logprobs_.size(); ++i) content.push_back(logprobs_[i]);
    logprobs_sent_ = logprobs_.size();
    choice["logprobs"] = J{{"content", content}};
    return c.dump();
}

std::string Renderer::responses_logprobs_event(const std::string& event, std::string data) {
    const bool delta = event == "response.output_text.delta";
    if (!delta && event != "response.output_text.done" && event != "response.completed") {
        return data;
    }
    J j = J::parse(data, nullptr, false);
    if (j.is_discarded()) return data;
    if (delta) {
        J part = J::array();
        for (size_t i = logprobs_sent_; i < logprobs_.size(); ++i) part.push_back(logprobs_[i]);
        logprobs_sent_ = logprobs_.size();
        j["logprobs"] = std::move(part);
    } else if (event == "response.output_text.done") {
        j["logprobs"] = logprobs_;
    } else if (j.contains("response")) {
        set_output_text_logprobs(j["response"], logprobs_);
    }
    return j.dump();
}

std::string Renderer::on_update_sse(const Update& u) {
    std::string out;
    const size_t before = text_.size();
    std::vector<protocol::Event> events = consume(u);
    if (prepared_.endpoint == Endpoint::kCompletions) {
        std::string_view piece = std::string_view(text_).substr(before);
        if (!piece.empty() || (prepared_.logprobs >= 0 && !u.tokens.empty())) {
            out += completion_chunk(piece, nullptr);
        }
        if (finished_) {
            out +=
                completion_chunk("", u.reason == engine::FinishReason::kLength ? "length" : "stop");
            if (prepared_.include_usage) {
                J c = {{"id", id_},
                       {"object", "text_completion"},
                       {"created", created_s_},
                       {"model", meta_.model},
                       {"choices", J::array()},
                       {"usage", completions_usage(meta_, num_tokens_)}};
                out += "data: " + c.dump() + "\n\n";
            }
            out += "data: [DONE]\n\n";
        }
        return out;
    }
    writer_->set_cached_tokens(meta_.cached_tokens);
    if (!started_) {
        started_ = true;
        for (const protocol::SseEvent& s : writer_->start()) out += s.to_wire();
    }
    for (const protocol::Event& e : events) {
        if (e.kind == protocol::EventKind::kFinish) {
            writer_->set_usage(num_tokens_, num_reasoning_tokens_);
        }
        for (protocol::SseEvent& s : writer_->on_event(e)) {
            if (prepared_.endpoint == Endpoint::kChatCompletions && s.data != "[DONE]") {
                s.data = chat_logprobs_chunk(std::move(s.data));
            }
            if (prepared_.endpoint == Endpoint::kResponses && prepared_.logprobs >= 0) {
                s.data = responses_logprobs_event(s.event, std::move(s.data));
            }
            out += s.to_wire();
        }
    }
    return out;
}

void Renderer::on_update(const Update& u) {
    std::vector<protocol::Event> events = consume(u);
    for (protocol::Event& e : events) events_.push_back(std::move(e));
}

HttpReply Renderer::reply() const {
    HttpReply r;
    if (prepared_.endpoint == Endpoint::kCompletions) {
        J choice = {
            {"index", 0},
            {"text", text_},
            {"logprobs", prepared_.logprobs >= 0 ? logprobs_ : J(nullptr)},
            {"finish_reason", reason_ == engine::FinishReason::kLength ? "length" : "stop"}};
        r.body = J{{"id", id_},
                   {"object", "text_completion"},
                   {"created", created_s_},
                   {"model", meta_.model},
                   {"choices", J::array({choice})},
                   {"usage", completions_usage(meta_, num_tokens_)}}
                     .dump();
        return r;
    }
    protocol::ResponseMeta meta = meta_;
    meta.completion_tokens = num_tokens_;
    meta.reasoning_tokens = num_reasoning_tokens_;
    protocol::Completion c = protocol::fold_events(events_);
    r.body = protocol::build_response(api_of(prepared_.endpoint), meta, c);
    if (prepared_.endpoint == Endpoint::kResponses && prepared_.logprobs >= 0) {
        J j = J::parse(r.body, nullptr, false);
        if (!j.is_discarded()) {
            set_output_text_logprobs(j, logprobs_);
            r.body = j.dump();
        }
    }
    if (prepared_.endpoint == Endpoint::kChatCompletions && prepared_.logprobs >= 0) {
        J j = J::parse(r.body, nullptr, false);
        if (!j.is_discarded()) {
            j["choices"][0]["logprobs"] = J{{"content", logprobs_}};
            r.body = j.dump();
        }
    }
    return r;
}

}  // namespace dsi::server
