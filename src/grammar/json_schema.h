// JSON Schema front end (draft 2020-12) and json_object mode (SPEC S-SO). Compiles a
// schema into a grammar whose sentences are compact JSON texts (no insignificant
// whitespace unless JsonSchemaOptions::flexible_whitespace) that validate against the
// schema. Object properties come in the
// schema's declaration order (a generation choice: any order is valid JSON Schema,
// declaration order always validates; JsonSchemaOptions::any_property_order takes any
// order), optional ones may be left out, additional properties (when allowed) follow and
// never reuse a declared name.
//
// Supported: type (all, and lists), enum, const (beside other keywords: the values
// the rest accepts), properties, required, additionalProperties, patternProperties
// (undeclared keys only from the patterns; additionalProperties other than true /
// false next to it is UNIMPLEMENTED; docs/grammar.md has the exact rules), items,
// prefixItems, minItems, maxItems, minLength, maxLength, minProperties,
// maxProperties, pattern, minimum / maximum / exclusiveMinimum / exclusiveMaximum
// (exact for integers; for numbers when the bounds are integers), multipleOf (an
// integer up to 1000, no bounds beside it), anyOf, oneOf (exact when no value can match
// two branches: different types, disjoint enums, a discriminator property; a type two
// branches accept whole leaves them all, and so does a value two enums list; objects
// otherwise told apart by a property each branch forbids and the other requires: a
// sound subset), allOf and $ref beside
// other keywords (when the parts' keywords merge: additionalProperties on either side,
// enum intersections, tighter bounds; recursion included), not of simple schemas
// (type, one required name, enum / const beside an enum or plain types),
// dependentRequired / dependentSchemas / draft 4's dependencies (exact: a case per
// presence of each trigger name, up to 4 undecided names), if / then / else when the
// `if` is a conjunction of type / enum / const / required / properties conditions
// (exact: a case per condition held or failed), uniqueItems when every element that
// can occur is from a known finite set (enum, const, boolean, null; exact),
// $ref / $defs / definitions (local JSON pointers, recursion included), boolean
// schemas, and the formats date, time,
// date-time, duration, email, hostname, uuid, uri, uri-template, ipv4, ipv6 as
// assertions (other formats are annotations). Unknown keywords are ignored, as the specification
// says. Counting bounds above Limits::max_repeat are RESOURCE_EXHAUSTED naming the keyword; a
// schema nothing satisfies is INVALID_ARGUMENT ("accepts no input"). The other JSON Schema keywords
// are UNIMPLEMENTED (the server maps it to a 400 for the request) with the schema location in the
// message; invalid schemas are INVALID_ARGUMENT.
//
// Thread model: pure functions.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "grammar/grammar.h"

namespace dsi::grammar {

struct JsonSchemaOptions {
    Limits limits;
    // The formats date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid,
    // uri and uri-template are assertions (the grammar accepts a subset of each;
    // sound); false treats every format as an annotation (2020-12's default vocabulary).
    bool format_assertion = true;
    // Validation of text a user or another program wrote: integers may also be
    // spelled with a zero fraction (1.0) or a non-negative exponent (1E1, 2e+10).
    // Off for generation, where integers stay canonical (-0 is accepted either way).
    bool integer_spellings = false;
    // Validation of text a user or a model wrote: JSON's insignificant whitespace
    // (space, tab, LF, CR) wherever RFC 8259 allows it (`{"a": 1, "b": [1, 2]}`).
    // Off for generation, which stays on one line (below). Enum / const values that
    // are objects or arrays are still matched in their compact spelling only.
    bool flexible_whitespace = false;
    // Generation: one optional space after each ',' and ':' and nowhere else, so both
    // `{"a":1,"b":[1,2]}` and `{"a": 1, "b": [1, 2]}` (Python's json.dumps, the
    // spelling most training data has) are allowed and the model keeps the one it
    // was trained on -- a model forced off its spelling writes worse values (issue
    // 17: the default model's JSON answers went from 44 of 44 valid to 11 under a
    // compact-only grammar, `eval_model --grammar --compact-json`). Bounded: at most
    // one space per separator, so whitespace cannot run to max_tokens. false: compact.
    bool space_after_separators = true;
    // Validation of text a user or another program wrote: an object's declared
    // properties may come in any order (each at most once; the required ones all
    // before '}'), undeclared ones (additional / pattern properties) between them.
    // Exact, as one rule per subset of the properties written so far, for objects of
    // up to max_any_order_properties declared (and required) properties; larger
    // objects, and objects with minProperties / maxProperties, keep declaration
    // order (sound: a subset of the valid orders); the cap is at most 16. Off for
    // generation, where declaration order always validates.
    bool any_property_order = false;
    size_t max_any_order_properties = 11;
    size_t max_enum_values = 10000;
    size_t max_schema_bytes = size_t{1} << 20;
};

Result<Grammar> compile_json_schema(std::string_view schema_json,
                                    const JsonSchemaOptions& options = {});
Result<Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                    const JsonSchemaOptions& options = {});
// Any JSON value (response_format json_object; the root must be an object).
Result<Grammar> json_object_grammar(bool root_must_be_object = true);

}  // namespace dsi::grammar
