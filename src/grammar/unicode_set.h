// Code-point sets and their spellings as byte-level grammar expressions: raw UTF-8
// (regex and EBNF front ends) or the characters of a JSON string literal (JSON
// Schema front end). Thread model: pure functions and value types.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace dsi::grammar {

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// A set of Unicode scalar values as sorted, disjoint, non-adjacent closed ranges.
class CodepointSet {
public:
    CodepointSet() = default;
    static CodepointSet all();  // every scalar value (surrogates excluded)
    void add(uint32_t lo, uint32_t hi);
    void add(const CodepointSet& other);
    CodepointSet complement() const;
    CodepointSet minus(const CodepointSet& other) const;
    bool contains(uint32_t cp) const;
    bool empty() const { return ranges_.empty(); }
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

private:
    void normalize();
    std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

// How a code-point set is spelled in bytes.
enum class CharEncoding : uint8_t {
    kUtf8,        // raw UTF-8
    kJsonString,  // a character inside a JSON string literal, as a compact JSON
                  // serialiser writes it: '"' -> \", '\' -> \\, controls -> \n, \t,
                  // \b, \f, \r or \u00xx; everything else raw UTF-8
};

// One character of `set`; e_fail() when the set is empty. Surrogates are skipped.
ExprPtr codepoints_expr(const CodepointSet& set, CharEncoding encoding);
// Any single character of a JSON string, with every escape JSON allows
// (\" \\ \/ \b \f \n \r \t \uXXXX except lone surrogates) plus raw UTF-8.
ExprPtr json_string_char_any();
// The UTF-8 bytes of `cp`.
std::string utf8_encode(uint32_t cp);

}  // namespace dsi::grammar
