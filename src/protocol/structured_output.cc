#include "protocol/structured_output.h"

#include <set>
#include <utility>
#include <vector>

#include "protocol/prompt.h"

namespace dsi::protocol {
namespace {

using OJ = nlohmann::ordered_json;
using grammar::ExprPtr;

// A tool-call grammar travels through the CompileService as a JSON Schema spec whose
// only member is this key (the service caches and de-duplicates it like any schema);
// the compile function below recognises it. User schemas may not use the key.
constexpr const char* kToolCallsKey = "x-dsinfer-dsml-tool-calls";

// Copies `g`'s rules into `b` (names prefixed); returns a reference to its root.
ExprPtr import_grammar(const grammar::Grammar& g, grammar::GrammarBuilder* b,
                       const std::string& prefix) {
    std::vector<uint32_t> ids(g.num_rules());
    for (uint32_t r = 0; r < g.num_rules(); ++r) ids[r] = b->declare(prefix + g.rule_name(r));
    for (uint32_t r = 0; r < g.num_rules(); ++r) {
        std::vector<ExprPtr> alts;
        for (uint32_t pos : g.alternatives(r)) {
            std::vector<ExprPtr> items;
            for (; g.elements()[pos] != grammar::Grammar::kEnd; ++pos) {
                const uint32_t e = g.elements()[pos];
                const uint32_t v = grammar::Grammar::payload(e);
                items.push_back(grammar::Grammar::tag(e) == grammar::Grammar::kTagClass
                                    ? grammar::e_bytes(g.classes()[v])
                                    : grammar::e_rule(ids[v]));
            }
            alts.push_back(grammar::e_seq(std::move(items)));
        }
        b->define(ids[r], grammar::e_alt(std::move(alts)));
    }
    return grammar::e_rule(ids[g.root()]);
}

// The parameters of one invoke: items in order, required ones present, optional ones
// omissible, "\n" between present ones. head(i): nothing emitted before item i.
ExprPtr parameter_list(const std::vector<std::pair<ExprPtr, bool>>& items) {
    using namespace grammar;
    const size_t n = items.size();
    std::vector<ExprPtr> tail(n + 1), head(n + 1);
    tail[n] = e_empty();
    head[n] = e_empty();
    for (size_t i = n; i-- > 0;) {
        const auto& [item, required] = items[i];
        ExprPtr sep_item = e_seq({e_literal("\n"), item});
        tail[i] = e_seq({required ? sep_item : e_opt(sep_item), tail[i + 1]});
        ExprPtr here = e_seq({item, tail[i + 1]});
        head[i] = required ? here : e_alt({here, head[i + 1]});
    }
    return head[0];
}

Result<grammar::Grammar> tool_call_grammar(const OJ& cfg, const grammar::JsonSchemaOptions& json) {
    using namespace grammar;
    const std::string dsml(kDsmlToken);
    GrammarBuilder b(json.limits);
    std::vector<ExprPtr> invokes;
    for (const OJ& tool : cfg.at("tools")) {
        const std::string name = tool.at("name").get<std::string>();
        const OJ& params = tool.at("parameters");
        const std::string where = "function '" + name + "' parameters";
        std::set<std::string> required;
        if (auto it = params.find("required"); it != params.end() && it->is_array()) {
            for (const OJ& r : *it) {
                if (r.is_string()) required.insert(r.get<std::string>());
            }
        }
        std::vector<std::pair<ExprPtr, bool>> items;
        if (auto props = params.find("properties"); props != params.end() && props->is_object()) {
            for (const auto& [key, sub] : props->items()) {
                OJ s = sub;
                // Local references into the parameters schema's definitions still resolve.
                for (const char* defs : {"$defs", "definitions"}) {
                    if (s.is_object() && params.contains(defs) && !s.contains(defs)) {
                        s[defs] = params[defs];
                    }
                }
                auto g = compile_json_schema(s, json);
                if (!g.is_ok()) {
                    return Status(g.status().code(),
                                  where + " '" + key + "': " + g.status().message());
                }
                ExprPtr value = import_grammar(*g, &b, name + "." + key + ".");
                items.emplace_back(
                    e_seq({e_literal("<" + dsml + "parameter name=\"" + key + "\" string=\"false\">"),
                           value, e_literal("</" + dsml + "parameter>")}),
                    required.count(key) > 0);
                required.erase(key);
            }
        }
        if (!required.empty()) {
            return invalid_argument(where + ": required '" + *required.begin() +
                                    "' is not in properties");
        }
        invokes.push_back(e_seq({e_literal("<" + dsml + "invoke name=\"" + name + "\">\n"),
                                 parameter_list(items),
                                 e_literal("\n</" + dsml + "invoke>")}));
    }
    const std::string block = cfg.at("block").get<std::string>();
    ExprPtr invoke = e_alt(std::move(invokes));
    ExprPtr more = cfg.at("single").get<bool>() ? e_empty() : e_star(e_seq({e_literal("\n"), invoke}));
    const uint32_t root = b.declare("root");
    // "\n\n" first: the output parser (and the encoder) put it before the block.
    b.define(root, e_seq({e_literal("\n\n<" + dsml + block + ">\n"), invoke, more,
                          e_literal("\n</" + dsml + block + ">")}));
    return b.build(root);
}

}  // namespace

Result<grammar::Grammar> compile_request_grammar(const grammar::GrammarSpec& spec,
                                                 const grammar::JsonSchemaOptions& json) {
    if (spec.kind == grammar::GrammarKind::kJsonSchema &&
        spec.text.find(kToolCallsKey) != std::string::npos) {
        const OJ j = OJ::parse(spec.text, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && j.size() == 1 && j.contains(kToolCallsKey)) {
            return tool_call_grammar(j[kToolCallsKey], json);
        }
    }
    return grammar::compile_grammar(spec, json);
}

namespace {

// dsinfer's JSON options (issue 21), booleans beside `schema` (json_object: in the
// format object): `flexible_whitespace` (JSON's insignificant whitespace accepted
// anywhere JSON allows it) and `any_property_order` (an object's properties in any
// order); both off by default, so output stays compact and in the schema's order.
// `where`: the holder's field path, for errors.
Status read_json_options(const OJ& holder, const std::string& where, grammar::GrammarSpec* spec) {
    for (auto [key, flag] : {std::pair{"flexible_whitespace", &spec->flexible_whitespace},
                             std::pair{"any_property_order", &spec->any_property_order}}) {
        auto it = holder.find(key);
        if (it == holder.end() || it->is_null()) continue;
        if (!it->is_boolean()) return invalid_argument(where + "." + key + ": expected a boolean");
        *flag = it->get<bool>();
    }
    return Status::ok();
}

// {"type": "json_schema", ...schema...} | {"type": "json_object"} | {"type": "text"};
// `schema_holder` is the object holding `schema` (Chat: json_schema, Responses: the
// format itself). `json_schema_only`: Anthropic's output_config.format, whose only
// type is json_schema.
Result<std::optional<StructuredRequest>> read_format(const OJ& f, const std::string& field,
                                                     bool chat, bool json_schema_only = false) {
    if (!f.is_object()) return invalid_argument(field + ": expected an object");
    auto type = f.find("type");
    if (type == f.end() || !type->is_string()) {
        return invalid_argument(field + ".type: required string");
    }
    const std::string t = type->get<std::string>();
    if (json_schema_only && t != "json_schema") {
        return invalid_argument(field + ".type: unknown type '" + t + "' (expected 'json_schema')");
    }
    if (t == "text") return std::optional<StructuredRequest>();
    StructuredRequest r;
    r.field = field;
    if (t == "json_object") {
        r.spec.kind = grammar::GrammarKind::kJsonObject;
        DSI_RETURN_IF_ERROR(read_json_options(f, field, &r.spec));
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
    DSI_RETURN_IF_ERROR(read_json_options(*holder, r.field, &r.spec));
    r.field += ".schema";
    if (schema->is_object() && schema->contains(kToolCallsKey)) {
        return invalid_argument(r.field + ": '" + kToolCallsKey + "' is reserved");
    }
    r.spec.kind = grammar::GrammarKind::kJsonSchema;
    r.spec.text = schema->dump();
    return std::optional<StructuredRequest>(std::move(r));
}

}  // namespace

Result<std::optional<StructuredRequest>> read_structured_request(ApiProtocol api,
                                                                 const OrderedJson& j) {
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
    if (api == ApiProtocol::kMessages) {
        // Anthropic's structured outputs: output_config.format {type: json_schema, schema}.
        if (auto oc = j.find("output_config"); oc != j.end() && oc->is_object()) {
            if (auto f = oc->find("format"); f != oc->end() && !f->is_null()) {
                DSI_ASSIGN_OR_RETURN(auto r, read_format(*f, "output_config.format", /*chat=*/false,
                                                         /*json_schema_only=*/true));
                DSI_RETURN_IF_ERROR(take(std::move(r)));
            }
        }
        return out;
    }
    if (api == ApiProtocol::kChatCompletions) {
        if (auto it = j.find("response_format"); it != j.end() && !it->is_null()) {
            DSI_ASSIGN_OR_RETURN(auto r, read_format(*it, "response_format", /*chat=*/true));
            DSI_RETURN_IF_ERROR(take(std::move(r)));
        }
    } else if (api == ApiProtocol::kResponses) {
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

Result<std::optional<StructuredRequest>> read_tool_choice(const Conversation& conv,
                                                          ChatEncoding encoding, bool parallel) {
    if (conv.tool_choice == "auto" || conv.tool_choice == "none") {
        return std::optional<StructuredRequest>();
    }
    const std::string what = "tool_choice: '" + conv.tool_choice + "'";
    if (conv.tools.empty()) return invalid_argument(what + " needs tools");
    if (encoding == ChatEncoding::kDeepSeekV3Template) {
        return invalid_argument(what + " is not supported with the V3 chat template (no DSML)");
    }
    const bool named = conv.tool_choice != "required";
    OJ tools = OJ::array();
    for (const Tool& t : conv.tools) {
        if (named && t.name() != conv.tool_choice) continue;
        OJ params = OJ{{"type", "object"}};
        if (auto it = t.function.find("parameters"); it != t.function.end() && !it->is_null()) {
            params = *it;
        }
        if (!params.is_object() ||
            (params.contains("type") && params["type"] != OJ("object"))) {
            return invalid_argument("tools: function '" + t.name() +
                                    "' parameters: expected an object schema");
        }
        tools.push_back(OJ{{"name", t.name()}, {"parameters", std::move(params)}});
    }
    if (tools.empty()) return invalid_argument(what + " names no tool in tools");
    const char* block =
        encoding == ChatEncoding::kDeepSeekV4 ? "tool_calls" : "function_calls";
    StructuredRequest r;
    r.field = "tool_choice";
    r.spec.kind = grammar::GrammarKind::kJsonSchema;
    r.spec.text =
        OJ{{kToolCallsKey, OJ{{"block", block}, {"single", named || !parallel}, {"tools", std::move(tools)}}}}
            .dump();
    return std::optional<StructuredRequest>(std::move(r));
}

}  // namespace dsi::protocol
