#include "tokenizer/internal/pretokenizer.h"

#include <gtest/gtest.h>

namespace dsi::tokenizer_internal {
namespace {

std::vector<std::string> pieces(const PreTokenizer& p, std::string_view text) {
    std::vector<std::string> out;
    p.run(text, [&](size_t b, size_t e) { out.emplace_back(text.substr(b, e - b)); });
    return out;
}

PreTokenizer deepseek_v3() {
    return PreTokenizer({{SplitMatcher::kDigits, SplitBehavior::kIsolated},
                         {SplitMatcher::kCjk, SplitBehavior::kIsolated},
                         {SplitMatcher::kWords, SplitBehavior::kIsolated}});
}

using V = std::vector<std::string>;

TEST(PreTokenizerTest, KnownPatternsMapToMatchers) {
    EXPECT_EQ(*matcher_for_regex(kDigitsPattern), SplitMatcher::kDigits);
    EXPECT_EQ(*matcher_for_regex(kCjkPattern), SplitMatcher::kCjk);
    EXPECT_EQ(*matcher_for_regex(kWordsPattern), SplitMatcher::kWords);
    EXPECT_EQ(matcher_for_regex("\\s+").status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(parse_split_behavior("Nope").status().code(), StatusCode::kInvalidArgument);
}

// Pieces derived by hand from Oniguruma's leftmost, ordered-alternation rules.
TEST(PreTokenizerTest, DeepSeekV3Rules) {
    const PreTokenizer p = deepseek_v3();
    EXPECT_EQ(pieces(p, "1234567"), (V{"123", "456", "7"}));
    EXPECT_EQ(pieces(p, "Hello, world!"), (V{"Hello", ",", " world", "!"}));
    EXPECT_EQ(pieces(p, "don't"), (V{"don", "'t"}));            // A1 before A2
    EXPECT_EQ(pieces(p, "'sé"), (V{"'s", "é"}));                // A1 takes ASCII letters only
    EXPECT_EQ(pieces(p, "a  b"), (V{"a", " ", " b"}));          // A5 leaves one space for A2
    EXPECT_EQ(pieces(p, "a   "), (V{"a", "   "}));              // A5 at the end of the piece
    EXPECT_EQ(pieces(p, "a \n\n b"), (V{"a", " \n\n", " b"}));  // A4 to the last newline
    EXPECT_EQ(pieces(p, "x\r\n\ty"), (V{"x", "\r\n", "\ty"}));
    EXPECT_EQ(pieces(p, " ..\n\nz"), (V{" ..\n\n", "z"}));  // A3 takes trailing CR/LF
    EXPECT_EQ(pieces(p, "v1"), (V{"v", "1"}));
    EXPECT_EQ(pieces(p, "日本語のテキスト"), (V{"日本語のテキスト"}));
    EXPECT_EQ(pieces(p, "abc日本def"), (V{"abc", "日本", "def"}));
    EXPECT_EQ(pieces(p, "カ・カ"), (V{"カ", "・", "カ"}));  // ・ is Po inside the CJK range
    EXPECT_EQ(pieces(p,
                     "a\x01"
                     "b"),
              (V{"a",
                 "\x01"
                 "b"}));                                  // a control char prefixes letters
    EXPECT_EQ(pieces(p, "\x01\x02"), (V{"\x01\x02"}));    // no match: one gap
    EXPECT_EQ(pieces(p, "e\xCC\x81"), (V{"e\xCC\x81"}));  // combining mark joins letters
    // U+0085 (NEL) is \s for Oniguruma (and Rust); U+FEFF is not.
    EXPECT_EQ(pieces(p,
                     "a\xC2\x85\xC2\x85"
                     "b"),
              (V{"a", "\xC2\x85",
                 "\xC2\x85"
                 "b"}));
    EXPECT_EQ(pieces(p,
                     "a\xEF\xBB\xBF"
                     "b"),
              (V{"a",
                 "\xEF\xBB\xBF"
                 "b"}));
    // Emoji ZWJ sequence: symbols, and the ZWJ (Cf) is a gap of its own.
    EXPECT_EQ(pieces(p, "👩‍👧"), (V{"👩", "\u200D", "👧"}));
    EXPECT_EQ(pieces(p, ""), (V{}));
}

// The examples of HF's SplitDelimiterBehavior documentation.
TEST(PreTokenizerTest, SplitBehaviours) {
    auto with = [](SplitBehavior b, bool invert = false) {
        SplitRule r{SplitMatcher::kLiteral, b, invert, "-"};
        return PreTokenizer({r});
    };
    const std::string t = "the-final--countdown";
    EXPECT_EQ(pieces(with(SplitBehavior::kRemoved), t), (V{"the", "final", "countdown"}));
    EXPECT_EQ(pieces(with(SplitBehavior::kIsolated), t),
              (V{"the", "-", "final", "-", "-", "countdown"}));
    EXPECT_EQ(pieces(with(SplitBehavior::kMergedWithPrevious), t),
              (V{"the-", "final-", "-", "countdown"}));
    EXPECT_EQ(pieces(with(SplitBehavior::kMergedWithNext), t),
              (V{"the", "-final", "-", "-countdown"}));
    EXPECT_EQ(pieces(with(SplitBehavior::kContiguous), t),
              (V{"the", "-", "final", "--", "countdown"}));
    EXPECT_EQ(pieces(with(SplitBehavior::kRemoved, /*invert=*/true), t), (V{"-", "-", "-"}));
}

}  // namespace
}  // namespace dsi::tokenizer_internal
