// Protocol adapters (S-REC-1): pure functions between the three HTTP APIs and the
// one Conversation form / parser event stream. No sockets: server/ calls these.
//   OpenAI Chat Completions  POST /v1/chat/completions
//   OpenAI Responses         POST /v1/responses
//   Anthropic Messages       POST /v1/messages
// Requests: JSON text -> Conversation, or INVALID_ARGUMENT (HTTP 400) whose
// message names the offending field ("messages[2].tool_calls[0].function.name:
// …"); json_error_body() shapes it as the protocol's error object. Responses:
// the parser's events -> one response JSON (non-streaming), or the SSE event
// sequence in the order each protocol's official SDK requires (streaming).
//
// Thread model: pure functions; a *StreamWriter is per response, one owner.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "protocol/conversation.h"
#include "protocol/json_limits.h"
#include "protocol/output_parser.h"

namespace dsi::protocol {

// The four HTTP APIs. kCompletions (legacy /v1/completions) has a prompt, not a
// conversation: its output is text, rendered by the server's Renderer.
enum class ApiProtocol { kChatCompletions, kCompletions, kResponses, kMessages };

// `max_depth`: nesting limit of the body and of the JSON strings in it (tool-call
// arguments), checked before any value is copied or dumped (json_limits.h).
Result<Conversation> parse_chat_completions_request(std::string_view body,
                                                    int max_depth = kDefaultMaxJsonDepth);
Result<Conversation> parse_responses_request(std::string_view body,
                                             int max_depth = kDefaultMaxJsonDepth);
Result<Conversation> parse_messages_request(std::string_view body,
                                            int max_depth = kDefaultMaxJsonDepth);
Result<Conversation> parse_request(ApiProtocol api, std::string_view body,
                                   int max_depth = kDefaultMaxJsonDepth);
// The body as one JSON object (depth-checked first), and the conversation read from
// it (the pieces of parse_request; request.h reads the rest of the body from the same
// value). REQUIRES for conversation_from_json: `body` came from parse_request_body
// with the same max_depth; INVALID_ARGUMENT for kCompletions.
Result<OrderedJson> parse_request_body(std::string_view body, int max_depth);
Result<Conversation> conversation_from_json(ApiProtocol api, const OrderedJson& body,
                                            int max_depth);

// The error JSON each API returns with a non-OK status.
std::string json_error_body(ApiProtocol api, const Status& status);

// One generation's speculative decoding: drafted tokens verified, of which accepted, in
// how many verifying steps.
struct SpeculativeUsage {
    int64_t draft_tokens = 0;
    int64_t accepted_tokens = 0;
    int64_t verify_steps = 0;
};

// dsinfer's usage extension, on request (the request field speculative_usage):
// {"draft_tokens", "accepted_tokens", "verify_steps"}, as usage.speculative.
OrderedJson speculative_usage_json(const SpeculativeUsage& s);

struct ResponseMeta {
    std::string id;     // "chatcmpl-…" / "resp_…" / "msg_…"
    std::string model;
    int64_t created_s = 0;  // unix seconds
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
    int64_t reasoning_tokens = 0;
    int64_t cached_tokens = 0;  // of prompt_tokens, from the prefix cache
    bool include_usage = false;  // Chat Completions stream_options.include_usage
    // Request field speculative_usage: usage.speculative with these counts.
    bool speculative_usage = false;
    SpeculativeUsage speculative;
};

// A finished completion folded from events (the non-streaming view).
struct Completion {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> tool_calls;
    StopReason finish = StopReason::kStop;
    bool malformed = false;
};
Completion fold_events(const std::vector<Event>& events);

// Non-streaming response body.
std::string build_response(ApiProtocol api, const ResponseMeta& meta, const Completion& c);

// One SSE message: `event:` name (empty for Chat Completions, whose SSE has none)
// and `data:` JSON (or "[DONE]").
struct SseEvent {
    std::string event;
    std::string data;
    std::string to_wire() const;  // "event: x\ndata: {...}\n\n"
};

// Streaming: feed parser events in order, then finish(); each call returns the SSE
// messages to send. Orders: Chat Completions role chunk, reasoning_content /
// content deltas, tool_calls deltas (index+id+type+name first, then argument
// fragments), finish_reason chunk, optional usage chunk, [DONE]. Responses:
// response.created, response.in_progress, per item output_item.added … done,
// response.completed / response.incomplete. Messages: message_start,
// content_block_start/delta/stop per block, message_delta, message_stop.
class StreamWriter {
public:
    StreamWriter(ApiProtocol api, ResponseMeta meta);
    std::vector<SseEvent> start();
    std::vector<SseEvent> on_event(const Event& event);
    // Output token counts for the closing events' usage (known only at the end).
    void set_usage(int64_t completion_tokens, int64_t reasoning_tokens) {
        meta_.completion_tokens = completion_tokens;
        meta_.reasoning_tokens = reasoning_tokens;
    }
    // Known once the request is admitted (before start() in the server).
    void set_cached_tokens(int64_t cached_tokens) { meta_.cached_tokens = cached_tokens; }
    void set_speculative(const SpeculativeUsage& s) { meta_.speculative = s; }

private:
    std::vector<SseEvent> chat_event(const Event& e);
    std::vector<SseEvent> responses_event(const Event& e);
    std::vector<SseEvent> messages_event(const Event& e);
    std::vector<SseEvent> close_open_block();

    ApiProtocol api_;
    ResponseMeta meta_;
    int64_t sequence_ = 0;
    // Open block/item: 0 none, 1 reasoning, 2 text, 3 tool call.
    int open_kind_ = 0;
    int block_index_ = -1;  // Messages content index / Responses output_index
    std::string open_item_id_;
    std::string open_text_;  // accumulated text of the open block
    ToolCall open_call_;
    Completion done_;        // everything so far, for the final objects
    std::vector<nlohmann::ordered_json> output_items_;  // Responses: finished items
};

}  // namespace dsi::protocol
