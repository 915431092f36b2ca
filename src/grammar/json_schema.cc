#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "grammar/regex.h"
#include "grammar/unicode_set.h"

namespace dsi::grammar {

namespace {

using json = nlohmann::ordered_json;

const std::set<std::string>& annotation_keywords() {
    static const std::set<std::string> k = {
        "$schema",  "$id",        "$comment",   "title",          "description",
        "default",  "examples",   "deprecated", "readOnly",       "writeOnly",
        "$defs",    "definitions", "contentMediaType", "contentEncoding", "contentSchema",
        "$anchor",  "$vocabulary", "format"};
    return k;
}

const std::set<std::string>& unsupported_keywords() {
    static const std::set<std::string> k = {
        "not",           "if",                 "dependentRequired", "dependentSchemas",
        "propertyNames", "unevaluatedItems",   "unevaluatedProperties", "minProperties",
        "maxProperties", "contains",           "minContains",       "maxContains",
        "multipleOf",    "$dynamicRef",        "$dynamicAnchor",    "$recursiveRef",
        "$recursiveAnchor", "dependencies"};
    return k;
}

// Keywords that constrain (everything else known is an annotation or ignored).
bool is_constraint(const std::string& k) {
    return !annotation_keywords().count(k) && k != "then" && k != "else";
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
        case json::value_t::null: return "null";
        case json::value_t::boolean: return "boolean";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned: return "integer";
        case json::value_t::number_float: {
            double d = v.get<double>();
            return std::floor(d) == d && std::isfinite(d) ? "integer" : "number";
        }
        case json::value_t::string: return "string";
        case json::value_t::array: return "array";
        case json::value_t::object: return "object";
        default: return "unknown";
    }
}

// Natural numbers (no leading zeros) with digit string in [x, y], same length.
ExprPtr same_length_range(const std::string& x, const std::string& y) {
    auto digit_range = [](char a, char b) {
        ByteSet s;
        s.set_range(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
        return e_bytes(s);
    };
    if (x.size() == 1) return digit_range(x[0], y[0]);
    if (x[0] == y[0]) return e_seq({e_byte(static_cast<uint8_t>(x[0])), same_length_range(x.substr(1), y.substr(1))});
    size_t n = x.size() - 1;
    std::vector<ExprPtr> alts;
    alts.push_back(e_seq({e_byte(static_cast<uint8_t>(x[0])), same_length_range(x.substr(1), std::string(n, '9'))}));
    if (y[0] - x[0] > 1) {
        alts.push_back(e_seq({digit_range(static_cast<char>(x[0] + 1), static_cast<char>(y[0] - 1)),
                              e_repeat(digit_range('0', '9'), static_cast<uint32_t>(n), static_cast<uint32_t>(n))}));
    }
    alts.push_back(e_seq({e_byte(static_cast<uint8_t>(y[0])), same_length_range(std::string(n, '0'), y.substr(1))}));
    return e_alt(std::move(alts));
}

// Naturals in [a, b]; b < 0 means unbounded.
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
        alts.push_back(e_seq({e_bytes(nonzero),
                              e_repeat(e_bytes(digit), static_cast<uint32_t>(as.size()), kUnbounded)}));
    }
    return e_alt(std::move(alts));
}

class SchemaCompiler {
public:
    SchemaCompiler(const json& root, const JsonSchemaOptions& options)
        : root_(root), options_(options), builder_(options.limits) {}

