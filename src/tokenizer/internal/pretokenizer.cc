#include "tokenizer/internal/pretokenizer.h"

#include "tokenizer/internal/unicode.h"

namespace dsi::tokenizer_internal {
namespace {

// Class of the code point at text[i], with a compile-time table for ASCII.
inline uint16_t cls(const char* s, size_t i, size_t* len) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
        *len = 1;
        return kAsciiClasses.v[b];
    }
    return class_at(s, i, len);
}

// End of the run of code points whose class intersects `mask`, starting at i.
inline size_t run_of(const char* s, size_t i, size_t end, uint16_t mask) {
    while (i < end) {
        size_t n;
        if (!(cls(s, i, &n) & mask)) break;
        i += n;
    }
    return i;
}

// \p{N}{1,3}: up to three consecutive numbers.
bool find_digits(const char* s, size_t from, size_t end, size_t* mb, size_t* me) {
    for (size_t i = from; i < end;) {
        size_t n;
        if (cls(s, i, &n) & kN) {
            size_t j = i + n;
            for (int k = 1; k < 3 && j < end; ++k) {
                size_t m;
                if (!(cls(s, j, &m) & kN)) break;
                j += m;
            }
            *mb = i;
            *me = j;
            return true;
        }
        i += n;
    }
    return false;
}

// [一-龥぀-ゟ゠-ヿ]+
bool find_cjk(const char* s, size_t from, size_t end, size_t* mb, size_t* me) {
    for (size_t i = from; i < end;) {
        size_t n;
        if (cls(s, i, &n) & kCjk) {
            *mb = i;
            *me = run_of(s, i + n, end, kCjk);
            return true;
        }
        i += n;
    }
    return false;
}

// The DeepSeek V3 alternation, tried at exactly position i of a piece ending at
// `end`, with Oniguruma's ordered-alternation and backtracking semantics:
//   A1 [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
//   A2 [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//   A3  ?[\p{P}\p{S}]+[\r\n]*
//   A4 \s*[\r\n]+
//   A5 \s+(?!\S)
//   A6 \s+
// Returns the match end, or i when no alternative matches here.
size_t match_words_at(const char* s, size_t i, size_t end) {
    size_t n;
    const uint16_t c = cls(s, i, &n);
    const size_t j = i + n;
    uint16_t c2 = 0;
    size_t n2 = 0;
    if (j < end) c2 = cls(s, j, &n2);
    // A1: ASCII punctuation followed by ASCII letters.
    if ((c & kAsciiPunct) && (c2 & kAsciiAlpha)) {
        size_t k = j + 1;
        while (k < end && (cls(s, k, &n2) & kAsciiAlpha)) ++k;
        return k;
    }
    // A2: the optional prefix char is anything but CR, LF, L, P, S (so it may be a
    // mark, number, space, control...); greedy, so it is taken when letters follow.
    if (!(c & (kCrLf | kL | kP | kS)) && (c2 & (kL | kM))) {
        return run_of(s, j + n2, end, kL | kM);
    }
    if (c & (kL | kM)) return run_of(s, j, end, kL | kM);
    // A3: optional ASCII space, punctuation/symbol run, then CR/LF run.
    if (s[i] == ' ' && (c2 & (kP | kS))) {
        return run_of(s, run_of(s, j + n2, end, kP | kS), end, kCrLf);
    }
    if (c & (kP | kS)) return run_of(s, run_of(s, j, end, kP | kS), end, kCrLf);
    if (!(c & kSpace)) return i;
    // Whitespace run [i, k). A4 backtracks \s* to the last CR/LF of the run; A5
    // gives the run up to the end of the piece, or all but its last character when
    // a non-space follows (needs >= 2 characters); A6 takes a lone space.
    size_t k = i;
    size_t last_crlf_end = 0;
    size_t last_start = i;
    while (k < end) {
        size_t m;
        const uint16_t ck = cls(s, k, &m);
        if (!(ck & kSpace)) break;
        if (ck & kCrLf) last_crlf_end = k + m;
        last_start = k;
        k += m;
    }
    if (last_crlf_end != 0) return last_crlf_end;  // A4
    if (k == end) return k;                        // A5 at the end of the piece
    if (last_start > i) return last_start;         // A5, backtracked by one char
    return k;                                      // A6
}

bool find_words(const char* s, size_t from, size_t end, size_t* mb, size_t* me) {
    for (size_t i = from; i < end;) {
        const size_t e = match_words_at(s, i, end);
        if (e > i) {
            *mb = i;
            *me = e;
            return true;
        }
        size_t n;
        cls(s, i, &n);
        i += n;
    }
    return false;
}

}  // namespace

Result<SplitMatcher> matcher_for_regex(std::string_view pattern) {
    if (pattern == kDigitsPattern) return SplitMatcher::kDigits;
    if (pattern == kCjkPattern) return SplitMatcher::kCjk;
    if (pattern == kWordsPattern) return SplitMatcher::kWords;
    return unimplemented("pre_tokenizer Split regex has no hand-written matcher: " +
                         std::string(pattern));
}

Result<SplitBehavior> parse_split_behavior(std::string_view name) {
    if (name == "Isolated") return SplitBehavior::kIsolated;
    if (name == "Removed") return SplitBehavior::kRemoved;
    if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
    if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
    if (name == "Contiguous") return SplitBehavior::kContiguous;
    return invalid_argument("unknown Split behavior: " + std::string(name));
}

bool PreTokenizer::find(const SplitRule& rule, std::string_view text, size_t /*begin*/, size_t from,
                        size_t end, size_t* match_begin, size_t* match_end) {
    const char* s = text.data();
    switch (rule.matcher) {
        case SplitMatcher::kDigits:
            return find_digits(s, from, end, match_begin, match_end);
        case SplitMatcher::kCjk:
            return find_cjk(s, from, end, match_begin, match_end);
        case SplitMatcher::kWords:
            return find_words(s, from, end, match_begin, match_end);
        case SplitMatcher::kLiteral: {
            if (rule.literal.empty()) return false;
            const size_t at = text.substr(0, end).find(rule.literal, from);
            if (at == std::string_view::npos) return false;
            *match_begin = at;
            *match_end = at + rule.literal.size();
            return true;
        }
    }
    return false;
}

}  // namespace dsi::tokenizer_internal
