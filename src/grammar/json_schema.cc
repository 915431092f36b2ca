#include "grammar/json_schema.h"

#include "grammar/internal/schema_compiler.h"

namespace dsi::grammar {
namespace internal {

const std::set<std::string>& constraint_keywords() {
    static const std::set<std::string> k = {"type",
                                            "enum",
                                            "const",
                                            "properties",
                                            "required",
                                            "additionalProperties",
                                            "patternProperties",
                                            "items",
                                            "prefixItems",
                                            "additionalItems",
                                            "minItems",
                                            "maxItems",
                                            "uniqueItems",
                                            "contains",
                                            "minContains",
                                            "maxContains",
                                            "minLength",
                                            "maxLength",
                                            "pattern",
                                            "format",
                                            "minimum",
                                            "maximum",
                                            "exclusiveMinimum",
                                            "exclusiveMaximum",
                                            "multipleOf",
                                            "anyOf",
                                            "oneOf",
                                            "allOf",
                                            "not",
                                            "if",
                                            "$ref",
                                            "$dynamicRef",
                                            "$recursiveRef",
                                            "dependentRequired",
                                            "dependentSchemas",
                                            "dependencies",
                                            "propertyNames",
                                            "minProperties",
                                            "maxProperties",
                                            "unevaluatedItems",
                                            "unevaluatedProperties"};
    return k;
}

const std::set<std::string>& unsupported_keywords() {
    static const std::set<std::string> k = {
        "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contains",
        "minContains",   "maxContains",      "$dynamicRef",           "$recursiveRef"};
    return k;
}

std::string escape_pointer(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '~') {
            out += "~0";
        } else if (c == '/') {
            out += "~1";
        } else {
            out += c;
        }
    }
    return out;
}

std::string type_of(const json& v) {
    switch (v.type()) {
        case json::value_t::null:
            return "null";
        case json::value_t::boolean:
            return "boolean";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned:
            return "integer";
        case json::value_t::number_float: {
            double d = v.get<double>();
            return std::floor(d) == d && std::isfinite(d) ? "integer" : "number";
        }
        case json::value_t::string:
            return "string";
        case json::value_t::array:
            return "array";
        case json::value_t::object:
            return "object";
        default:
            return "unknown";
    }
}

std::set<std::string> type_names(const json& t) {
    std::set<std::string> out;
    if (t.is_string()) out.insert(t.get<std::string>());
    if (t.is_array()) {
        for (const auto& x : t) {
            if (x.is_string()) out.insert(x.get<std::string>());
        }
    }
    return out;
}

bool json_equal(const json& a, const json& b) {
    if (a.is_structured() || b.is_structured()) {
        const auto dump = [](const json& x) {
            return x.dump(-1, ' ', false, json::error_handler_t::replace);
        };
        return nlohmann::json::parse(dump(a)) == nlohmann::json::parse(dump(b));
    }
    return a == b;
}

