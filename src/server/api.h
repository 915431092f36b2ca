// Api: everything the HTTP server does with a request body that needs no socket,
// so it is tested without one. Routes a path to an endpoint; turns a body into an
// engine::GenerateRequest (protocol adapter -> chat encoder -> token ids -> sampling,
// with the server's limits); renders engine Updates into the caller's protocol
// (SSE bytes while streaming, one JSON body otherwise); shapes every error as the
// caller's protocol error object with the HTTP status from http_status().
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

#include "base/status.h"
#include "engine/engine.h"
#include "protocol/adapters.h"
#include "protocol/encoder.h"
#include "protocol/output_parser.h"
#include "sampling/stop.h"
#include "server/engine_service.h"
#include "tokenizer/tokenizer.h"

namespace dsi::server {

class StructuredOutput;  // structured_output.h

enum class Endpoint { kChatCompletions, kCompletions, kResponses, kMessages };
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
};

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
    engine::GenerateRequest request;
};

// INVALID_ARGUMENT / OUT_OF_RANGE (400), NOT_FOUND (404, unknown model).
// `seed` is used when the request gives none.
Result<Prepared> prepare_request(const ApiContext& ctx, Endpoint e, std::string_view body,
                                 uint64_t seed);

// Turns one generation's Updates into protocol output.
class Renderer {
public:
    // REQUIRES: ctx outlives the renderer.
    Renderer(const ApiContext& ctx, const Prepared& prepared, std::string id, int64_t created_s);
    ~Renderer();

    // Streaming: SSE bytes for one update (the first call includes the opening
    // events). After the finishing update, finished() is true and the bytes end
    // the stream ([DONE] / message_stop / response.completed).
    std::string on_update_sse(const Update& u);
    // Non-streaming: consume an update; after the finishing one, reply() is the body.
    void on_update(const Update& u);
    HttpReply reply() const;

    bool finished() const { return finished_; }
    int64_t completion_tokens() const { return num_tokens_; }

private:
    // Feeds the update to the parser / completion state; returns protocol events.
    std::vector<protocol::Event> consume(const Update& u);
    std::string chat_logprobs_chunk(std::string data);
    // Responses with logprobs: output_text delta / done events and response.completed.
    std::string responses_logprobs_event(const std::string& event, std::string data);
    std::string completion_chunk(std::string_view text, const char* finish);

    const ApiContext& ctx_;
    Prepared prepared_;
    std::string id_;
    int64_t created_s_ = 0;
    protocol::ResponseMeta meta_;
    std::unique_ptr<protocol::OutputParser> parser_;
    std::unique_ptr<protocol::StreamWriter> writer_;
    std::unique_ptr<StopMatcher> stop_;
    std::vector<protocol::Event> events_;  // non-streaming
    std::string text_;                     // completions: output text
    nlohmann::json logprobs_;              // chat: content entries; completions: object
    size_t logprobs_sent_ = 0;
    bool started_ = false;
    bool finished_ = false;
    bool saw_think_end_ = false;
    int64_t num_tokens_ = 0;
    int64_t num_reasoning_tokens_ = 0;
    engine::FinishReason reason_ = engine::FinishReason::kNone;
};

}  // namespace dsi::server
