// Regex front end: the ECMAScript regular-expression subset that JSON Schema
// `pattern` uses (docs/grammar.md lists it): alternation, groups (capturing,
// (?:...), named), quantifiers (* + ? {n} {n,} {n,m}, lazy forms), classes with
// ranges and negation, escapes (\d \w \s and negations, \t \n \r \f \v \0, \cX, \xHH,
// \uHHHH incl. surrogate pairs, \u{...}, identity escapes), '.', and the anchors
// ^ / $ at the ends of top-level alternatives. Back-references, lookaround, \b,
// \p{...} and anchors elsewhere are UNIMPLEMENTED with the offset in the message.
//
// Thread model: pure function.
#pragma once

#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"
#include "grammar/unicode_set.h"

namespace dsi::grammar {

enum class RegexMatch : uint8_t {
    kFull,    // the whole input must match (response_format regex); ^ and $ optional
    kSearch,  // ECMAScript search semantics (JSON Schema `pattern`): a match anywhere
              // unless anchored by ^ / $
};

// Compiles `pattern` into an expression over the characters' encodings.
// REQUIRES: `builder` outlives the returned expression's use (no rules are
// declared today, but callers must build with the same builder).
Result<ExprPtr> compile_regex(std::string_view pattern, RegexMatch match,
                              CharEncoding encoding, const Limits& limits);

// Whether `e` can match the empty string (rules are treated as non-nullable).
bool expr_nullable(const Expr& e);

}  // namespace dsi::grammar
