// OutputParser: the streaming parser of DeepSeek DSML completions (S-REC-4).
// Token ids in, events out: reasoning delta, content delta, tool-call start
// (index, id, name -- as soon as the closing quote of the name arrives), argument
// JSON fragments, tool-call end, finish.
//
// How it reads the stream: each id becomes symbols. A template token the
// delimiters use (</think>, and ｜DSML｜ when the vocabulary has it) is ONE symbol
// (256 + id); every other token contributes its bytes (0..255). Delimiters are
// symbol strings matched by incremental KMP automata that keep their state across
// push() calls, so a marker split across tokens or calls is found without
// rescanning (S-REC-4); the characters "</think>" produced by ordinary tokens are
// bytes, never the id symbol, and stay literal content (S-REC-2). Only the
// symbols that could still start a marker are held back; payload bytes are
// emitted at once, minus an incomplete UTF-8 tail. String arguments are JSON
// escaped piece by piece; string="false" values pass through raw. DSML that does
// not follow the grammar degrades to content and sets `malformed` on the finish
// event; the parser never fails.
//
// Thread model: one parser per sequence, one owner.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/prompt.h"
#include "tokenizer/tokenizer.h"

namespace dsi::protocol {

// Why the output ended as the APIs report it (OpenAI finish_reason, Anthropic
// stop_reason, Responses status). Not engine::FinishReason, the engine's lifecycle end
// (stop, length, abort, deadline, error), which the renderer maps onto this.
enum class StopReason { kStop, kLength, kToolCalls };
std::string_view finish_reason_name(StopReason reason);  // "stop" | "length" | "tool_calls"

enum class EventKind {
    kReasoningDelta,
    kContentDelta,
    kToolCallStart,  // tool_index, tool_id, tool_name
    kToolCallArgs,   // tool_index, text = a JSON fragment
    kToolCallEnd,    // tool_index
    kFinish,         // finish, malformed
};

struct Event {
    EventKind kind = EventKind::kContentDelta;
    std::string text;
    int tool_index = -1;
    std::string tool_id;
    std::string tool_name;
    StopReason finish = StopReason::kStop;
    bool malformed = false;
    bool operator==(const Event&) const = default;
};

enum class DsmlDialect {
    kV32,  // <｜DSML｜function_calls>
    kV4,   // <｜DSML｜tool_calls>
};

struct ParserOptions {
    DsmlDialect dialect = DsmlDialect::kV32;
    // The prompt ended with <think>: the completion starts in reasoning.
    bool thinking = false;
    // Tool call ids are tool_call_id_prefix + index ("call_<request>_0").
    std::string tool_call_id_prefix = "call_";
    // The request's ignore_eos: the EOS id is a template token without text (as vLLM
    // skips it as a special token), so the completion goes on to max_tokens or a stop.
    bool ignore_eos = false;
};

class OutputParser {
public:
    // REQUIRES: `tokenizer` outlives the parser.
    OutputParser(const Tokenizer& tokenizer, const SpecialTokens& tokens, ParserOptions options);
    ~OutputParser();

    // Consumes sampled ids; appends the settled events to *out. The EOS id ends the
    // completion (finish stop / tool_calls; not with ParserOptions::ignore_eos); later
    // ids are ignored.
    void push(std::span<const int32_t> ids, std::vector<Event>* out);
    // Ends the completion without EOS (e.g. max tokens: kLength): flushes what is
    // held back and emits finish. No-op after EOS.
    void finish(StopReason reason, std::vector<Event>* out);
    bool done() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// One-shot parse: push(ids) then finish(kLength) if no EOS came.
std::vector<Event> parse_completion(const Tokenizer& tokenizer, const SpecialTokens& tokens,
                                    const ParserOptions& options, std::span<const int32_t> ids);

}  // namespace dsi::protocol
