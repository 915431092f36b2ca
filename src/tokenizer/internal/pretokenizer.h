// PreTokenizer: the `Sequence` of `Split` rules from tokenizer.json, each regex
// implemented as a hand-written matcher over code points (no regex engine), with
// the split behaviours of Hugging Face `tokenizers` (Rust). It turns one text
// section (no added tokens inside) into the pieces that BPE encodes one by one.
//
// Supported patterns are the ones the DeepSeek V3 vocabulary uses (see
// kDigitsPattern etc. below) plus literal `String` patterns; any other regex is
// rejected at load with UNIMPLEMENTED naming it. Thread model: immutable after
// construction; run() is const and may be called from many threads at once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsi::tokenizer_internal {

// The regexes of the DeepSeek V3 pre_tokenizer, exactly as tokenizer.json spells
// them (after JSON unescaping).
inline constexpr std::string_view kDigitsPattern = "\\p{N}{1,3}";
inline constexpr std::string_view kCjkPattern =
    "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+";
inline constexpr std::string_view kWordsPattern =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
    "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
    "\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

enum class SplitMatcher {
    kDigits,   // \p{N}{1,3}
    kCjk,      // [一-龥぀-ゟ゠-ヿ]+
    kWords,    // the DeepSeek V3 word / punctuation / whitespace alternation
    kLiteral,  // a `String` pattern
};

// SplitDelimiterBehavior of HF tokenizers.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitRule {
    SplitMatcher matcher;
    SplitBehavior behavior;
    bool invert = false;
    std::string literal;  // kLiteral only
};

// Maps a `Regex` pattern string to its matcher; UNIMPLEMENTED for unknown ones.
Result<SplitMatcher> matcher_for_regex(std::string_view pattern);
// Parses "Isolated", "Removed", ...; INVALID_ARGUMENT otherwise.
Result<SplitBehavior> parse_split_behavior(std::string_view name);

class PreTokenizer {
public:
    PreTokenizer() = default;
    explicit PreTokenizer(std::vector<SplitRule> rules) : rules_(std::move(rules)) {}

    // Calls sink(begin, end) for each piece of `text`, in order; pieces are
    // non-empty byte ranges of `text`. With no rules the whole text is one piece.
    // REQUIRES: text is valid UTF-8.
    template <typename Sink>
    void run(std::string_view text, Sink&& sink) const {
        if (text.empty()) return;
        run_level(text, 0, 0, text.size(), sink);
    }

    const std::vector<SplitRule>& rules() const { return rules_; }

    // Finds the first match of `matcher` in text[from, end) where the pattern sees
    // only text[begin, end) (lookahead stops at `end`). Returns false if none.
    static bool find(const SplitRule& rule, std::string_view text, size_t begin, size_t from,
                     size_t end, size_t* match_begin, size_t* match_end);

private:
    template <typename Sink>
    void run_level(std::string_view text, size_t level, size_t begin, size_t end,
                   Sink& sink) const {
        if (level == rules_.size()) {
            sink(begin, end);
            return;
        }
        const SplitRule& rule = rules_[level];
        auto next = [&](size_t b, size_t e) { run_level(text, level + 1, b, e, sink); };
        if (rule.behavior == SplitBehavior::kIsolated) {
            // The common case, streamed: every match and every gap is a piece.
            size_t pos = begin;
            size_t mb;
            size_t me;
            while (pos < end && find(rule, text, begin, pos, end, &mb, &me)) {
                if (mb > pos) next(pos, mb);
                next(mb, me);
                pos = me;
            }
            if (pos < end) next(pos, end);
            return;
        }
        split_general(rule, text, begin, end, next);
    }

    // Removed / MergedWith* / Contiguous / invert: collects (range, is_match)
    // splits and combines them as HF's NormalizedString::split does.
    template <typename Next>
    static void split_general(const SplitRule& rule, std::string_view text, size_t begin,
                              size_t end, Next& next);

    std::vector<SplitRule> rules_;
};

template <typename Next>
void PreTokenizer::split_general(const SplitRule& rule, std::string_view text, size_t begin,
                                 size_t end, Next& next) {
    struct Split {
        size_t b;
        size_t e;
        bool is_match;
    };
    std::vector<Split> splits;
    size_t pos = begin;
    size_t mb;
    size_t me;
    while (pos < end && find(rule, text, begin, pos, end, &mb, &me)) {
        if (mb > pos) splits.push_back({pos, mb, false});
        splits.push_back({mb, me, true});
        pos = me;
    }
    if (pos < end) splits.push_back({pos, end, false});
    if (rule.invert) {
        for (Split& s : splits) s.is_match = !s.is_match;
    }
    std::vector<Split> out;
    switch (rule.behavior) {
        case SplitBehavior::kIsolated:
            out = std::move(splits);
            break;
        case SplitBehavior::kRemoved:
            for (const Split& s : splits) {
                if (!s.is_match) out.push_back(s);
            }
            break;
        case SplitBehavior::kContiguous:
            for (const Split& s : splits) {
                if (!out.empty() && out.back().is_match && s.is_match) {
                    out.back().e = s.e;
                } else {
                    out.push_back(s);
                }
            }
            break;
        case SplitBehavior::kMergedWithPrevious: {
            bool previous_match = false;
            for (const Split& s : splits) {
                if (s.is_match && !previous_match && !out.empty()) {
                    out.back().e = s.e;
                } else {
                    out.push_back(s);
                }
                previous_match = s.is_match;
            }
            break;
        }
        case SplitBehavior::kMergedWithNext: {
            bool previous_match = false;  // "previous" in reverse order = the next split
            for (size_t k = splits.size(); k-- > 0;) {
                const Split& s = splits[k];
                if (s.is_match && !previous_match && !out.empty()) {
                    out.back().b = s.b;
                } else {
                    out.push_back(s);
                }
                previous_match = s.is_match;
            }
            std::reverse(out.begin(), out.end());
            break;
        }
    }
    for (const Split& s : out) next(s.b, s.e);
}

}  // namespace dsi::tokenizer_internal
