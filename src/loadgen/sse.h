// Client side of OpenAI-style streaming: an incremental Server-Sent Events parser and
// the reading of one Chat Completions / Completions stream chunk (text delta, usage,
// error object). Used by the load generator; no sockets, so malformed input is tested
// directly.
// Thread model: SseParser is a value type used by one thread; the functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsi::loadgen {

struct SseEvent {
    std::string event;  // "" when the stream gives no `event:` field
    std::string data;   // `data:` lines joined with '\n'
};

// Feeds bytes in any split; complete events (ended by a blank line) are appended to
// `out`. Lines end with "\n", "\r\n" or "\r" (WHATWG event-stream rules); comment lines
// (":...") and unknown fields are ignored.
class SseParser {
public:
    explicit SseParser(size_t max_event_bytes = size_t{8} << 20)
        : max_event_bytes_(max_event_bytes) {}

    // INVALID_ARGUMENT when one line or one event's data exceeds max_event_bytes.
    [[nodiscard]] Status feed(std::string_view bytes, std::vector<SseEvent>& out);
    // True when bytes of an unfinished event are buffered (a stream that ends here was
    // cut off mid-event).
    bool has_partial() const { return !line_.empty() || has_data_ || !event_.event.empty(); }

private:
    Status on_line(std::string_view line, std::vector<SseEvent>& out);

    size_t max_event_bytes_;
    std::string line_;
    bool last_was_cr_ = false;
    bool has_data_ = false;
    SseEvent event_;
};

struct StreamUsage {
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
    int64_t cached_tokens = 0;  // prompt_tokens_details.cached_tokens (0 if absent)
};

struct StreamChunk {
    bool done = false;      // the "[DONE]" sentinel
    std::string text;       // content + reasoning_content (chat) or text (completions)
    bool finished = false;  // a choice carries a finish_reason
    std::optional<StreamUsage> usage;
};

// One `data:` payload of a Chat Completions or Completions stream. INVALID_ARGUMENT for
// data that is not a JSON object or has malformed fields; the server's message for an
// {"error": ...} object (UNAVAILABLE).
Result<StreamChunk> parse_stream_chunk(std::string_view data);

// Usage of a non-streaming Chat Completions / Completions reply body, and its text.
struct ReplyInfo {
    std::string text;
    StreamUsage usage;
};
Result<ReplyInfo> parse_reply_body(std::string_view body);

}  // namespace dsi::loadgen
