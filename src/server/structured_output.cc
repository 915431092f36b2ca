#include "server/structured_output.h"

#include <utility>

#include "grammar/mask_provider.h"

namespace dsi::server {
namespace {

using OJ = nlohmann::ordered_json;

// {"type": "json_schema", ...schema...} | {"type": "json_object"} | {"type": "text"};
// `schema_holder` is the object holding `schema` (Chat: json_schema, Responses: the
// format itself).
Result<std::optional<StructuredRequest>> read_format(const OJ& f, const std::string& field,
                                                     bool chat) {
    if (!f.is_object()) return invalid_argument(field + ": expected an object");
    auto type = f.find("type");
    if (type == f.end() || !type->is_string()) {
        return invalid_argument(field + ".type: required string");
    }
    const std::string t = type->get<std::string>();
    if (t == "text") return std::optional<StructuredRequest>();
    StructuredRequest r;
    r.field = field;
    if (t == "json_object") {
        r.spec.kind = grammar::GrammarKind::kJsonObject;
        return std::optional<StructuredRequest>(std::move(r));
    }
    if (t != "json_schema") return invalid_argument(field + ".type: unknown type '" + t + "'");
    const OJ* holder = &f;
    if (chat) {
        auto js = f.find("json_schema");
        if (js == f.end() || !js->is_object()) {
            return invalid_argument(field + ".json_schema: required object");
        }
        holder = &*js;
        r.field += ".json_schema";
    }
    auto schema = holder->find("schema");
    if (schema == holder->end() || !(schema->is_object() || schema->is_boolean())) {
        return invalid_argument(r.field + ".schema: required object");
    }
    if (auto strict = holder->find("strict");
        strict != holder->end() && !strict->is_null() && !strict->is_boolean()) {
        return invalid_argument(r.field + ".strict: expected a boolean");
    }
    r.field += ".schema";
    r.spec.kind = grammar::GrammarKind::kJsonSchema;
    r.spec.text = schema->dump();
    return std::optional<StructuredRequest>(std::move(r));
}

}  // namespace

Result<std::optional<StructuredRequest>> read_structured_request(StructuredApi api,
                                                                 const nlohmann::json& body,
                                                                 std::string_view raw_body) {
    const bool has_format = api == StructuredApi::kChatCompletions
                                ? body.contains("response_format")
                                : api == StructuredApi::kResponses && body.contains("text");
    if (!has_format && !body.contains("guided_regex") && !body.contains("guided_grammar")) {
        return std::optional<StructuredRequest>();
    }
    // Ordered: a schema's property order is its output order.
    const OJ j = OJ::parse(raw_body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("body: not a JSON object");
    std::optional<StructuredRequest> out;
    auto take = [&](std::optional<StructuredRequest> r) -> Status {
        if (!r) return Status::ok();
        if (out) {
            return invalid_argument(r->field + ": only one of response_format / text.format, "
                                    "guided_regex and guided_grammar may be given (also " +
                                    out->field + ")");
        }
        out = std::move(r);
        return Status::ok();
    };
    if (api == StructuredApi::kChatCompletions) {
        if (auto it = j.find("response_format"); it != j.end() && !it->is_null()) {
            DSI_ASSIGN_OR_RETURN(auto r, read_format(*it, "response_format", /*chat=*/true));
            DSI_RETURN_IF_ERROR(take(std::move(r)));
        }
    } else if (api == StructuredApi::kResponses) {
        if (auto it = j.find("text"); it != j.end() && it->is_object()) {
            if (auto f = it->find("format"); f != it->end() && !f->is_null()) {
                DSI_ASSIGN_OR_RETURN(auto r, read_format(*f, "text.format", /*chat=*/false));
                DSI_RETURN_IF_ERROR(take(std::move(r)));
            }
        }
    }
    for (auto [key, kind] : {std::pair{"guided_regex", grammar::GrammarKind::kRegex},
                             std::pair{"guided_grammar", grammar::GrammarKind::kEbnf}}) {
        auto it = j.find(key);
        if (it == j.end() || it->is_null()) continue;
        if (!it->is_string()) return invalid_argument(std::string(key) + ": expected a string");
        StructuredRequest r;
        r.field = key;
        r.spec.kind = kind;
        r.spec.text = it->get<std::string>();
        DSI_RETURN_IF_ERROR(take(std::move(r)));
    }
    return out;
}

StructuredOutput::StructuredOutput(const Tokenizer& tokenizer,
                                   grammar::CompileServiceOptions options,
                                   int64_t compile_timeout_ns)
    : vocab_(grammar::Vocabulary::from_tokenizer(tokenizer)),
      compile_timeout_ns_(compile_timeout_ns),
      service_(std::move(options)) {}

Result<std::shared_ptr<TokenMaskProvider>> StructuredOutput::provider(
    const StructuredRequest& req) {
    auto field_error = [&](const Status& s) {
        return invalid_argument(req.field + ": " + s.message());
    };
    auto handle = service_.submit(req.spec, vocab_);
    if (!handle.is_ok()) {
        if (handle.status().code() == StatusCode::kInvalidArgument) {
            return field_error(handle.status());
        }
        return handle.status();
    }
    grammar::CompileResult r = (*handle)->wait_for(compile_timeout_ns_);
    if (!r.is_ok()) {
        switch (r.status().code()) {
            case StatusCode::kInvalidArgument:
            case StatusCode::kUnimplemented:
            case StatusCode::kOutOfRange:
            case StatusCode::kResourceExhausted:  // a grammar over the size limits
                // Compile errors are about the request's grammar: a 400 naming it.
                // (A full queue is rejected at submit, above.)
                return field_error(r.status());
            case StatusCode::kUnavailable:
                return deadline_exceeded(req.field + ": grammar compile took longer than " +
                                         std::to_string(compile_timeout_ns_ / 1000000) + " ms");
            default:
                return r.status();
        }
    }
    return std::shared_ptr<TokenMaskProvider>(
        std::make_shared<grammar::GrammarMaskProvider>(std::move(r).value()));
}

}  // namespace dsi::server
