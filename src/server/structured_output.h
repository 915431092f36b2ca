// StructuredOutput: the server's side of structured output (SPEC S-SO, issue 7).
// Reads what a request asks for -- Chat Completions `response_format`
// ({type: json_schema, json_schema: {name, schema, strict}} | {type: json_object}),
// Responses `text.format` ({type: json_schema, name, schema, strict} | {type:
// json_object}), and the vLLM-style extensions `guided_regex` / `guided_grammar`
// (GBNF) on Chat Completions, Completions and Responses -- compiles it through one
// grammar::CompileService (created with the server's tokenizer vocabulary) and hands
// back a GrammarMaskProvider for the engine request.
//
// The HTTP handler waits for the compile (bounded by `compile_timeout_ns`) before the
// request enters the engine; the engine's step loop never waits on a compile.
// Unsupported keywords, invalid schemas, regexes and grammars are INVALID_ARGUMENT
// (400) naming the request field and the problem.
//
// tool_choice "required" / a named tool is a grammar too (read_tool_choice below).
//
// Reasoning: a request with a grammar runs with thinking off (the prompt ends with
// the empty think block), so the mask applies to the whole output, which is the final
// answer content.
//
// Thread model: thread-safe (the CompileService is); one per server.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "grammar/compile_service.h"
#include "grammar/vocabulary.h"
#include "protocol/conversation.h"
#include "protocol/encoder.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace dsi::server {

// Which request shape the fields are read from.
enum class StructuredApi { kChatCompletions, kCompletions, kResponses };

// A grammar the request asks for, with the request field it came from (for errors).
struct StructuredRequest {
    grammar::GrammarSpec spec;
    std::string field;  // "response_format", "text.format", "guided_regex", ...
};

// The request's grammar, or nullopt when it asks for none. `body` is the parsed
// request, `raw_body` its text (re-read with member order kept when a grammar field is
// present: a schema's property order is its output order). INVALID_ARGUMENT for a
// malformed field or for more than one grammar at once.
Result<std::optional<StructuredRequest>> read_structured_request(StructuredApi api,
                                                                 const nlohmann::json& body,
                                                                 std::string_view raw_body);

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
Result<std::optional<StructuredRequest>> read_tool_choice(const protocol::Conversation& conv,
                                                          protocol::ChatEncoding encoding,
                                                          bool parallel = true);

class StructuredOutput {
public:
    // REQUIRES: tokenizer outlives this object.
    explicit StructuredOutput(const Tokenizer& tokenizer,
                              grammar::CompileServiceOptions options = {},
                              int64_t compile_timeout_ns = int64_t{10} * 1000000000);

    // Compiles (or finds cached) `req` and returns the engine mask provider. Blocks the
    // calling thread (an HTTP handler) up to the compile timeout.
    Result<std::shared_ptr<TokenMaskProvider>> provider(const StructuredRequest& req);

    grammar::CompileServiceStats stats() const { return service_.stats(); }

private:
    std::shared_ptr<const grammar::Vocabulary> vocab_;
    int64_t compile_timeout_ns_;
    grammar::CompileService service_;
};

}  // namespace dsi::server
