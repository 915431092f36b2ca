// Unicode helpers for the tokenizer: per-code-point class flags (general category
// groups and the few sets the DeepSeek V3 split rules name), UTF-8 decoding of
// already-validated text, and lossy UTF-8 repair.
//
// The class table is built once from ICU (u_charType / u_isUWhiteSpace) on first
// use and is immutable afterwards. Thread model: all functions are pure or read the
// immutable table; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsi::tokenizer_internal {

// Bit flags of a code point. A code point has at most one of kL..kS (they are
// disjoint general-category groups); the others are sets used by specific rules.
enum CpClass : uint16_t {
    kL = 1 << 0,           // \p{L}: Lu Ll Lt Lm Lo
    kM = 1 << 1,           // \p{M}: Mn Mc Me
    kN = 1 << 2,           // \p{N}: Nd Nl No
    kP = 1 << 3,           // \p{P}: Pc Pd Ps Pe Pi Pf Po
    kS = 1 << 4,           // \p{S}: Sm Sc Sk So
    kSpace = 1 << 5,       // Oniguruma / Rust-regex \s: 09-0D, 85, Zs, Zl, Zp (= White_Space)
    kCrLf = 1 << 6,        // '\r' or '\n'
    kCjk = 1 << 7,         // U+4E00-9FA5, U+3040-309F, U+30A0-30FF (DeepSeek V3 rule 2)
    kAsciiPunct = 1 << 8,  // the 32 ASCII punctuation/symbol characters
    kAsciiAlpha = 1 << 9,  // [A-Za-z]
    kWord = 1 << 10,       // Rust-regex \w: Alphabetic, M, Nd, Pc, Join_Control
};

// Class flags of code point `cp` (0 for values above U+10FFFF).
uint16_t cp_class(uint32_t cp);

// cp_class for ASCII, computed at compile time (unicode_test checks it against
// the ICU-built table).
constexpr uint16_t ascii_class(uint32_t c) {
    uint16_t f = 0;
    const bool upper = c >= 'A' && c <= 'Z';
    const bool lower = c >= 'a' && c <= 'z';
    if (upper || lower) f |= kL | kAsciiAlpha | kWord;
    if (c >= '0' && c <= '9') f |= kN | kWord;
    const bool punct_or_symbol = (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
                                 (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
    if (punct_or_symbol) {
        f |= kAsciiPunct;
        const bool symbol = c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
                            c == '`' || c == '|' || c == '~';
        f |= symbol ? kS : kP;
        if (c == '_') f |= kWord;  // Pc
    }
    if ((c >= 0x09 && c <= 0x0D) || c == ' ') f |= kSpace;
    if (c == '\r' || c == '\n') f |= kCrLf;
    return f;
}

struct AsciiClasses {
    uint16_t v[128];
};
constexpr AsciiClasses make_ascii_classes() {
    AsciiClasses t{};
    for (uint32_t c = 0; c < 128; ++c) t.v[c] = ascii_class(c);
    return t;
}
inline constexpr AsciiClasses kAsciiClasses = make_ascii_classes();

// Decodes one code point of VALID UTF-8 at s[i]; sets *len to its byte length.
// REQUIRES: s[i..] starts a complete, valid UTF-8 sequence.
inline uint32_t decode_utf8(const char* s, size_t i, size_t* len) {
    const auto* p = reinterpret_cast<const unsigned char*>(s) + i;
    uint32_t b0 = p[0];
    if (b0 < 0x80) {
        *len = 1;
        return b0;
    }
    if (b0 < 0xE0) {
        *len = 2;
        return ((b0 & 0x1F) << 6) | (p[1] & 0x3F);
    }
    if (b0 < 0xF0) {
        *len = 3;
        return ((b0 & 0x0F) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3F);
    }
    *len = 4;
    return ((b0 & 0x07) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3F);
}

// Class of the code point at s[i] and its byte length (valid UTF-8 required).
inline uint16_t class_at(const char* s, size_t i, size_t* len) {
    return cp_class(decode_utf8(s, i, len));
}

// Length of the longest prefix of `bytes` that is valid UTF-8.
size_t valid_utf8_prefix(std::string_view bytes);

// Result of examining one UTF-8 sequence at the front of a byte range.
struct Utf8Step {
    enum Kind : uint8_t { kValid, kInvalid, kIncomplete };
    Kind kind;
    // kValid: the sequence length. kInvalid: the length of the maximal subpart to
    // replace by one U+FFFD (>= 1). kIncomplete: the number of bytes present, all a
    // valid prefix of a longer sequence that the range ends inside.
    size_t len;
};

// Examines the sequence starting at bytes[0]. REQUIRES: !bytes.empty().
// "Maximal subpart" rules of Unicode §3.9 / WHATWG, which Rust's from_utf8_lossy
// and JavaScript's TextDecoder also follow.
Utf8Step utf8_step(std::string_view bytes);

// Replaces each maximal invalid subpart by U+FFFD (EF BF BD), like Rust's
// String::from_utf8_lossy. Valid input is returned unchanged.
std::string utf8_lossy(std::string_view bytes);

// Appends the UTF-8 encoding of `cp` (REQUIRES: cp <= 0x10FFFF, not a surrogate).
void append_utf8(uint32_t cp, std::string* out);

}  // namespace dsi::tokenizer_internal
