// Api: everything the HTTP server does with a request body that needs no socket,
// so it is tested without one. Routes a path to an endpoint; turns a body into an
// engine::GenerateRequest (protocol::parse_api_request reads the body once -> chat
// encoder -> token ids; here: the server's limits, model name, the API key's cache
// salt, the deadline on the engine's clock, the grammar compile wait); renders engine
// Updates into the caller's protocol (SSE bytes while streaming, one JSON body
// otherwise); shapes every error as the caller's protocol error object with the HTTP
// status from http_status().
//
//   POST /v1/chat/completions  OpenAI Chat Completions   (protocol/ adapters)
//   POST /v1/responses         OpenAI Responses          (protocol/ adapters)
//   POST /v1/messages          Anthropic Messages        (protocol/ adapters)
//   POST /v1/completions       OpenAI legacy completions (here: prompt text in,
//                              engine text out; no chat template)
//
// Thread model: ApiContext is immutable after construction and shared by all
// threads; a Renderer belongs to one request and is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "engine/engine.h"
#include "protocol/adapters.h"
#include "protocol/encoder.h"
#include "protocol/output_parser.h"
#include "protocol/renderer.h"
#include "protocol/request.h"
#include "server/generation_service.h"
#include "tokenizer/tokenizer.h"

namespace dsi::server {

class StructuredOutput;  // structured_output.h

using Endpoint = protocol::ApiProtocol;
std::optional<Endpoint> endpoint_for_path(std::string_view path);
std::string_view endpoint_name(Endpoint e);  // "chat_completions" | ... (metrics labels)

struct ServerLimits {
    int64_t max_body_bytes = int64_t{4} << 20;  // 413 above
    int64_t max_prompt_tokens = 16384;          // 400 above
    int64_t max_tokens = 4096;                  // 400 for a larger max_tokens
    int64_t default_max_tokens = 256;           // when the request gives none
    int64_t max_concurrent = 512;               // generations in flight; 429 above
    int64_t retry_after_s = 1;                  // Retry-After of a 429
    int64_t header_timeout_ms = 10000;          // request line + headers (slow loris)
    int64_t idle_timeout_ms = 60000;            // keep-alive connection without a request
    int64_t body_timeout_ms = 30000;            // reading the body
    int64_t write_timeout_ms = 30000;           // one write of a reply the client must take
    // Nesting levels a request body (and each JSON string in it) may hold; 400 naming
    // the field above (issue 22 D1: deeper values would overflow the stack).
    int max_json_depth = protocol::kDefaultMaxJsonDepth;
};

struct ApiContext {
    const Tokenizer* tokenizer = nullptr;  // REQUIRES: outlives the context
    protocol::SpecialTokens special;
    protocol::ChatEncoding encoding = protocol::ChatEncoding::kDeepSeekV32;
    std::string model_id = "dsinfer-default";
    int64_t max_model_len = 0;
    ServerLimits limits;
    int encode_threads = 1;
    // Grammar compiles for response_format / text.format / guided_regex /
    // guided_grammar; nullptr: such requests get 501. REQUIRES: outlives the context.
    StructuredOutput* structured_output = nullptr;
    // Clock of request deadlines (`timeout_ms`): the engine's Env. nullptr: the default.
    Env* env = nullptr;
};

// An API key and the prefix-cache salt of its tenant ("" = none).
struct ApiKey {
    std::string key;
    std::string cache_salt;
};
// "KEY" or "KEY:SALT" (`dsinfer serve --api-key`, one line of --api-keys-file).
// INVALID_ARGUMENT for an empty key or a character that cannot be in an HTTP header.
Result<ApiKey> parse_api_key(std::string_view spec);

// The engine's cache salt of a request: the client's `cache_salt` as given when its API
// key has no salt; else the key's salt and the client's combined, in a namespace no
// client-chosen salt can reach (a client salt has no control characters). So tenants
// with salted keys never share prefix blocks with each other or with anyone else,
// whatever they send, and each can still partition its own cache with cache_salt.
std::string effective_cache_salt(std::string_view key_salt, std::string_view request_salt);

struct HttpReply {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;
};

// An error in `e`'s shape (OpenAI {"error":{...}} or Anthropic {"type":"error",...}).
HttpReply error_reply(Endpoint e, const Status& status);
// The same with an explicit HTTP status (401, 404 route, 413, 429 + Retry-After).
HttpReply error_reply(Endpoint e, int http_status, std::string_view message);

// GET /v1/models.
HttpReply models_reply(const ApiContext& ctx, int64_t created_s);

struct Prepared {
    Endpoint endpoint = Endpoint::kChatCompletions;
    bool stream = false;
    bool include_usage = false;
    bool thinking_prompt = false;  // the prompt ends with <think>: output starts in reasoning
    int32_t logprobs = -1;  // -1: off; else top-k count (chat / completions / responses)
    std::string model;
    std::vector<std::string> stop;
    bool speculative_usage = false;
    engine::GenerateRequest request;
    // The grammar request.mask was compiled from (a remote GenerationService ships it).
    std::optional<protocol::StructuredRequest> structured;
};

// INVALID_ARGUMENT / OUT_OF_RANGE (400), NOT_FOUND (404, unknown model).
// `seed` is used when the request gives none; `key_salt`: the cache salt of the API key
// the request was authenticated with (effective_cache_salt).
Result<Prepared> prepare_request(const ApiContext& ctx, Endpoint e, std::string_view body,
                                 uint64_t seed, std::string_view key_salt = {});

// One generation's Updates in the caller's protocol: protocol::Renderer (finish, stop
// cut, logprob shapes and usage are decided there) over the request's Prepared.
class Renderer {
public:
    // REQUIRES: ctx outlives the renderer.
    Renderer(const ApiContext& ctx, const Prepared& prepared, std::string id, int64_t created_s);

    // Streaming: SSE bytes for one update (the first call includes the opening
    // events). After the finishing update, finished() is true and the bytes end
    // the stream ([DONE] / message_stop / response.completed).
    std::string on_update_sse(const Update& u) { return impl_.on_update_sse(u); }
    // Non-streaming: consume an update; after the finishing one, reply() is the body.
    void on_update(const Update& u) { impl_.on_update(u); }
    HttpReply reply() const;

    bool finished() const { return impl_.finished(); }
    int64_t completion_tokens() const { return impl_.completion_tokens(); }

private:
    protocol::Renderer impl_;
};

}  // namespace dsi::server
