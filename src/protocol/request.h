// protocol::Request: one HTTP request body read once into everything the server needs
// (issue 14 part 2). The body is parsed once (depth-checked first, json_limits.h);
// each API's known top-level fields are a table here (request_fields.cc); the
// conversation comes from the API's adapter (adapters.h); structured output and a
// forcing tool_choice become one grammar request (structured_output.h); the rest --
// n, logprobs, ignore_eos, parallel_tool_calls and dsinfer's serving controls
// (cache_salt, traffic_class, timeout_ms) -- is read and type-checked here.
// Server limits (max_tokens over the server's limit, prompt length, model name) are
// the server's to apply: the request only says what the client asked for.
//
// Field names of the serving controls, accepted at the top level of all four APIs:
//   cache_salt    string, 1-256 bytes, no control characters (vLLM's name): requests
//                 with different salts never share prefix-cache blocks. The server may
//                 namespace it under the API key's salt (server/api.h).
//   traffic_class "chat" (default) | "agent": the KV store retention class (TTL) of the
//                 blocks the request writes (SPEC S-KV-3).
//   timeout_ms    integer 1..86,400,000: the generation ends (finish "length" /
//                 "max_tokens" / "incomplete") this long after the server read it.
//   speculative_usage  boolean: usage carries `speculative` {draft_tokens,
//                 accepted_tokens, verify_steps} of this request's speculative decoding
//                 (zeros when the server does not speculate; docs/server.md).
//
// Thread model: pure functions over plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "protocol/adapters.h"
#include "protocol/conversation.h"
#include "protocol/encoder.h"
#include "protocol/json_limits.h"
#include "protocol/structured_output.h"

namespace dsi::protocol {

// SPEC S-KV-3 retention classes as a client names them.
enum class TrafficClass { kChat, kAgent };

struct RequestOptions {
    int max_json_depth = kDefaultMaxJsonDepth;
    // The served chat encoding: the grammar of a forcing tool_choice is DSML of this
    // dialect (none with the V3 template).
    ChatEncoding encoding = ChatEncoding::kDeepSeekV32;
};

struct Request {
    ApiProtocol api = ApiProtocol::kChatCompletions;
    // Chat APIs: the whole conversation. Legacy completions: model, sampling, stream
    // and include_usage only (no messages).
    Conversation conversation;
    std::optional<std::string> prompt;  // legacy completions: the raw prompt text
    int32_t logprobs = -1;              // -1 off; else top alternatives per token
    bool ignore_eos = false;            // vLLM / llama.cpp extension (not on Messages)
    bool parallel_tool_calls = true;
    // response_format / text.format / guided_regex / guided_grammar, or the DSML
    // grammar of tool_choice "required" / a named tool (at most one of them).
    std::optional<StructuredRequest> grammar;
    std::string cache_salt;  // "" = none
    TrafficClass traffic_class = TrafficClass::kChat;
    std::optional<int64_t> timeout_ms;
    bool speculative_usage = false;
};

// INVALID_ARGUMENT (HTTP 400) naming the field; each API's unknown top-level field in
// its own words: OpenAI "Unrecognized request argument supplied: X", Anthropic
// "X: Extra inputs are not permitted" (unknown_field_message()).
Result<Request> parse_api_request(ApiProtocol api, std::string_view body,
                                  const RequestOptions& options = {});

// Each top-level member of `body` against `api`'s field table (request_fields.cc: the
// fields the API documents, including ones accepted and ignored, plus dsinfer's
// extensions, each with its JSON type; null is always accepted): an unknown field in
// the API's words, or "<field>: expected <type>" -- so a field that is known but not
// applied is still type-checked.
Status check_request_fields(ApiProtocol api, const OrderedJson& body);
// True for the OpenAI unknown-field message (its error has `param: null`).
bool is_unrecognized_field_error(const Status& status);

}  // namespace dsi::protocol
