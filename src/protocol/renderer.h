// Renderer: one generation's engine output -> the caller's API output (issue 14 part 2,
// the response side of protocol/). Output ids go through the OutputParser (reasoning /
// content / DSML tool calls by token id) into the StreamWriter (SSE) or build_response
// (one JSON body); legacy completions render the engine's text without the parser.
// Decided here, once:
//   - finish: the engine's length / deadline / abort end is the API's "length"
//     (`max_tokens` / `incomplete`), any other end "stop" (or "tool_calls");
//   - stop strings: the engine ends the sequence at a match (sampling/stop.h); the
//     content text is cut at the match here (the parser reads ids, so it sees the whole
//     last token);
//   - logprob shapes: Chat `choices[0].logprobs.content` entries (with top_logprobs and
//     bytes), Responses `logprobs` on output_text parts / delta / done events without
//     reasoning tokens, legacy completions tokens / token_logprobs / top_logprobs /
//     text_offset;
//   - usage: prompt, completion, reasoning and prefix-cache-hit tokens per API, and on
//     request dsinfer's `speculative` counts.
//
// Thread model: one per generation, used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "protocol/adapters.h"
#include "protocol/output_parser.h"
#include "protocol/prompt.h"
#include "sampling/stop.h"
#include "tokenizer/tokenizer.h"

namespace dsi::protocol {

// One output token as the engine reported it.
struct OutputToken {
    int32_t token = -1;
    std::string text;  // the engine's text for it (stop strings already cut)
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top_logprobs;
};

// One engine event of a generation: zero or one token, and the end.
struct OutputUpdate {
    std::vector<OutputToken> tokens;
    bool finished = false;
    engine::FinishReason reason = engine::FinishReason::kNone;
    int64_t cached_prompt_tokens = 0;  // the request's prefix-cache hit (usage)
    SpeculativeUsage speculative;      // so far (usage, on request)
};

struct RenderOptions {
    ApiProtocol api = ApiProtocol::kChatCompletions;
    bool stream = false;
    bool include_usage = false;    // Chat / Completions stream_options.include_usage
    bool thinking_prompt = false;  // the prompt ends with <think>: output starts in reasoning
    int32_t logprobs = -1;         // -1 off; else top alternatives per token
    std::string id;                // "chatcmpl-…" / "cmpl-…" / "resp_…" / "msg_…"
    std::string model;
    int64_t created_s = 0;
    int64_t prompt_tokens = 0;
    std::vector<std::string> stop;
    bool speculative_usage = false;  // request field speculative_usage
    bool ignore_eos = false;         // EOS does not end the message (ParserOptions)
};

class Renderer {
public:
    // REQUIRES: tokenizer and special outlive the renderer.
    Renderer(const Tokenizer& tokenizer, const SpecialTokens& special, RenderOptions options);
    ~Renderer();

    // Streaming: SSE bytes for one update (the first call includes the opening
    // events). After the finishing update, finished() is true and the bytes end the
    // stream ([DONE] / message_stop / response.completed).
    std::string on_update_sse(const OutputUpdate& u);
    // Non-streaming: consume an update; after the finishing one, reply_body() is the
    // response JSON.
    void on_update(const OutputUpdate& u);
    std::string reply_body() const;

    bool finished() const { return finished_; }
    int64_t completion_tokens() const { return num_tokens_; }

private:
    // Feeds the update to the parser / completion state; returns protocol events.
    std::vector<Event> consume(const OutputUpdate& u);
    std::string chat_logprobs_chunk(std::string data);
    // Responses with logprobs: output_text delta / done events and response.completed.
    std::string responses_logprobs_event(const std::string& event, std::string data);
    std::string completion_chunk(std::string_view text, const char* finish);
    const char* completion_finish() const;

    const Tokenizer& tokenizer_;
    const SpecialTokens& special_;
    RenderOptions options_;
    ResponseMeta meta_;
    std::unique_ptr<OutputParser> parser_;
    std::unique_ptr<StreamWriter> writer_;
    std::unique_ptr<StopMatcher> stop_;
    std::vector<Event> events_;  // non-streaming
    std::string text_;           // completions: output text
    nlohmann::json logprobs_;    // chat: content entries; completions: object
    size_t logprobs_sent_ = 0;
    bool started_ = false;
    bool finished_ = false;
    bool saw_think_end_ = false;
    int64_t num_tokens_ = 0;
    int64_t num_reasoning_tokens_ = 0;
    engine::FinishReason reason_ = engine::FinishReason::kNone;
};

}  // namespace dsi::protocol
