// JSON Schema front end (draft 2020-12) and json_object mode (SPEC S-SO). Compiles a
// schema into a grammar whose sentences are compact JSON texts (no insignificant
// whitespace) that validate against the schema. Object properties come in the
// schema's declaration order (a generation choice: any order is valid JSON Schema,
// declaration order always validates), optional ones may be left out, additional properties
// (when allowed) follow and never reuse a declared name.
//
// Supported: type (all, and lists), enum, const, properties, required,
// additionalProperties, patternProperties (undeclared keys only from the
// patterns; additionalProperties other than true / false next to it is
// UNIMPLEMENTED; docs/grammar.md has the exact rules), items, prefixItems, minItems, maxItems, minLength,
// maxLength, pattern, minimum / maximum / exclusiveMinimum / exclusiveMaximum
// (exact for integers; for numbers when the bounds are integers), anyOf, oneOf
// (when the branches admit disjoint JSON types), allOf (when the branches'
// keywords merge without conflict), $ref / $defs / definitions (local JSON
// pointers, recursion included), boolean schemas, and the formats date, time,
// date-time, email, uuid, uri, ipv4, ipv6 (other formats are annotations, as the
// 2020-12 format-annotation vocabulary says). Annotation keywords are ignored.
// Every other JSON Schema keyword is UNIMPLEMENTED (HTTP 501 -> the server maps it
// to a 400 for the request) with the schema location in the message; invalid
// schemas are INVALID_ARGUMENT.
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
