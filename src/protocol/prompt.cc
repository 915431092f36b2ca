#include "protocol/prompt.h"

#include <string>

namespace dsi::protocol {

namespace {

int32_t lookup(const Tokenizer& tokenizer, std::string_view spelling) {
    auto id = tokenizer.token_id(spelling);
    return id ? *id : -1;
}

}  // namespace

SpecialTokens SpecialTokens::from_tokenizer(const Tokenizer& tokenizer) {
    SpecialTokens t;
    t.bos = lookup(tokenizer, kBosToken);
    t.eos = lookup(tokenizer, kEosToken);
    t.user = lookup(tokenizer, kUserToken);
    t.assistant = lookup(tokenizer, kAssistantToken);
    t.think_begin = lookup(tokenizer, kThinkBeginToken);
    t.think_end = lookup(tokenizer, kThinkEndToken);
    if (t.think_begin < 0 && t.think_end < 0 &&
        tokenizer.token_text(128798) == "<｜place▁holder▁no▁798｜>" &&
        tokenizer.token_text(128799) == "<｜place▁holder▁no▁799｜>") {
        // V3.1/V3.2 renamed exactly these two V3 placeholders (published V3.2
        // example: <think>=128798, </think>=128799).
        t.think_begin = 128798;
        t.think_end = 128799;
    }
    t.dsml = lookup(tokenizer, kDsmlToken);
    t.tool_calls_begin = lookup(tokenizer, "<｜tool▁calls▁begin｜>");
    t.tool_calls_end = lookup(tokenizer, "<｜tool▁calls▁end｜>");
    t.tool_call_begin = lookup(tokenizer, "<｜tool▁call▁begin｜>");
    t.tool_call_end = lookup(tokenizer, "<｜tool▁call▁end｜>");
    t.tool_outputs_begin = lookup(tokenizer, "<｜tool▁outputs▁begin｜>");
    t.tool_outputs_end = lookup(tokenizer, "<｜tool▁outputs▁end｜>");
    t.tool_output_begin = lookup(tokenizer, "<｜tool▁output▁begin｜>");
    t.tool_output_end = lookup(tokenizer, "<｜tool▁output▁end｜>");
    t.tool_sep = lookup(tokenizer, "<｜tool▁sep｜>");
    return t;
}

std::string_view SpecialTokens::spelling(int32_t id) const {
    if (id < 0) {
        return {};
    }
    const std::pair<int32_t, std::string_view> table[] = {
        {bos, kBosToken},
        {eos, kEosToken},
        {user, kUserToken},
        {assistant, kAssistantToken},
        {think_begin, kThinkBeginToken},
        {think_end, kThinkEndToken},
        {dsml, kDsmlToken},
        {tool_calls_begin, "<｜tool▁calls▁begin｜>"},
        {tool_calls_end, "<｜tool▁calls▁end｜>"},
        {tool_call_begin, "<｜tool▁call▁begin｜>"},
        {tool_call_end, "<｜tool▁call▁end｜>"},
        {tool_outputs_begin, "<｜tool▁outputs▁begin｜>"},
        {tool_outputs_end, "<｜tool▁outputs▁end｜>"},
        {tool_output_begin, "<｜tool▁output▁begin｜>"},
        {tool_output_end, "<｜tool▁output▁end｜>"},
        {tool_sep, "<｜tool▁sep｜>"},
    };
    for (const auto& [tid, s] : table) {
        if (tid == id) {
            return s;
        }
    }
    return {};
}

void Prompt::text(std::string_view s) {
    if (s.empty()) {
        return;
    }
    if (!pieces_.empty() && pieces_.back().id < 0) {
        pieces_.back().text.append(s);
    } else {
        pieces_.push_back(PromptPiece{-1, std::string(s)});
    }
}

void Prompt::token(int32_t id, std::string_view spelling) {
    if (id < 0) {
        text(spelling);
        return;
    }
    pieces_.push_back(PromptPiece{id, std::string(spelling)});
}

std::string Prompt::to_text() const {
    std::string out;
    for (const auto& p : pieces_) {
        out.append(p.text);
    }
    return out;
}

std::vector<Segment> Prompt::segments() const {
    std::vector<Segment> out;
    out.reserve(pieces_.size());
    for (const auto& p : pieces_) {
        out.push_back(p.id >= 0 ? Segment::of_token(p.id) : Segment::of_text(p.text));
    }
    return out;
}

std::vector<int32_t> Prompt::encode(const Tokenizer& tokenizer, int num_threads) const {
    const auto segs = segments();
    return tokenizer.encode_segments(segs, num_threads);
}

}  // namespace dsi::protocol