ExprPtr same_length_range(const std::string& x, const std::string& y) {
    auto digit_range = [](char a, char b) {
        ByteSet s;
        s.set_range(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
        return e_bytes(s);
    };
    if (x.size() == 1) return digit_range(x[0], y[0]);
    if (x[0] == y[0])
        return e_seq(
            {e_byte(static_cast<uint8_t>(x[0])), same_length_range(x.substr(1), y.substr(1))});
    size_t n = x.size() - 1;
    std::vector<ExprPtr> alts;
    alts.push_back(e_seq(
        {e_byte(static_cast<uint8_t>(x[0])), same_length_range(x.substr(1), std::string(n, '9'))}));
    if (y[0] - x[0] > 1) {
        alts.push_back(e_seq(
            {digit_range(static_cast<char>(x[0] + 1), static_cast<char>(y[0] - 1)),
             e_repeat(digit_range('0', '9'), static_cast<uint32_t>(n), static_cast<uint32_t>(n))}));
    }
    alts.push_back(e_seq(
        {e_byte(static_cast<uint8_t>(y[0])), same_length_range(std::string(n, '0'), y.substr(1))}));
    return e_alt(std::move(alts));
}

ExprPtr natural_range(uint64_t a, int64_t b) {
    std::string as = std::to_string(a);
    std::vector<ExprPtr> alts;
    ByteSet digit, nonzero;
    digit.set_range('0', '9');
    nonzero.set_range('1', '9');
    if (b >= 0 && static_cast<uint64_t>(b) < a) return e_fail();
    std::string bs = b >= 0 ? std::to_string(b) : std::string();
    size_t max_len = b >= 0 ? bs.size() : as.size();
    for (size_t len = as.size(); len <= max_len; ++len) {
        std::string lo = len == as.size() ? as : "1" + std::string(len - 1, '0');
        if (len == 1 && len != as.size()) lo = "0";
        std::string hi = (b >= 0 && len == bs.size()) ? bs : std::string(len, '9');
        if (len == 1 && a == 0) lo = "0";
        alts.push_back(same_length_range(lo, hi));
    }
    if (b < 0) {
        // Every number longer than a.
        alts.push_back(
            e_seq({e_bytes(nonzero),
                   e_repeat(e_bytes(digit), static_cast<uint32_t>(as.size()), kUnbounded)}));
    }
    return e_alt(std::move(alts));
}

Result<Grammar> SchemaCompiler::run_on(const json& schema, const std::string& where) {
    uint32_t root_rule = builder_.declare("root");
    DSI_ASSIGN_OR_RETURN(ExprPtr body, compile(schema, where, 0));
    if (options_.flexible_whitespace) body = e_seq({whitespace(), body, whitespace()});
    builder_.define(root_rule, body);
    while (!pending_refs_.empty()) {
        auto [pointer, id] = pending_refs_.back();
        pending_refs_.pop_back();
        DSI_ASSIGN_OR_RETURN(const json* target, resolve(pointer));
        DSI_ASSIGN_OR_RETURN(ExprPtr b, compile(*target, pointer.substr(1), 0));
        builder_.define(id, b);
    }
    return builder_.build(root_rule);
}

ExprPtr SchemaCompiler::value_rule() {
    if (value_rule_ != kNoRule) return e_rule(value_rule_);
    value_rule_ = builder_.declare("json_value");
    uint32_t obj = builder_.declare("json_object");
    uint32_t arr = builder_.declare("json_array");
    ExprPtr v = e_rule(value_rule_);
    ExprPtr s = string_any();
    builder_.define(obj, e_seq({open_char('{'),
                                e_opt(e_seq({s, sep_char(':'), v,
                                             e_star(e_seq({sep_char(','), s, sep_char(':'), v}))})),
                                close_char('}')}));
    builder_.define(arr,
                    e_seq({open_char('['), e_opt(e_seq({v, e_star(e_seq({sep_char(','), v}))})),
                           close_char(']')}));
    builder_.define(value_rule_, e_alt({e_rule(obj), e_rule(arr), s, number_any(),
                                        e_literal("true"), e_literal("false"), e_literal("null")}));
    return v;
}

ExprPtr SchemaCompiler::string_any() {
    if (string_rule_ == kNoRule) {
        string_rule_ = builder_.declare("json_string");
        builder_.define(string_rule_, e_seq({e_byte('"'), string_tail()}));
    }
    return e_rule(string_rule_);
}

ExprPtr SchemaCompiler::string_tail() {
    if (string_tail_rule_ == kNoRule) {
        string_tail_rule_ = builder_.declare("json_string_tail");
        builder_.define(string_tail_rule_, e_seq({e_star(json_string_char_any()), e_byte('"')}));
    }
    return e_rule(string_tail_rule_);
}

ExprPtr SchemaCompiler::integer_any() {
    if (!options_.integer_spellings) return integer_digits();
    ByteSet e, d;
    e.set('e');
    e.set('E');
    d.set_range('0', '9');
    return e_seq({integer_digits(), zero_fraction(),
                  e_opt(e_seq({e_bytes(e), e_opt(e_byte('+')), e_repeat(e_bytes(d), 1, 2)}))});
}

ExprPtr SchemaCompiler::number_any() {
    if (number_rule_ == kNoRule) {
        number_rule_ = builder_.declare("json_number");
        ByteSet e, pm;
        e.set('e');
        e.set('E');
        pm.set('+');
        pm.set('-');
        builder_.define(number_rule_,
                        e_seq({integer_digits(), e_opt(e_seq({e_byte('.'), digits_expr(1)})),
                               e_opt(e_seq({e_bytes(e), e_opt(e_bytes(pm)), digits_expr(1)}))}));
    }
    return e_rule(number_rule_);
}

Result<const json*> SchemaCompiler::resolve(const std::string& ref) {
    if (ref.empty() || ref[0] != '#') return static_cast<const json*>(nullptr);
    const json* cur = &root_;
    std::string p = ref.substr(1);
    size_t i = 0;
    if (p.empty()) return cur;
    if (p[0] != '/') return static_cast<const json*>(nullptr);
    while (i < p.size()) {
        size_t j = p.find('/', i + 1);
        std::string tok = p.substr(i + 1, (j == std::string::npos ? p.size() : j) - i - 1);
        std::string dec;
        for (size_t k = 0; k < tok.size(); ++k) {
            if (tok[k] == '~' && k + 1 < tok.size()) {
                dec += tok[k + 1] == '1' ? '/' : '~';
                ++k;
            } else if (tok[k] == '%' && k + 2 < tok.size()) {
                dec += static_cast<char>(std::stoi(tok.substr(k + 1, 2), nullptr, 16));
                k += 2;
            } else {
                dec += tok[k];
            }
        }
        if (cur->is_object() && cur->contains(dec)) {
            cur = &(*cur)[dec];
        } else if (cur->is_array() && !dec.empty() &&
                   dec.find_first_not_of("0123456789") == std::string::npos &&
                   std::stoul(dec) < cur->size()) {
            cur = &(*cur)[std::stoul(dec)];
        } else {
            return static_cast<const json*>(nullptr);
        }
        if (j == std::string::npos) break;
        i = j;
    }
    return cur;
}

Result<ExprPtr> SchemaCompiler::ref_expr(const std::string& ref, const std::string& where) {
    if (ref.empty() || ref[0] != '#' || (ref.size() > 1 && ref[1] != '/')) {
        return unsupported(where, "$ref '" + ref + "' (only local JSON pointers)");
    }
    DSI_ASSIGN_OR_RETURN(const json* target, resolve(ref));
    if (target == nullptr) return bad(where, "$ref '" + ref + "' does not resolve");
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return e_rule(it->second);
    uint32_t id = builder_.declare("ref:" + ref);
    ref_rules_.emplace(ref, id);
    pending_refs_.push_back({ref, id});
    return e_rule(id);
}

void SchemaCompiler::close_over(json* side, const json& other, const json& x) {
    if (x == true || !side->contains("properties") || !(*side)["properties"].is_object()) {
        return;
    }
    const bool other_has = other.contains("properties") && other["properties"].is_object();
    for (auto p = (*side)["properties"].begin(); p != (*side)["properties"].end(); ++p) {
        if (other_has && other["properties"].contains(p.key())) continue;
        p.value() = x == false ? json(false) : json{{"allOf", json::array({x, p.value()})}};
    }
}

bool SchemaCompiler::merge_into(json* a, const json& b_in) {
    if (b_in.is_boolean()) return b_in.get<bool>();
    if (!b_in.is_object()) return false;
    json b = b_in;
    const bool any_patterns = a->contains("patternProperties") || b.contains("patternProperties");
    if (!any_patterns &&
        (a->contains("additionalProperties") || b.contains("additionalProperties"))) {
        // Each side's additionalProperties X applies to the members its own
        // `properties` do not declare: a member only the other side declares must
        // hold X too, an undeclared member both X's. Exact (issue 21: GitHub's allOf
        // of a closed object and more properties, or of two closed objects).
        const json xa = a->value("additionalProperties", json(true));
        const json xb = b.value("additionalProperties", json(true));
        close_over(&b, *a, xa);
        close_over(a, b, xb);
        json both = json{{"allOf", json::array({xa, xb})}};
        if (xa == true || xb == false) {
            both = xb;
        } else if (xb == true || xa == false || xa == xb) {
            both = xa;
        }
        (*a)["additionalProperties"] = both;
        b["additionalProperties"] = both;
    }
    // With patternProperties, additionalProperties reads only its own schema's
    // properties and patterns, items only its own prefixItems: merging them across
    // schemas would change their meaning.
    for (auto [dep, on] : {std::pair{"additionalProperties", "properties"},
                           std::pair{"additionalProperties", "patternProperties"},
                           std::pair{"items", "prefixItems"}}) {
        const bool folded = std::string(dep) == "additionalProperties" && !any_patterns;
        if (folded) continue;
        if ((b.contains(dep) && a->contains(on)) || (a->contains(dep) && b.contains(on))) {
            return false;
        }
    }
    if (b.contains("if")) {
        // `then` / `else` are read through `if` only: they travel with it. Two
        // different conditions would need their product (not merged).
        auto part = [](const json& x, const char* k) { return x.value(k, json(true)); };
        if (a->contains("if") && ((*a)["if"] != b["if"] || part(*a, "then") != part(b, "then") ||
                                  part(*a, "else") != part(b, "else"))) {
            return false;
        }
        for (const char* k : {"if", "then", "else"}) {
            if (b.contains(k)) (*a)[k] = b[k];
        }
    }
    for (auto it = b.begin(); it != b.end(); ++it) {
        const std::string& k = it.key();
        if (!is_constraint(k) || k == "if") continue;
        if (!a->contains(k)) {
            (*a)[k] = it.value();
            continue;
        }
        json& av = (*a)[k];
        if (av == it.value()) continue;
        if (k == "required" && av.is_array() && it.value().is_array()) {
            for (const auto& r : it.value()) {
                if (std::find(av.begin(), av.end(), r) == av.end()) av.push_back(r);
            }
            continue;
        }
        if (k == "enum" && av.is_array() && it.value().is_array()) {
            // Both enums hold: the values in both (issue 21: GitHub's webhook
            // payloads narrow a `state` enum to the event's value through allOf).
            json kept = json::array();
            for (const auto& v : av) {
                if (std::find(it.value().begin(), it.value().end(), v) != it.value().end()) {
                    kept.push_back(v);
                }
            }
            av = kept;
            continue;
        }
        if (k == "const") {
            // Two different consts: nothing satisfies both (compile_enum keeps the
            // const only when it is in the enum).
            (*a)["enum"] = json::array();
            continue;
        }
        if (is_lower_bound(k) && av.is_number() && it.value().is_number()) {
            if (it.value() > av) av = it.value();
            continue;
        }
        if (is_upper_bound(k) && av.is_number() && it.value().is_number()) {
            if (it.value() < av) av = it.value();
            continue;
        }
        if (k == "items" && !a->contains("prefixItems") && !b.contains("prefixItems")) {
            // Every element must hold both.
            av = json{{"allOf", json::array({av, it.value()})}};
            continue;
        }
        if (k == "properties" && av.is_object() && it.value().is_object()) {
            for (auto p = it.value().begin(); p != it.value().end(); ++p) {
                // Both schemas' `properties` apply to the member: its value must
                // hold both (exact; issue 21: GitHub's allOf parts restate a
                // property with another description or a narrower schema).
                if (av.contains(p.key()) && av[p.key()] != p.value()) {
                    av[p.key()] = json{{"allOf", json::array({av[p.key()], p.value()})}};
                } else {
                    av[p.key()] = p.value();
                }
            }
            continue;
        }
        if (k == "type") {
            auto as_set = [](const json& t) {
                std::set<std::string> s = type_names(t);
                if (s.count("number")) s.insert("integer");
                return s;
            };
            auto sa = as_set(av), sb = as_set(it.value());
            json out = json::array();
            for (const auto& t : sa) {
                if (sb.count(t)) out.push_back(t);
            }
            // number & integer -> integer: sets above already hold "integer".
            if (sa.count("number") && sb.count("number")) {
                out.erase(std::remove(out.begin(), out.end(), json("integer")), out.end());
            }
            av = out;
            continue;
        }
        return false;
    }
    return true;
}

Result<ExprPtr> SchemaCompiler::compile(const json& s, const std::string& where, int depth) {
    if (depth > options_.limits.max_nesting) {
        return resource_exhausted("JSON schema at '#" + where + "': nested deeper than " +
                                  std::to_string(options_.limits.max_nesting));
    }
    if (s.is_boolean()) return s.get<bool>() ? value_rule() : e_fail();
    if (!s.is_object()) return bad(where, "a schema must be an object or a boolean");
    if (s.contains("not")) {
        DSI_ASSIGN_OR_RETURN(std::optional<ExprPtr> e, compile_not(s, where, depth));
        if (e.has_value()) return *e;
    }
    for (auto it = s.begin(); it != s.end(); ++it) {
        if (unsupported_keywords().count(it.key())) {
            return unsupported(where, "keyword '" + it.key() + "'");
        }
    }
    if (s.contains("$ref")) {
        if (!s["$ref"].is_string()) return bad(where, "$ref must be a string");
        bool trivial = true;
        for (auto it = s.begin(); it != s.end(); ++it) {
            trivial = trivial && (it.key() == "$ref" || !is_constraint(it.key()));
        }
        if (trivial) return ref_expr(s["$ref"].get<std::string>(), where + "/$ref");
    }
    if (s.contains("$ref") || s.contains("allOf")) {
        // $ref beside other constraints, allOf: one schema with every part's
        // keywords (when they merge without conflict), compiled once as a rule so
        // a part that refers back to it recurses instead of nesting forever.
        std::vector<json> parts;
        std::vector<std::string> path;
        DSI_RETURN_IF_ERROR(flatten_all(s, where, &parts, &path, 0));
        json merged = json::object();
        for (size_t i = 0; i < parts.size(); ++i) {
            if (parts[i].is_boolean() && !parts[i].get<bool>()) return e_fail();
            if (!merge_into(&merged, parts[i])) {
                return unsupported(
                    where, s.contains("allOf")
                               ? "allOf whose branches constrain the same keyword differently"
                               : "$ref next to other constraining keywords");
            }
        }
        return compile_shared(merged, where, depth);
    }
    if (s.contains("dependentRequired") || s.contains("dependentSchemas") ||
        s.contains("dependencies")) {
        return compile_dependencies(s, where, depth);
    }
    if (s.contains("if")) return compile_if(s, where, depth);
    for (const char* comb : {"anyOf", "oneOf"}) {
        if (!s.contains(comb)) continue;
        const json& branches = s[comb];
        std::string at = where + "/" + comb;
        if (!branches.is_array() || branches.empty()) return bad(at, "must be a non-empty array");
        json base = s;
        base.erase(comb);
        if (std::string(comb) == "anyOf" && base.contains("oneOf")) {
            return unsupported(where, "anyOf together with oneOf");
        }
        bool base_trivial = true;
        for (auto it = base.begin(); it != base.end(); ++it) {
            base_trivial = base_trivial && !is_constraint(it.key());
        }
        std::vector<json> schemas;  // each branch, with the base merged in
        std::vector<std::set<std::string>> types;
        std::vector<json> effective;  // ... and its $ref / allOf folded in
        for (size_t i = 0; i < branches.size(); ++i) {
            const std::string bat = at + "/" + std::to_string(i);
            if (base_trivial) {
                schemas.push_back(branches[i]);
            } else {
                // The branch's own keywords and every $ref / allOf part of it.
                std::vector<json> parts;
                std::vector<std::string> path;
                DSI_RETURN_IF_ERROR(flatten_all(branches[i], bat, &parts, &path, 0));
                json b = base;
                for (const auto& part : parts) {
                    if (!merge_into(&b, part)) {
                        return unsupported(
                            bat, std::string(comb) + " branch that conflicts with its base schema");
                    }
                }
                schemas.push_back(std::move(b));
            }
            effective.push_back(effective_schema(schemas.back(), bat));
            types.push_back(admitted_types(effective.back()));
        }
        // oneOf: keywords that keep each branch off the values another one matches.
        std::vector<json> extra(branches.size(), json::object());
        if (std::string(comb) == "oneOf") {
            DSI_RETURN_IF_ERROR(separate_branches(effective, types, at, &extra));
        }
        std::vector<ExprPtr> alts;
        for (size_t i = 0; i < schemas.size(); ++i) {
            const std::string bat = at + "/" + std::to_string(i);
            const json& b = extra[i].empty() ? schemas[i]
                                             : json{{"allOf", json::array({schemas[i], extra[i]})}};
            DSI_ASSIGN_OR_RETURN(ExprPtr e, compile(b, bat, depth + 1));
            alts.push_back(e);
        }
        return e_alt(std::move(alts));
    }
    if (s.contains("enum") || s.contains("const")) return compile_enum(s, where);

    std::set<std::string> types;
    if (s.contains("type")) {
        const json& t = s["type"];
        auto add = [&](const json& x) -> Status {
            static const std::set<std::string> kTypes = {"null",   "boolean", "integer", "number",
                                                         "string", "array",   "object"};
            if (!x.is_string() || !kTypes.count(x.get<std::string>())) {
                return bad(where + "/type", "unknown type " + x.dump());
            }
            types.insert(x.get<std::string>());
            return Status::ok();
        };
        if (t.is_array()) {
            for (const auto& x : t) DSI_RETURN_IF_ERROR(add(x));
        } else {
            DSI_RETURN_IF_ERROR(add(t));
        }
    } else {
        types = {"null", "boolean", "number", "string", "array", "object"};
    }
    if (types.count("number")) types.erase("integer");
    std::vector<ExprPtr> alts;
    for (const auto& t : types) {
        DSI_ASSIGN_OR_RETURN(ExprPtr e, compile_type(t, s, where, depth));
        alts.push_back(e);
    }
    return e_alt(std::move(alts));
}

Status SchemaCompiler::flatten_all(const json& s, const std::string& where,
                                   std::vector<json>* parts, std::vector<std::string>* path,
                                   int depth) {
    if (depth > options_.limits.max_nesting) {
        return resource_exhausted("JSON schema at '#" + where +
                                  "': allOf/$ref nested deeper than " +
                                  std::to_string(options_.limits.max_nesting));
    }
    if (!s.is_object()) {
        if (!s.is_boolean()) return bad(where, "a schema must be an object or a boolean");
        parts->push_back(s);
        return Status::ok();
    }
    json own = s;
    own.erase("$ref");
    own.erase("allOf");
    parts->push_back(std::move(own));
    if (s.contains("$ref")) {
        if (!s["$ref"].is_string()) return bad(where, "$ref must be a string");
        const std::string ref = s["$ref"].get<std::string>();
        if (ref.empty() || ref[0] != '#' || (ref.size() > 1 && ref[1] != '/')) {
            return unsupported(where, "$ref '" + ref + "' (only local JSON pointers)");
        }
        if (std::find(path->begin(), path->end(), ref) != path->end()) {
            return unsupported(where,
                               "$ref '" + ref + "' that refers back to itself through allOf");
        }
        DSI_ASSIGN_OR_RETURN(const json* target, resolve(ref));
        if (target == nullptr) return bad(where, "$ref '" + ref + "' does not resolve");
        path->push_back(ref);
        DSI_RETURN_IF_ERROR(flatten_all(*target, ref.substr(1), parts, path, depth + 1));
        path->pop_back();
    }
    if (s.contains("allOf")) {
        const json& all = s["allOf"];
        if (!all.is_array() || all.empty())
            return bad(where + "/allOf", "must be a non-empty array");
        for (size_t i = 0; i < all.size(); ++i) {
            DSI_RETURN_IF_ERROR(
                flatten_all(all[i], where + "/allOf/" + std::to_string(i), parts, path, depth + 1));
        }
    }
    return Status::ok();
}

Result<ExprPtr> SchemaCompiler::compile_shared(const json& s, const std::string& where, int depth) {
    std::string key = s.dump(-1, ' ', false, json::error_handler_t::replace);
    auto it = shared_rules_.find(key);
    if (it != shared_rules_.end()) return e_rule(it->second);
    uint32_t id = builder_.declare("merged:#" + where);
    shared_rules_.emplace(std::move(key), id);
    DSI_ASSIGN_OR_RETURN(ExprPtr body, compile(s, where, depth + 1));
    builder_.define(id, body);
    return e_rule(id);
}

}  // namespace internal

using internal::json;

Result<Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                    const JsonSchemaOptions& options) {
    internal::SchemaCompiler c(schema, options);
    return c.run();
}

Result<Grammar> compile_json_schema(std::string_view schema_json,
                                    const JsonSchemaOptions& options) {
    if (schema_json.size() > options.max_schema_bytes) {
        return resource_exhausted("JSON schema larger than " +
                                  std::to_string(options.max_schema_bytes) + " bytes");
    }
    json schema = json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return invalid_argument("JSON schema is not valid JSON");
    return compile_json_schema(schema, options);
}

Result<Grammar> json_object_grammar(bool root_must_be_object) {
    json schema = root_must_be_object ? json{{"type", "object"}} : json(true);
    return compile_json_schema(schema, {});
}

}  // namespace dsi::grammar
