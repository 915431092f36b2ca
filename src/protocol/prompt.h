// Prompt: an encoded chat as pieces -- template text, or a special token the
// template inserted (S-REC-2: such tokens go straight to their ids; user, tool and
// argument text never becomes a special token). SpecialTokens names the ids a
// vocabulary gives the template tokens.
//
// Thread model: plain values; SpecialTokens is immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace dsi::protocol {

// Template token spellings (U+FF5C bars, U+2581 "▁").
inline constexpr std::string_view kBosToken = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEosToken = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUserToken = "<｜User｜>";
inline constexpr std::string_view kAssistantToken = "<｜Assistant｜>";
inline constexpr std::string_view kThinkBeginToken = "<think>";
inline constexpr std::string_view kThinkEndToken = "</think>";
inline constexpr std::string_view kDsmlToken = "｜DSML｜";

// Ids of the template tokens in one vocabulary; -1 when the vocabulary has no
// such token, in which case encoders write the spelling as ordinary text and the
// output parser matches it on bytes (docs/protocol.md).
struct SpecialTokens {
    int32_t bos = 0;
    int32_t eos = 1;
    int32_t user = 128803;
    int32_t assistant = 128804;
    int32_t think_begin = 128798;  // V3.1/V3.2 ids (V3 placeholders 798/799)
    int32_t think_end = 128799;
    int32_t dsml = -1;  // "｜DSML｜" is not a token of the V3/V3.2 vocabulary we ship

    // The V3 template's tool tokens (original V3 tokenizer_config.json template).
    int32_t tool_calls_begin = 128806;
    int32_t tool_calls_end = 128807;
    int32_t tool_call_begin = 128808;
    int32_t tool_call_end = 128809;
    int32_t tool_outputs_begin = 128810;
    int32_t tool_outputs_end = 128811;
    int32_t tool_output_begin = 128812;
    int32_t tool_output_end = 128813;
    int32_t tool_sep = 128814;

    // Looks every spelling up in `tokenizer`. <think>/</think>: the token of that
    // name when the vocabulary has it; else, when ids 128798/128799 are the V3
    // placeholders "<｜place▁holder▁no▁798｜>"/"…799｜>", those ids (V3.1/V3.2
    // renamed exactly these two); else -1.
    static SpecialTokens from_tokenizer(const Tokenizer& tokenizer);
    // The spelling of a template token id (for rendering prompts as text); empty
    // when `id` is none of the above.
    std::string_view spelling(int32_t id) const;
};

struct PromptPiece {
    int32_t id = -1;   // a template token, or -1 for text
    std::string text;  // the text, or the token's spelling
};

class Prompt {
public:
    // Appends text (merged into the previous text piece: BPE sees text between
    // two special tokens as one run, exactly like the reference encoders).
    void text(std::string_view s);
    // Appends template token `id` spelled `spelling`; with id < 0 (the vocabulary
    // lacks the token) the spelling is appended as text.
    void token(int32_t id, std::string_view spelling);

    const std::vector<PromptPiece>& pieces() const { return pieces_; }
    // The prompt as the reference encoders' string (tokens by spelling).
    std::string to_text() const;
    // Segments for Tokenizer::encode_segments; views live as this Prompt.
    std::vector<Segment> segments() const;
    // Token ids: text via Tokenizer::encode (never recognises special tokens).
    std::vector<int32_t> encode(const Tokenizer& tokenizer, int num_threads = 1) const;

private:
    std::vector<PromptPiece> pieces_;
};

}  // namespace dsi::protocol
