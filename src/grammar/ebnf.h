// EBNF front end: GBNF-compatible grammars (the llama.cpp dialect; docs/grammar.md):
//
//   root  ::= "{" ws pair ("," ws pair)* "}"     # rules: name ::= alternatives
//   pair  ::= [a-z]+ ":" ws value                 # classes: [a-z], [^"\\], escapes
//   value ::= "yes" | "no" | [0-9]{1,3}           # | ( ) * + ? {m} {m,} {m,n} .
//   ws    ::= [ \t\n]*
//
// Names are [A-Za-z0-9_-]+; a rule ends where the next `name ::=` starts. String
// literals and classes take \n \r \t \\ \" \' \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH and
// UTF-8 text. The start rule is `root`. Errors name the line and column.
//
// Thread model: pure function.
#pragma once

#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace dsi::grammar {

Result<Grammar> compile_ebnf(std::string_view text, const Limits& limits = {});

}  // namespace dsi::grammar