    Result<Grammar> run() {
        uint32_t root_rule = builder_.declare("root");
        DSI_ASSIGN_OR_RETURN(ExprPtr body, compile(root_, "", 0));
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

private:
    Status unsupported(const std::string& where, const std::string& what) const {
        return unimplemented("JSON schema at '" + (where.empty() ? "#" : "#" + where) + "': " + what +
                             " is not supported");
    }
    Status bad(const std::string& where, const std::string& what) const {
        return invalid_argument("JSON schema at '" + (where.empty() ? "#" : "#" + where) + "': " + what);
    }

    // ---- shared rules --------------------------------------------------------------
    ExprPtr value_rule() {
        if (value_rule_ != kNoRule) return e_rule(value_rule_);
        value_rule_ = builder_.declare("json_value");
        uint32_t obj = builder_.declare("json_object");
        uint32_t arr = builder_.declare("json_array");
        ExprPtr v = e_rule(value_rule_);
        ExprPtr s = string_any();
        builder_.define(obj, e_seq({e_byte('{'),
                                    e_opt(e_seq({s, e_byte(':'), v,
                                                 e_star(e_seq({e_byte(','), s, e_byte(':'), v}))})),
                                    e_byte('}')}));
        builder_.define(arr, e_seq({e_byte('['), e_opt(e_seq({v, e_star(e_seq({e_byte(','), v}))})),
                                    e_byte(']')}));
        builder_.define(value_rule_,
                        e_alt({e_rule(obj), e_rule(arr), s, number_any(), e_literal("true"),
                               e_literal("false"), e_literal("null")}));
        return v;
    }
    ExprPtr string_any() {
        if (string_rule_ == kNoRule) {
            string_rule_ = builder_.declare("json_string");
            builder_.define(string_rule_,
                            e_seq({e_byte('"'), e_star(json_string_char_any()), e_byte('"')}));
        }
        return e_rule(string_rule_);
    }
    ExprPtr digits_expr(uint32_t min) {
        ByteSet d;
        d.set_range('0', '9');
        return e_repeat(e_bytes(d), min, kUnbounded);
    }
    ExprPtr integer_any() {
        ByteSet nz;
        nz.set_range('1', '9');
        return e_seq({e_opt(e_byte('-')), e_alt({e_byte('0'), e_seq({e_bytes(nz), digits_expr(0)})})});
    }
    ExprPtr number_any() {
        if (number_rule_ == kNoRule) {
            number_rule_ = builder_.declare("json_number");
            ByteSet e, pm;
            e.set('e');
            e.set('E');
            pm.set('+');
            pm.set('-');
            builder_.define(number_rule_,
                            e_seq({integer_any(), e_opt(e_seq({e_byte('.'), digits_expr(1)})),
                                   e_opt(e_seq({e_bytes(e), e_opt(e_bytes(pm)), digits_expr(1)}))}));
        }
        return e_rule(number_rule_);
    }

    // ---- $ref ----------------------------------------------------------------------
    Result<const json*> resolve(const std::string& ref) {
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

    Result<ExprPtr> ref_expr(const std::string& ref, const std::string& where) {
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

    // ---- merging (allOf, $ref siblings, anyOf/oneOf with a base schema) -------------
    // Merges b's constraining keywords into a; false when they overlap in a way
    // that would need a real intersection.
    static bool merge_into(json* a, const json& b) {
        if (b.is_boolean()) return b.get<bool>();
        if (!b.is_object()) return false;
        // additionalProperties reads only its own schema's properties, items only its
        // own prefixItems: merging them across schemas would change their meaning.
        for (auto [dep, on] : {std::pair{"additionalProperties", "properties"},
                               std::pair{"additionalProperties", "patternProperties"},
                               std::pair{"items", "prefixItems"}}) {
            if ((b.contains(dep) && a->contains(on)) || (a->contains(dep) && b.contains(on))) {
                return false;
            }
        }
        for (auto it = b.begin(); it != b.end(); ++it) {
            const std::string& k = it.key();
            if (!is_constraint(k)) continue;
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
            if (k == "properties" && av.is_object() && it.value().is_object()) {
                for (auto p = it.value().begin(); p != it.value().end(); ++p) {
                    if (av.contains(p.key()) && av[p.key()] != p.value()) return false;
                    av[p.key()] = p.value();
                }
                continue;
            }
            if (k == "type") {
                auto as_set = [](const json& t) {
                    std::set<std::string> s;
                    if (t.is_string()) s.insert(t.get<std::string>());
                    if (t.is_array()) {
                        for (const auto& x : t) {
                            if (x.is_string()) s.insert(x.get<std::string>());
                        }
                    }
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

    // ---- the schema compiler --------------------------------------------------------
    Result<ExprPtr> compile(const json& s, const std::string& where, int depth) {
        if (depth > options_.limits.max_nesting) {
            return resource_exhausted("JSON schema at '#" + where + "': nested deeper than " +
                                      std::to_string(options_.limits.max_nesting));
        }
        if (s.is_boolean()) return s.get<bool>() ? value_rule() : e_fail();
        if (!s.is_object()) return bad(where, "a schema must be an object or a boolean");
        for (auto it = s.begin(); it != s.end(); ++it) {
            if (unsupported_keywords().count(it.key())) {
                if (it.key() == "uniqueItems") continue;
                return unsupported(where, "keyword '" + it.key() + "'");
            }
        }
        if (s.contains("uniqueItems") && s["uniqueItems"] == true) {
            return unsupported(where, "keyword 'uniqueItems': true");
        }
        if (s.contains("$ref")) {
            if (!s["$ref"].is_string()) return bad(where, "$ref must be a string");
            json rest = s;
            rest.erase("$ref");
            bool trivial = true;
            for (auto it = rest.begin(); it != rest.end(); ++it) trivial = trivial && !is_constraint(it.key());
            if (trivial) return ref_expr(s["$ref"].get<std::string>(), where + "/$ref");
            // $ref with sibling constraints: merge the target in when it has no refs.
            DSI_ASSIGN_OR_RETURN(const json* target, resolve(s["$ref"].get<std::string>()));
            if (target == nullptr || (target->is_object() && target->contains("$ref")) ||
                !merge_into(&rest, *target)) {
                return unsupported(where, "$ref next to other constraining keywords");
            }
            return compile(rest, where, depth + 1);
        }
        if (s.contains("allOf")) {
            const json& all = s["allOf"];
            if (!all.is_array() || all.empty()) return bad(where + "/allOf", "must be a non-empty array");
            json merged = s;
            merged.erase("allOf");
            for (size_t i = 0; i < all.size(); ++i) {
                const json* sub = &all[i];
                if (sub->is_object() && sub->contains("$ref") && sub->size() == 1) {
                    DSI_ASSIGN_OR_RETURN(sub, resolve((*sub)["$ref"].get<std::string>()));
                    if (sub == nullptr) return bad(where + "/allOf/" + std::to_string(i), "$ref does not resolve");
                }
                if (sub->is_object() && (sub->contains("$ref") || sub->contains("allOf"))) {
                    return unsupported(where + "/allOf/" + std::to_string(i), "nested allOf/$ref in allOf");
                }
                if (sub->is_boolean() && !sub->get<bool>()) return e_fail();
                if (!merge_into(&merged, *sub)) {
                    return unsupported(where + "/allOf/" + std::to_string(i),
                                       "allOf whose branches constrain the same keyword differently");
                }
            }
            return compile(merged, where, depth + 1);
        }
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
            std::vector<ExprPtr> alts;
            std::vector<std::set<std::string>> types;
            for (size_t i = 0; i < branches.size(); ++i) {
                json b = base;
                const json* sub = &branches[i];
                std::string bat = at + "/" + std::to_string(i);
                bool base_trivial = true;
                for (auto it = base.begin(); it != base.end(); ++it) {
                    base_trivial = base_trivial && !is_constraint(it.key());
                }
                if (base_trivial) {
                    DSI_ASSIGN_OR_RETURN(ExprPtr e, compile(*sub, bat, depth + 1));
                    alts.push_back(e);
                    types.push_back(admitted_types(*sub));
                    continue;
                }
                if (sub->is_object() && sub->contains("$ref")) {
                    DSI_ASSIGN_OR_RETURN(sub, resolve((*sub)["$ref"].get<std::string>()));
                    if (sub == nullptr) return bad(bat, "$ref does not resolve");
                }
                if (!merge_into(&b, *sub)) {
                    return unsupported(bat, std::string(comb) + " branch that conflicts with its base schema");
                }
                DSI_ASSIGN_OR_RETURN(ExprPtr e, compile(b, bat, depth + 1));
                alts.push_back(e);
                types.push_back(admitted_types(b));
            }
            if (std::string(comb) == "oneOf") {
                for (size_t i = 0; i < types.size(); ++i) {
                    for (size_t j = i + 1; j < types.size(); ++j) {
                        for (const auto& t : types[i]) {
                            if (types[j].count(t)) {
                                return unsupported(at, "oneOf whose branches " + std::to_string(i) + " and " +
                                                           std::to_string(j) + " may both match a " + t);
                            }
                        }
                    }
                }
            }
            return e_alt(std::move(alts));
        }
        if (s.contains("enum") || s.contains("const")) return compile_enum(s, where);

        std::set<std::string> types;
        if (s.contains("type")) {
            const json& t = s["type"];
            auto add = [&](const json& x) -> Status {
                static const std::set<std::string> kTypes = {"null", "boolean", "integer", "number",
                                                              "string", "array", "object"};
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

    std::set<std::string> admitted_types(const json& s) {
        std::set<std::string> all = {"null", "boolean", "integer", "number", "string", "array", "object"};
        if (s.is_boolean()) return s.get<bool>() ? all : std::set<std::string>{};
        if (!s.is_object()) return all;
        std::set<std::string> out;
        if (s.contains("const")) {
            out.insert(type_of(s["const"]));
        } else if (s.contains("enum") && s["enum"].is_array()) {
            for (const auto& v : s["enum"]) out.insert(type_of(v));
        } else if (s.contains("type")) {
            const json& t = s["type"];
            if (t.is_string()) out.insert(t.get<std::string>());
            if (t.is_array()) {
                for (const auto& x : t) {
                    if (x.is_string()) out.insert(x.get<std::string>());
                }
            }
        } else {
            return all;
        }
        // integers are numbers: overlap must be seen both ways.
        if (out.count("integer")) out.insert("number");
        if (out.count("number")) out.insert("integer");
        return out;
    }

    Result<ExprPtr> compile_enum(const json& s, const std::string& where) {
        for (auto it = s.begin(); it != s.end(); ++it) {
            const std::string& k = it.key();
            if (k == "enum" || k == "const" || k == "type" || !is_constraint(k)) continue;
            return unsupported(where, "enum/const together with '" + k + "'");
        }
        std::vector<json> values;
        if (s.contains("const")) values.push_back(s["const"]);
        if (s.contains("enum")) {
            if (!s["enum"].is_array()) return bad(where + "/enum", "must be an array");
            if (s["enum"].size() > options_.max_enum_values) {
                return resource_exhausted("JSON schema at '#" + where + "/enum': more than " +
                                          std::to_string(options_.max_enum_values) + " values");
            }
            std::vector<json> kept;
            for (const auto& v : s["enum"]) {
                if (values.empty() || !s.contains("const") || v == values[0]) kept.push_back(v);
            }
            if (s.contains("const")) {
                if (kept.empty()) return e_fail();
            } else {
                values = kept;
            }
        }
        std::set<std::string> allowed;
        if (s.contains("type")) {
            const json& t = s["type"];
            if (t.is_string()) allowed.insert(t.get<std::string>());
            if (t.is_array()) {
                for (const auto& x : t) allowed.insert(x.get<std::string>());
            }
        }
        std::vector<ExprPtr> alts;
        std::set<std::string> seen;
        for (const auto& v : values) {
            std::string ty = type_of(v);
            if (!allowed.empty() && !allowed.count(ty) && !(ty == "integer" && allowed.count("number"))) {
                continue;
            }
            std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
            if (seen.insert(text).second) alts.push_back(e_literal(text));
        }
        return e_alt(std::move(alts));
    }

    Result<ExprPtr> compile_type(const std::string& t, const json& s, const std::string& where,
                                 int depth) {
        if (t == "null") return e_literal("null");
        if (t == "boolean") return e_alt({e_literal("true"), e_literal("false")});
        if (t == "integer" || t == "number") return compile_number(t == "integer", s, where);
        if (t == "string") return compile_string(s, where);
        if (t == "array") return compile_array(s, where, depth);
        return compile_object(s, where, depth);
    }

    Result<ExprPtr> compile_number(bool integer, const json& s, const std::string& where) {
        bool has_lo = false, has_hi = false;
        int64_t lo = 0, hi = 0;
        for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
            if (!s.contains(k)) continue;
            const json& v = s[k];
            if (!v.is_number()) return bad(where + "/" + k, "must be a number");
            double d = v.get<double>();
            bool is_min = k[0] == 'm' ? std::string(k) == "minimum" : std::string(k) == "exclusiveMinimum";
            bool exclusive = k[0] == 'e';
            int64_t bound = 0;
            if (!std::isfinite(d) || std::fabs(d) > 9e15) return unsupported(where + "/" + k, "a bound this large");
            if (integer) {
                // Integers: round the bound inwards; exact.
                if (is_min) {
                    bound = static_cast<int64_t>(std::ceil(d));
                    if (exclusive && static_cast<double>(bound) == d) ++bound;
                } else {
                    bound = static_cast<int64_t>(std::floor(d));
                    if (exclusive && static_cast<double>(bound) == d) --bound;
                }
            } else {
                if (std::floor(d) != d) {
                    return unsupported(where + "/" + k, "a non-integer bound on a number");
                }
                bound = static_cast<int64_t>(d);
                if (exclusive) return unsupported(where + "/" + k, "an exclusive bound on a number");
            }
            if (is_min) {
                lo = has_lo ? std::max(lo, bound) : bound;
                has_lo = true;
            } else {
                hi = has_hi ? std::min(hi, bound) : bound;
                has_hi = true;
            }
        }
        if (!has_lo && !has_hi) return integer ? integer_any() : number_any();
        if (has_lo && has_hi && lo > hi) return e_fail();
        ExprPtr ints = int_range(has_lo, lo, has_hi, hi);
        if (integer) return ints;
        // Numbers with integer bounds [lo, hi]: integer values (optionally ".0..."),
        // or I.F with a nonzero fraction: positive magnitude m in [lo, hi-1], negative
        // magnitude m in [-hi, -lo-1] (see docs/grammar.md).
        ByteSet d, nz;
        d.set_range('0', '9');
        nz.set_range('1', '9');
        ExprPtr frac = e_seq({e_byte('.'), e_star(e_bytes(d)), e_bytes(nz), e_star(e_bytes(d))});
        std::vector<ExprPtr> alts;
        alts.push_back(e_seq({ints, e_opt(e_seq({e_byte('.'), e_plus(e_byte('0'))}))}));
        // positive: m >= max(lo, 0), m <= hi - 1
        {
            bool ok = !has_hi || hi - 1 >= std::max<int64_t>(has_lo ? lo : 0, 0);
            if (ok) alts.push_back(e_seq({int_range(true, std::max<int64_t>(has_lo ? lo : 0, 0), has_hi, hi - 1), frac}));
        }
        // negative: m in [max(-hi, 0), -lo - 1]
        {
            int64_t mlo = has_hi ? std::max<int64_t>(-hi, 0) : 0;
            bool ok = !has_lo || -lo - 1 >= mlo;
            if (ok) {
                alts.push_back(e_seq({e_byte('-'), int_range(true, mlo, has_lo, -lo - 1), frac}));
            }
        }
        return e_alt(std::move(alts));
    }

    // Integers in [lo, hi] (either side may be open), canonical spelling.
    ExprPtr int_range(bool has_lo, int64_t lo, bool has_hi, int64_t hi) {
        std::vector<ExprPtr> alts;
        // Non-negative part.
        if (!has_hi || hi >= 0) {
            uint64_t a = has_lo && lo > 0 ? static_cast<uint64_t>(lo) : 0;
            alts.push_back(natural_range(a, has_hi ? hi : -1));
        }
        // Negative part: -m with m in [max(1, -hi), -lo].
        if (!has_lo || lo < 0) {
            uint64_t a = has_hi && hi < 0 ? static_cast<uint64_t>(-hi) : 1;
            alts.push_back(e_seq({e_byte('-'), natural_range(a, has_lo ? -lo : -1)}));
        }
        return e_alt(std::move(alts));
    }

    Result<ExprPtr> compile_string(const json& s, const std::string& where) {
        bool has_len = s.contains("minLength") || s.contains("maxLength");
        uint32_t min_len = 0, max_len = kUnbounded;
        for (const char* k : {"minLength", "maxLength"}) {
            if (!s.contains(k)) continue;
            const json& v = s[k];
            if (!v.is_number() || v.get<double>() < 0 || std::floor(v.get<double>()) != v.get<double>()) {
                return bad(where + "/" + k, "must be a non-negative integer");
            }
            double d = v.get<double>();
            if (d > options_.limits.max_repeat) {
                if (k[1] == 'a') continue;  // a huge maxLength is no bound in practice
                return resource_exhausted("JSON schema at '#" + where + "/" + k + "': " +
                                          std::to_string(static_cast<uint64_t>(d)) + " above the limit of " +
                                          std::to_string(options_.limits.max_repeat));
            }
            (k[1] == 'i' ? min_len : max_len) = static_cast<uint32_t>(d);
        }
        std::string format = s.contains("format") && s["format"].is_string() ? s["format"].get<std::string>() : "";
        const std::map<std::string, std::string>& formats = format_regexes();
        bool has_format = formats.count(format) > 0;
        bool has_pattern = s.contains("pattern");
        if (has_pattern + has_format + has_len > 1) {
            return unsupported(where, "combining pattern, format and minLength/maxLength");
        }
        if (has_pattern) {
            if (!s["pattern"].is_string()) return bad(where + "/pattern", "must be a string");
            auto r = compile_regex(s["pattern"].get<std::string>(), RegexMatch::kSearch,
                                   CharEncoding::kJsonString, options_.limits);
            if (!r.is_ok()) return r.status().with_context("JSON schema at '#" + where + "/pattern'");
            return e_seq({e_byte('"'), *r, e_byte('"')});
        }
        if (has_format) {
            auto r = compile_regex(formats.at(format), RegexMatch::kFull, CharEncoding::kJsonString,
                                   options_.limits);
            DSI_CHECK(r.is_ok(), r.status().to_string());
            return e_seq({e_byte('"'), *r, e_byte('"')});
        }
        if (!has_len) return string_any();
        if (max_len != kUnbounded && min_len > max_len) return e_fail();
        return e_seq({e_byte('"'), e_repeat(json_string_char_any(), min_len, max_len), e_byte('"')});
    }

    static const std::map<std::string, std::string>& format_regexes() {
        // Subsets of each format's language (sound: everything matched is valid).
        static const std::map<std::string, std::string> k = [] {
            std::string leap = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)";
            std::string date =
                "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-"
                "(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|" + leap + "-02-29)";
            std::string time = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
            std::string label = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?";
            std::string octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
            std::string h = "[0-9a-f]";
            return std::map<std::string, std::string>{
                {"date", date},
                {"time", time},
                {"date-time", date + "T" + time},
                {"email", "[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:" + label +
                              "\\.)+" + label},
                {"uuid", h + "{8}-" + h + "{4}-" + h + "{4}-" + h + "{4}-" + h + "{12}"},
                {"uri", "[a-z][a-z0-9+.-]*://" + label + "(?:\\." + label + ")*(?:/[a-zA-Z0-9._~!$&'()*+,;=:@-]*)*"},
                {"ipv4", octet + "\\." + octet + "\\." + octet + "\\." + octet},
                {"ipv6", "(?:" + h + "{1,4}:){7}" + h + "{1,4}"},
            };
        }();
        return k;
    }

    Result<ExprPtr> compile_array(const json& s, const std::string& where, int depth) {
        std::vector<ExprPtr> prefix;
        if (s.contains("prefixItems")) {
            const json& p = s["prefixItems"];
            if (!p.is_array()) return bad(where + "/prefixItems", "must be an array");
            for (size_t i = 0; i < p.size(); ++i) {
                DSI_ASSIGN_OR_RETURN(ExprPtr e, compile(p[i], where + "/prefixItems/" + std::to_string(i), depth + 1));
                prefix.push_back(e);
            }
        }
        ExprPtr item = value_rule();
        if (s.contains("items")) {
            DSI_ASSIGN_OR_RETURN(item, compile(s["items"], where + "/items", depth + 1));
        }
        uint64_t min = 0, max = UINT64_MAX;
        for (const char* k : {"minItems", "maxItems"}) {
            if (!s.contains(k)) continue;
            const json& v = s[k];
            if (!v.is_number() || v.get<double>() < 0) return bad(where + "/" + k, "must be a non-negative integer");
            double d = v.get<double>();
            uint64_t n = d > 1e18 ? UINT64_MAX : static_cast<uint64_t>(d);
            (k[1] == 'i' ? min : max) = n;
        }
        if (min > max) return e_fail();
        size_t n = prefix.size();
        if (min > n + options_.limits.max_repeat) {
            return resource_exhausted("JSON schema at '#" + where + "/minItems': above the limit of " +
                                      std::to_string(options_.limits.max_repeat));
        }
        // Elements after the prefix: count in [max(0, min - n), max - n].
        uint64_t rest_min = min > n ? min - n : 0;
        uint64_t rest_max = max == UINT64_MAX ? UINT64_MAX : (max > n ? max - n : 0);
        uint32_t rmax = rest_max > options_.limits.max_repeat ? kUnbounded : static_cast<uint32_t>(rest_max);
        auto tail = [&](bool first) -> ExprPtr {
            if (first) {
                if (rmax == 0) return e_empty();
                ExprPtr more = e_repeat(e_seq({e_byte(','), item}), rest_min > 0 ? static_cast<uint32_t>(rest_min - 1) : 0,
                                        rmax == kUnbounded ? kUnbounded : rmax - 1);
                ExprPtr one = e_seq({item, more});
                return rest_min == 0 ? e_opt(one) : one;
            }
            return e_repeat(e_seq({e_byte(','), item}), static_cast<uint32_t>(rest_min), rmax);
        };
        // T(i): elements from index i (i < n: the prefix schema i).
        ExprPtr t = tail(n == 0);
        for (size_t i = n; i-- > 0;) {
            if (i >= max) {
                t = e_empty();
                continue;
            }
            ExprPtr here = e_seq({i == 0 ? e_empty() : e_byte(','), prefix[i], t});
            t = i + 1 > min ? e_alt({e_empty(), here}) : here;
            if (i == 0) break;
        }
        return e_seq({e_byte('['), t, e_byte(']')});
    }

    // A JSON string (canonical escaping) not equal to any of `keys`.
    ExprPtr key_not_in(const std::vector<std::string>& keys) {
        ExprPtr any_char = codepoints_expr(CodepointSet::all(), CharEncoding::kJsonString);
        if (keys.empty()) return e_seq({e_byte('"'), e_star(any_char), e_byte('"')});
        // Character trie of the keys (code points).
        struct TNode {
            std::map<uint32_t, int> next;
            bool end = false;
        };
        std::vector<TNode> nodes(1);
        for (const auto& k : keys) {
            int cur = 0;
            for (size_t i = 0; i < k.size();) {
                unsigned char c = static_cast<unsigned char>(k[i]);
                int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
                uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
                for (int j = 1; j < len && i + j < k.size(); ++j) cp = (cp << 6) | (k[i + j] & 0x3F);
                i += len;
                auto it = nodes[cur].next.find(cp);
                if (it == nodes[cur].next.end()) {
                    nodes[cur].next[cp] = static_cast<int>(nodes.size());
                    int nx = static_cast<int>(nodes.size());
                    nodes.emplace_back();
                    cur = nx;
                } else {
                    cur = it->second;
                }
            }
            nodes[cur].end = true;
        }
        ExprPtr rest = e_star(any_char);
        std::function<ExprPtr(int)> build = [&](int v) -> ExprPtr {
            std::vector<ExprPtr> alts;
            if (!nodes[v].end) alts.push_back(e_empty());
            CodepointSet used;
            for (auto [cp, child] : nodes[v].next) {
                CodepointSet one;
                one.add(cp, cp);
                used.add(cp, cp);
                alts.push_back(e_seq({codepoints_expr(one, CharEncoding::kJsonString), build(child)}));
            }
            alts.push_back(e_seq({codepoints_expr(used.complement(), CharEncoding::kJsonString), rest}));
            return e_alt(std::move(alts));
        };
        return e_seq({e_byte('"'), build(0), e_byte('"')});
    }

    // Whether the JSON-string-encoded `name` (without quotes) is in the language of
    // `e` (a regex expression: no rule references). Names with bytes whose JSON
    // spelling could differ from the regex encoding's (controls, '"', '\\', non-ASCII)
    // answer true: callers use the answer conservatively.
    static bool name_matches(const std::string& name, const ExprPtr& e) {
        for (char c : name) {
            unsigned char u = static_cast<unsigned char>(c);
            if (u < 0x20 || u >= 0x7f || c == '"' || c == '\\') return true;
        }
        std::vector<char> start(name.size() + 1, 0);
        start[0] = 1;
        std::function<std::vector<char>(const Expr&, const std::vector<char>&)> ends =
            [&](const Expr& x, const std::vector<char>& in) -> std::vector<char> {
            std::vector<char> out(in.size(), 0);
            switch (x.kind) {
                case Expr::Kind::kEmpty: return in;
                case Expr::Kind::kFail: return out;
                case Expr::Kind::kBytes:
                    for (size_t i = 0; i + 1 < in.size(); ++i) {
                        if (in[i] && x.bytes.test(static_cast<uint8_t>(name[i]))) out[i + 1] = 1;
                    }
                    return out;
                case Expr::Kind::kSeq: {
                    std::vector<char> cur = in;
                    for (const auto& c : x.children) cur = ends(*c, cur);
                    return cur;
                }
                case Expr::Kind::kAlt:
                    for (const auto& c : x.children) {
                        std::vector<char> r = ends(*c, in);
                        for (size_t i = 0; i < out.size(); ++i) out[i] |= r[i];
                    }
                    return out;
                case Expr::Kind::kRepeat: {
                    std::vector<char> cur = in;
                    // After name.size() + 1 rounds past min no new end position appears.
                    uint64_t rounds = std::min<uint64_t>(x.max, uint64_t{x.min} + in.size() + 1);
                    for (uint64_t r = 0; r < rounds; ++r) {
                        if (r >= x.min) {
                            for (size_t i = 0; i < out.size(); ++i) out[i] |= cur[i];
                        }
                        cur = ends(*x.children[0], cur);
                    }
                    for (size_t i = 0; i < out.size(); ++i) out[i] |= cur[i];
                    return out;
                }
                case Expr::Kind::kRule: return std::vector<char>(in.size(), 1);  // unknown: maybe
            }
            return out;
        };
        return ends(*e, start).back() != 0;
    }

    static bool is_trivial_schema(const json& s) {
        if (s.is_boolean()) return s.get<bool>();
        if (!s.is_object()) return false;
        for (auto it = s.begin(); it != s.end(); ++it) {
            if (is_constraint(it.key())) return false;
        }
        return true;
    }

    // The schema every one of `schemas` must hold at once (allOf; one schema as is).
    Result<ExprPtr> compile_all(const json& schemas, const std::string& where, int depth) {
        if (schemas.empty()) return value_rule();
        if (schemas.size() == 1) return compile(schemas[0], where, depth + 1);
        json all = {{"allOf", schemas}};
        return compile(all, where, depth + 1);
    }

    Result<ExprPtr> compile_object(const json& s, const std::string& where, int depth) {
        std::vector<std::pair<std::string, ExprPtr>> props;
        std::vector<bool> required;
        std::set<std::string> req;
        if (s.contains("required")) {
            if (!s["required"].is_array()) return bad(where + "/required", "must be an array");
            for (const auto& r : s["required"]) {
                if (!r.is_string()) return bad(where + "/required", "must hold strings");
                req.insert(r.get<std::string>());
            }
        }
        // patternProperties: each key's language is the JSON-string encoding of
        // .*(pattern).* (ECMAScript search semantics).
        struct PatternProp {
            ExprPtr key;  // string content, without the quotes
            json schema;
        };
        std::vector<PatternProp> patterns;
        json nontrivial_pattern_schemas = json::array();
        if (s.contains("patternProperties")) {
            const json& pp = s["patternProperties"];
            if (!pp.is_object()) return bad(where + "/patternProperties", "must be an object");
            for (auto it = pp.begin(); it != pp.end(); ++it) {
                std::string at = where + "/patternProperties/" + escape_pointer(it.key());
                auto r = compile_regex(it.key(), RegexMatch::kSearch, CharEncoding::kJsonString, options_.limits);
                if (!r.is_ok()) return r.status().with_context("JSON schema at '#" + at + "'");
                if (!it.value().is_boolean() && !it.value().is_object()) {
                    return bad(at, "a schema must be an object or a boolean");
                }
                patterns.push_back({*r, it.value()});
                if (!is_trivial_schema(it.value())) nontrivial_pattern_schemas.push_back(it.value());
            }
        }
        // The schemas a key named `name` must also satisfy: every matching pattern's
        // (draft 2020-12 applies all of them); *matched: some pattern matches.
        auto pattern_schemas_for = [&](const std::string& name, bool* matched) {
            json out = json::array();
            *matched = false;
            for (const auto& p : patterns) {
                if (!name_matches(name, p.key)) continue;
                *matched = true;
                if (!is_trivial_schema(p.schema)) out.push_back(p.schema);
            }
            return out;
        };
        if (s.contains("properties")) {
            const json& p = s["properties"];
            if (!p.is_object()) return bad(where + "/properties", "must be an object");
            for (auto it = p.begin(); it != p.end(); ++it) {
                std::string at = where + "/properties/" + escape_pointer(it.key());
                bool matched = false;
                json all = pattern_schemas_for(it.key(), &matched);
                ExprPtr e;
                if (all.empty()) {
                    DSI_ASSIGN_OR_RETURN(e, compile(it.value(), at, depth + 1));
                } else {
                    all.insert(all.begin(), it.value());
                    DSI_ASSIGN_OR_RETURN(e, compile_all(all, at, depth));
                }
                props.push_back({it.key(), e});
                required.push_back(req.count(it.key()) > 0);
            }
        }
        ExprPtr additional = value_rule();
        bool additional_allowed = true;
        if (s.contains("additionalProperties")) {
            const json& a = s["additionalProperties"];
            if (a.is_boolean() && !a.get<bool>()) {
                additional_allowed = false;
            } else if (!patterns.empty() && !is_trivial_schema(a)) {
                // Keys matching no pattern would need the complement of the patterns'
                // languages, which the regex engine cannot express exactly.
                return unsupported(where + "/additionalProperties",
                                   "a schema (other than true / false) together with patternProperties");
            } else {
                DSI_ASSIGN_OR_RETURN(additional, compile(a, where + "/additionalProperties", depth + 1));
            }
        }
        // Required names that are not declared must come as additional properties:
        // declare them with the additional schema (or their patterns' schemas).
        for (const auto& r : req) {
            bool found = false;
            for (const auto& p : props) found = found || p.first == r;
            if (found) continue;
            bool matched = false;
            json all = pattern_schemas_for(r, &matched);
            if (matched) {
                DSI_ASSIGN_OR_RETURN(ExprPtr e, compile_all(all, where + "/patternProperties", depth));
                props.push_back({r, e});
            } else {
                if (!additional_allowed) return e_fail();
                props.push_back({r, additional});
            }
            required.push_back(true);
        }
        std::vector<std::string> names;
        for (const auto& p : props) names.push_back(p.first);
        auto key_literal = [](const std::string& k) { return json(k).dump(-1, ' ', false, json::error_handler_t::replace); };
        ExprPtr add_kv;
        if (patterns.empty()) {
            if (additional_allowed) add_kv = e_seq({key_not_in(names), e_byte(':'), additional});
        } else {
            // With patterns, undeclared keys are generated only from the patterns
            // (keys matching none would need a complement; for additionalProperties
            // true leaving them out is a generation choice: every output stays valid).
            // A key from pattern i may also match other patterns, so its value must
            // hold every non-trivial pattern schema (conservative: a subset of the
            // valid values). A pattern that matches a declared name is left out here,
            // since its language cannot exclude that name.
            std::vector<ExprPtr> branches;
            ExprPtr v;
            for (size_t i = 0; i < patterns.size(); ++i) {
                bool clash = false;
                for (const auto& n : names) clash = clash || name_matches(n, patterns[i].key);
                if (clash) continue;
                if (v == nullptr) {
                    DSI_ASSIGN_OR_RETURN(v, compile_all(nontrivial_pattern_schemas, where + "/patternProperties", depth));
                }
                branches.push_back(e_seq({e_byte('"'), patterns[i].key, e_byte('"'), e_byte(':'), v}));
            }
            if (!branches.empty()) add_kv = e_alt(std::move(branches));
        }
        // T(i, first): properties i.. given whether nothing was written yet.
        ExprPtr t_first, t_more;
        if (add_kv) {
            t_more = e_star(e_seq({e_byte(','), add_kv}));
            t_first = e_opt(e_seq({add_kv, t_more}));
        } else {
            t_first = t_more = e_empty();
        }
        for (size_t i = props.size(); i-- > 0;) {
            ExprPtr kv = e_seq({e_literal(key_literal(props[i].first)), e_byte(':'), props[i].second});
            ExprPtr with_first = e_seq({kv, t_more});
            ExprPtr with_more = e_seq({e_byte(','), kv, t_more});
            if (required[i]) {
                t_first = with_first;
                t_more = with_more;
            } else {
                t_first = e_alt({with_first, t_first});
                t_more = e_alt({with_more, t_more});
            }
        }
        return e_seq({e_byte('{'), t_first, e_byte('}')});
    }

    static constexpr uint32_t kNoRule = UINT32_MAX;
    const json& root_;
    const JsonSchemaOptions& options_;
    GrammarBuilder builder_;
    uint32_t value_rule_ = kNoRule;
    uint32_t string_rule_ = kNoRule;
    uint32_t number_rule_ = kNoRule;
    std::unordered_map<std::string, uint32_t> ref_rules_;
    std::vector<std::pair<std::string, uint32_t>> pending_refs_;
};

}  // namespace

Result<Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                    const JsonSchemaOptions& options) {
    SchemaCompiler c(schema, options);
    return c.run();
}

Result<Grammar> compile_json_schema(std::string_view schema_json, const JsonSchemaOptions& options) {
    if (schema_json.size() > options.max_schema_bytes) {
        return resource_exhausted("JSON schema larger than " + std::to_string(options.max_schema_bytes) +
                                  " bytes");
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
