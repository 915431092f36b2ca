// Structured output as a request asks for it (SPEC S-SO, issue 7): which grammar a
// request wants -- Chat Completions `response_format` ({type: json_schema,
// json_schema: {name, schema, strict}} | {type: json_object}), Responses `text.format`
// ({type: json_schema, name, schema, strict} | {type: json_object}), the vLLM-style
// `guided_regex` / `guided_grammar` (GBNF) on Chat Completions, Completions and
// Responses, Anthropic Messages `output_config.format` ({type: json_schema, schema}),
// and tool_choice "required" / a named tool (a DSML tool-call grammar) -- and the
// compile function that turns such a spec into a grammar. Compiling and
// waiting for it is the server's (server/structured_output.h); parse_api_request()
// (request.h) calls the readers once per request.
//
// Reasoning: a request with a grammar runs with thinking off (the prompt ends with the
// empty think block), so the mask applies to the whole output, the final answer.
//
// Thread model: pure functions.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"
#include "grammar/compile_service.h"
#include "protocol/adapters.h"
#include "protocol/conversation.h"
#include "protocol/encoder.h"

namespace dsi::protocol {

// A grammar the request asks for, with the request field it came from (for errors).
struct StructuredRequest {
    grammar::GrammarSpec spec;
    std::string field;  // "response_format", "text.format", "guided_regex", "tool_choice"
};

// dsinfer's JSON options, booleans next to `schema` (Chat: response_format.json_schema;
// Responses: text.format; Anthropic: output_config.format; json_object: the format
// object): `flexible_whitespace` and `any_property_order` (grammar::JsonSchemaOptions;
// off by default: compact output in the schema's property order), carried in the spec.
//
// The request's grammar field, or nullopt when it asks for none. `body`: the parsed
// request (member order kept: a schema's property order is its output order).
// INVALID_ARGUMENT for a malformed field or for more than one grammar at once.
Result<std::optional<StructuredRequest>> read_structured_request(ApiProtocol api,
                                                                 const OrderedJson& body);

// tool_choice "required" (Anthropic: {type: any}) or a named function: a grammar for
// one DSML tool-call block (`function_calls` in V3.2, `tool_calls` in V4) holding one
// or more invokes of any tool ("required") or exactly one invoke of the named tool.
// Each invoke carries the declared parameters of the tool's `parameters` schema in
// declaration order (required ones always, optional ones omissible; no undeclared
// ones), every value written string="false" as compact JSON that the property's
// schema accepts (a string is a JSON string literal, which the output parser passes
// through). nullopt for "auto" / "none". INVALID_ARGUMENT without tools, with the V3
// template encoding (no DSML), or for a parameters schema that is not an object
// schema; errors in a property's schema surface at compile time naming the function
// and parameter.
// `parallel`: false (parallel_tool_calls: false) allows one invoke for "required" too.
Result<std::optional<StructuredRequest>> read_tool_choice(const Conversation& conv,
                                                          ChatEncoding encoding,
                                                          bool parallel = true);

// The grammar::CompileService compile function for request specs: the tool-call
// grammars of read_tool_choice(), everything else as grammar::compile_grammar().
Result<grammar::Grammar> compile_request_grammar(const grammar::GrammarSpec& spec,
                                                 const grammar::JsonSchemaOptions& json);

}  // namespace dsi::protocol
