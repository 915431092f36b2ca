#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "base/check.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/unicode_set.h"

namespace dsi::grammar {

namespace {

using json = nlohmann::ordered_json;

// Keywords that constrain instances (draft 2020-12 and the older drafts' spellings).
// Every other keyword — annotations, vendor extensions (x-..., nullable, enumNames),
// typos — is ignored, as the specification says of unknown keywords.
const std::set<std::string>& constraint_keywords() {
    static const std::set<std::string> k = {
        "type",          "enum",          "const",         "properties",
        "required",      "additionalProperties", "patternProperties", "items",
        "prefixItems",   "additionalItems", "minItems",    "maxItems",
        "uniqueItems",   "contains",      "minContains",   "maxContains",
        "minLength",     "maxLength",     "pattern",       "format",
        "minimum",       "maximum",       "exclusiveMinimum", "exclusiveMaximum",
        "multipleOf",    "anyOf",         "oneOf",         "allOf",
        "not",           "if",            "$ref",          "$dynamicRef",
        "$recursiveRef", "dependentRequired", "dependentSchemas", "dependencies",
        "propertyNames", "minProperties", "maxProperties", "unevaluatedItems",
        "unevaluatedProperties"};
    return k;
}

const std::set<std::string>& unsupported_keywords() {
    static const std::set<std::string> k = {
        "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contains",
        "minContains",   "maxContains",      "$dynamicRef",           "$recursiveRef"};
    return k;
}

// Keywords that constrain ("then" / "else" only do through "if").
bool is_constraint(const std::string& k) { return constraint_keywords().count(k) > 0; }

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

// The type names a `type` keyword lists (a string or an array of strings).
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

// JSON Schema equality: numbers by value (1 == 1.0), objects whatever their member
// order (ordered_json compares members in order, so compare unordered copies).
bool json_equal(const json& a, const json& b) {
    if (a.is_structured() || b.is_structured()) {
        const auto dump = [](const json& x) {
            return x.dump(-1, ' ', false, json::error_handler_t::replace);
        };
        return nlohmann::json::parse(dump(a)) == nlohmann::json::parse(dump(b));
    }
    return a == b;
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

    Result<Grammar> run() { return run_on(root_, ""); }

    // The grammar of `schema`, a subschema of the root at `where` ($refs resolve
    // against the root).
    Result<Grammar> run_on(const json& schema, const std::string& where) {
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

private:
    Status unsupported(const std::string& where, const std::string& what) const {
        return unimplemented("JSON schema at '" + (where.empty() ? "#" : "#" + where) + "': " + what +
                             " is not supported");
    }
    Status bad(const std::string& where, const std::string& what) const {
        return invalid_argument("JSON schema at '" + (where.empty() ? "#" : "#" + where) + "': " + what);
    }

    // ---- structural characters --------------------------------------------------------
    // One line, with an optional space after ',' and ':' by default (compact without
    // JsonSchemaOptions::space_after_separators); with flexible_whitespace, JSON's
    // insignificant whitespace after '{' '[', around ',' ':', before '}' ']' (and
    // around the root value): every place RFC 8259 allows it, so a value is never
    // preceded or followed by whitespace of its own (only "{ }" / "[ ]" is ambiguous).
    ExprPtr whitespace() const {
        ByteSet ws;
        for (char c : {' ', '\t', '\n', '\r'}) ws.set(static_cast<uint8_t>(c));
        return e_star(e_bytes(ws));
    }
    ExprPtr open_char(char c) const {
        return options_.flexible_whitespace ? e_seq({e_byte(c), whitespace()}) : e_byte(c);
    }
    ExprPtr sep_char(char c) const {
        if (options_.flexible_whitespace) return e_seq({whitespace(), e_byte(c), whitespace()});
        if (options_.space_after_separators) return e_seq({e_byte(c), e_opt(e_byte(' '))});
        return e_byte(c);
    }
    ExprPtr close_char(char c) const {
        return options_.flexible_whitespace ? e_seq({whitespace(), e_byte(c)}) : e_byte(c);
    }

    // ---- shared rules --------------------------------------------------------------
    ExprPtr value_rule() {
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
        builder_.define(arr, e_seq({open_char('['), e_opt(e_seq({v, e_star(e_seq({sep_char(','), v}))})),
                                    close_char(']')}));
        builder_.define(value_rule_,
                        e_alt({e_rule(obj), e_rule(arr), s, number_any(), e_literal("true"),
                               e_literal("false"), e_literal("null")}));
        return v;
    }
    ExprPtr string_any() {
        if (string_rule_ == kNoRule) {
            string_rule_ = builder_.declare("json_string");
            builder_.define(string_rule_, e_seq({e_byte('"'), string_tail()}));
        }
        return e_rule(string_rule_);
    }
    // The rest of a JSON string after its opening quote: characters, closing quote.
    // One rule for every string of the grammar (values, keys after their declared-name
    // prefix), called last in its alternative, so the mask tables' walks meet the same
    // states and share their results (matcher.h).
    ExprPtr string_tail() {
        if (string_tail_rule_ == kNoRule) {
            string_tail_rule_ = builder_.declare("json_string_tail");
            builder_.define(string_tail_rule_,
                            e_seq({e_star(json_string_char_any()), e_byte('"')}));
        }
        return e_rule(string_tail_rule_);
    }
    ExprPtr digits_expr(uint32_t min) {
        ByteSet d;
        d.set_range('0', '9');
        return e_repeat(e_bytes(d), min, kUnbounded);
    }
    // Canonical integer digits (-0 included).
    ExprPtr integer_digits() {
        ByteSet nz;
        nz.set_range('1', '9');
        return e_seq({e_opt(e_byte('-')), e_alt({e_byte('0'), e_seq({e_bytes(nz), digits_expr(0)})})});
    }
    // ".0", ".00", ...: a zero fraction, which JSON Schema integers may carry (1.0);
    // only with JsonSchemaOptions::integer_spellings.
    ExprPtr zero_fraction() const {
        if (!options_.integer_spellings) return e_empty();
        return e_opt(e_seq({e_byte('.'), e_plus(e_byte('0'))}));
    }
    // JSON Schema integers: numbers with a zero fractional part. Canonical digits;
    // with integer_spellings also a zero fraction and a non-negative exponent of up
    // to two digits (1E1, 2e+10, 1.0e2; a subset: 1.5e1 is not accepted).
    ExprPtr integer_any() {
        if (!options_.integer_spellings) return integer_digits();
        ByteSet e, d;
        e.set('e');
        e.set('E');
        d.set_range('0', '9');
        return e_seq({integer_digits(), zero_fraction(),
                      e_opt(e_seq({e_bytes(e), e_opt(e_byte('+')), e_repeat(e_bytes(d), 1, 2)}))});
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
                            e_seq({integer_digits(), e_opt(e_seq({e_byte('.'), digits_expr(1)})),
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
    // Each member `side` declares that `other` does not declare must also hold `x`
    // (other's additionalProperties): rewrites side's `properties` in place.
    static void close_over(json* side, const json& other, const json& x) {
        if (x == true || !side->contains("properties") || !(*side)["properties"].is_object()) {
            return;
        }
        const bool other_has = other.contains("properties") && other["properties"].is_object();
        for (auto p = (*side)["properties"].begin(); p != (*side)["properties"].end(); ++p) {
            if (other_has && other["properties"].contains(p.key())) continue;
            p.value() = x == false ? json(false) : json{{"allOf", json::array({x, p.value()})}};
        }
    }

    // Keywords whose conjunction is the tighter bound (numbers; draft 4's boolean
    // exclusiveMinimum / exclusiveMaximum are not numbers and stay conflicts).
    static bool is_lower_bound(const std::string& k) {
        return k == "minimum" || k == "exclusiveMinimum" || k == "minLength" || k == "minItems" ||
               k == "minProperties";
    }
    static bool is_upper_bound(const std::string& k) {
        return k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" || k == "maxItems" ||
               k == "maxProperties";
    }

    // Merges b's constraining keywords into a; false when they overlap in a way
    // that would need a real intersection.
    static bool merge_into(json* a, const json& b_in) {
        if (b_in.is_boolean()) return b_in.get<bool>();
        if (!b_in.is_object()) return false;
        json b = b_in;
        const bool any_patterns =
            a->contains("patternProperties") || b.contains("patternProperties");
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
            if (a->contains("if") &&
                ((*a)["if"] != b["if"] || part(*a, "then") != part(b, "then") ||
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

    // ---- the schema compiler --------------------------------------------------------
    Result<ExprPtr> compile(const json& s, const std::string& where, int depth) {
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
                    return unsupported(where, s.contains("allOf")
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
                                bat,
                                std::string(comb) + " branch that conflicts with its base schema");
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
                const json& b = extra[i].empty()
                                    ? schemas[i]
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

    // ---- case splits: dependencies, if / then / else ---------------------------------
    // The union of `cases`, each the conjunction of its parts (merged as allOf is, $ref
    // and allOf inside a part folded in; a `false` part drops its case). The callers
    // make the cases disjoint (an object with / without a property, a condition held
    // / failed), so the union is exactly the schema. A case whose parts do not merge
    // is UNIMPLEMENTED naming `keyword`.
    Result<ExprPtr> compile_cases(const std::vector<std::vector<json>>& cases,
                                  const std::string& where, const std::string& keyword, int depth) {
        std::vector<ExprPtr> alts;
        for (const auto& parts : cases) {
            json merged = json::object();
            bool dead = false;
            for (const auto& part : parts) {
                std::vector<json> flat;
                std::vector<std::string> path;
                DSI_RETURN_IF_ERROR(flatten_all(part, where, &flat, &path, 0));
                for (const auto& f : flat) {
                    if (f.is_boolean() && !f.get<bool>()) dead = true;
                    if (dead) break;
                    if (!merge_into(&merged, f)) {
                        return unsupported(where, "'" + keyword +
                                                      "' whose cases constrain a keyword of the "
                                                      "rest of the schema differently");
                    }
                }
                if (dead) break;
            }
            if (dead) continue;
            auto e = compile_shared(merged, where, depth);
            if (!e.is_ok()) {
                return e.status().with_context("JSON schema at '#" + where + "': through '" +
                                               keyword + "'");
            }
            alts.push_back(*e);
        }
        return e_alt(std::move(alts));
    }

    static bool lists_name(const json& s, const char* k, const std::string& name) {
        if (!s.is_object() || !s.contains(k)) return false;
        const json& v = s[k];
        if (v.is_array()) return std::find(v.begin(), v.end(), json(name)) != v.end();
        return v.is_object() && v.contains(name);
    }

    // `s` (no $ref / allOf left) never holds property `name` in an object: declared
    // false, or undeclared where undeclared members are forbidden.
    static bool forbids_name(const json& s, const std::string& name) {
        if (lists_name(s, "properties", name)) return s["properties"][name] == false;
        return s.value("additionalProperties", json(true)) == false &&
               !s.contains("patternProperties");
    }

    // The types other than object that `s` admits, as a `type` part ({} when none).
    std::optional<json> non_object_types(const json& s) {
        json out = json::array();
        for (const auto& t : admitted_types(s)) {
            if (t != "object") out.push_back(t);
        }
        if (out.empty()) return std::nullopt;
        return json{{"type", out}};
    }

    // dependentRequired / dependentSchemas and draft 4's `dependencies` (a list of
    // names or a schema per name): each trigger name splits the objects into those
    // without it (`properties: {name: false}`) and those with it (`required: [name]`
    // and the dependency); other values hold none of it. Exact; a name the rest
    // requires or forbids takes one side only. 2^k cases for k undecided names,
    // so k is capped (kMaxCaseSplits).
    Result<ExprPtr> compile_dependencies(const json& s, const std::string& where, int depth) {
        json rest = s;
        std::vector<std::pair<std::string, json>> deps;  // name -> part when present
        for (const char* k : {"dependentRequired", "dependentSchemas", "dependencies"}) {
            if (!s.contains(k)) continue;
            rest.erase(k);
            const std::string at = where + "/" + k;
            const json& d = s[k];
            if (!d.is_object()) return bad(at, "must be an object");
            for (auto it = d.begin(); it != d.end(); ++it) {
                const json& v = it.value();
                const bool names = std::string(k) == "dependentRequired" ||
                                   (std::string(k) == "dependencies" && v.is_array());
                if (names) {
                    if (!v.is_array()) {
                        return bad(at + "/" + escape_pointer(it.key()), "must be an array");
                    }
                    for (const auto& n : v) {
                        if (!n.is_string()) {
                            return bad(at + "/" + escape_pointer(it.key()), "must hold strings");
                        }
                    }
                    if (!v.empty()) deps.push_back({it.key(), json{{"required", v}}});
                } else {
                    if (!v.is_object() && !v.is_boolean()) {
                        return bad(at + "/" + escape_pointer(it.key()),
                                   "a schema must be an object or a boolean");
                    }
                    if (!is_trivial_schema(v)) deps.push_back({it.key(), v});
                }
            }
        }
        std::vector<std::vector<json>> cases;
        if (auto other = non_object_types(rest)) cases.push_back({rest, *other});
        std::vector<std::vector<json>> objects = {{rest, json{{"type", "object"}}}};
        size_t splits = 0;
        for (const auto& [name, part] : deps) {
            const bool present = lists_name(rest, "required", name);
            const bool absent = forbids_name(rest, name);
            if (absent) continue;  // never triggered
            std::vector<std::vector<json>> next;
            for (auto& c : objects) {
                if (!present) {
                    next.push_back(c);
                    next.back().push_back(json{{"properties", {{name, false}}}});
                }
                c.push_back(json{{"required", json::array({name})}});
                c.push_back(part);
                next.push_back(std::move(c));
            }
            objects = std::move(next);
            if (!present && ++splits > kMaxCaseSplits) {
                return unsupported(where,
                                   "dependentRequired / dependentSchemas / dependencies on more "
                                   "than " +
                                       std::to_string(kMaxCaseSplits) +
                                       " properties that may or may not be present");
            }
        }
        for (auto& c : objects) cases.push_back(std::move(c));
        return compile_cases(cases, where, "dependencies", depth);
    }

    // if / then / else, where the `if` schema is decidable here: a conjunction of
    // conditions we can also negate -- `type`, `enum` / `const`, each `required`
    // name, and each `properties` entry (`not` of its schema as compile_not
    // supports: type, enum / const, ...). Cases: every condition holds (then), or
    // condition i fails while those before it hold (else): disjoint, so exact.
    // Other `if` keywords are UNIMPLEMENTED naming the keyword.
    Result<ExprPtr> compile_if(const json& s, const std::string& where, int depth) {
        json rest = s;
        for (const char* k : {"if", "then", "else"}) rest.erase(k);
        const json then_s = s.value("then", json(true));
        const json else_s = s.value("else", json(true));
        const std::string at = where + "/if";
        // Without a then / else that constrains, `if` decides nothing.
        if (is_trivial_schema(then_s) && is_trivial_schema(else_s)) {
            return compile(rest, where, depth + 1);
        }
        json cond = effective_schema(s["if"], at);
        if (cond.is_boolean()) {
            return compile_cases({{rest, cond.get<bool>() ? then_s : else_s}}, where, "if", depth);
        }
        if (!cond.is_object()) return bad(at, "a schema must be an object or a boolean");
        struct Condition {
            json hold;
            std::vector<json> fail;  // disjoint ways to fail it
        };
        std::vector<Condition> conds;
        static const std::vector<std::string> kAll = {"null",   "boolean", "integer", "number",
                                                      "string", "array",   "object"};
        for (auto it = cond.begin(); it != cond.end(); ++it) {
            const std::string& k = it.key();
            const json& v = it.value();
            if (!is_constraint(k)) continue;
            if (k == "type") {
                std::set<std::string> t = type_names(v);
                if (t.count("number")) t.insert("integer");
                if (t.count("integer") && !t.count("number")) {
                    return unsupported(at,
                                       "keyword 'if' on type integer (its failure, a "
                                       "non-integer number, is not expressible)");
                }
                json others = json::array();
                for (const auto& x : kAll) {
                    if (!t.count(x)) others.push_back(x);
                }
                Condition c{json{{"type", v}}, {}};
                if (!others.empty()) c.fail.push_back(json{{"type", others}});
                conds.push_back(std::move(c));
            } else if (k == "enum" || k == "const") {
                const json values = k == "const" ? json::array({v}) : v;
                if (!values.is_array()) return bad(at + "/enum", "must be an array");
                conds.push_back({json{{"enum", values}}, {json{{"not", {{"enum", values}}}}}});
            } else if (k == "required") {
                if (!v.is_array()) return bad(at + "/required", "must be an array");
                for (const auto& r : v) {
                    if (!r.is_string()) return bad(at + "/required", "must hold strings");
                    conds.push_back({json{{"required", json::array({r})}},
                                     {json{{"type", "object"},
                                           {"properties", {{r.get<std::string>(), false}}}}}});
                }
            } else if (k == "properties") {
                if (!v.is_object()) return bad(at + "/properties", "must be an object");
                for (auto p = v.begin(); p != v.end(); ++p) {
                    if (is_trivial_schema(p.value())) continue;
                    json not_p = p.value() == false ? json(true) : json{{"not", p.value()}};
                    conds.push_back({json{{"properties", {{p.key(), p.value()}}}},
                                     {json{{"type", "object"},
                                           {"required", json::array({p.key()})},
                                           {"properties", {{p.key(), not_p}}}}}});
                }
            } else {
                return unsupported(at,
                                   "keyword 'if' whose schema uses '" + k +
                                       "' (decidable: type, enum, const, required, properties)");
            }
        }
        if (conds.size() > kMaxCaseSplits) {
            return unsupported(at, "keyword 'if' with more than " + std::to_string(kMaxCaseSplits) +
                                       " conditions");
        }
        std::vector<std::vector<json>> cases;
        std::vector<json> held = {rest};
        for (const auto& c : conds) {
            for (const auto& f : c.fail) {
                cases.push_back(held);
                cases.back().push_back(f);
                cases.back().push_back(else_s);
            }
            held.push_back(c.hold);
        }
        held.push_back(then_s);
        cases.push_back(std::move(held));
        return compile_cases(cases, where, "if", depth);
    }

    // `not` of simple schemas, folded into the rest of `s`: not {type: ...} removes
    // types; not {required: [k]} (an object without k); not {enum / const: strings}
    // beside a plain string type (any other string); not true / {} (nothing);
    // not false. Anything else is UNIMPLEMENTED.
    Result<std::optional<ExprPtr>> compile_not(const json& s, const std::string& where, int depth) {
        static const std::vector<std::string> kAll = {"null", "boolean", "integer", "number",
                                                      "string", "array", "object"};
        using Out = Result<std::optional<ExprPtr>>;
        auto some = [](Result<ExprPtr> e) -> Out {
            if (!e.is_ok()) return e.status();
            return std::optional<ExprPtr>(*e);
        };
        const json& n = s["not"];
        const std::string at = where + "/not";
        json rest = s;
        rest.erase("not");
        if (n.is_boolean()) {
            if (n.get<bool>()) return std::optional<ExprPtr>(e_fail());
            return some(compile(rest, where, depth + 1));
        }
        if (!n.is_object()) return bad(at, "a schema must be an object or a boolean");
        json nn = json::object();
        for (auto it = n.begin(); it != n.end(); ++it) {
            if (is_constraint(it.key())) nn[it.key()] = it.value();
        }
        if (nn.empty()) return std::optional<ExprPtr>(e_fail());
        auto types_of = [](const json& t) { return type_names(t); };
        std::set<std::string> have = rest.contains("type") ? types_of(rest["type"])
                                                           : std::set<std::string>(kAll.begin(), kAll.end());
        if (have.count("number")) have.insert("integer");
        auto set_types = [&](const std::set<std::string>& t) {
            json arr = json::array();
            for (const auto& x : t) arr.push_back(x);
            rest["type"] = arr;
        };
        if (nn.size() == 1 && nn.contains("type")) {
            std::set<std::string> drop = types_of(nn["type"]);
            if (drop.count("integer") && !drop.count("number") && have.count("number")) {
                return unsupported(at, "'not' of integer from numbers (non-integer numbers)");
            }
            if (drop.count("number")) drop.insert("integer");
            std::set<std::string> keep;
            for (const auto& t : have) {
                if (!drop.count(t)) keep.insert(t);
            }
            keep.erase("number");
            if (have.count("number") && !drop.count("number")) keep.insert("number");
            if (keep.empty()) return std::optional<ExprPtr>(e_fail());
            set_types(keep);
            return some(compile(rest, where, depth + 1));
        }
        if (nn.size() == 1 && nn.contains("required") && nn["required"].is_array() &&
            nn["required"].size() == 1 && nn["required"][0].is_string()) {
            // Only objects can fail `required`; the object must lack the key.
            if (!have.count("object")) return std::optional<ExprPtr>(e_fail());
            set_types({"object"});
            const std::string key = nn["required"][0].get<std::string>();
            if (rest.contains("required") && rest["required"].is_array()) {
                for (const auto& r : rest["required"]) {
                    if (r == key) return std::optional<ExprPtr>(e_fail());
                }
            }
            rest["properties"][key] = false;
            return some(compile(rest, where, depth + 1));
        }
        if (nn.size() == 1 && (nn.contains("enum") || nn.contains("const"))) {
            const json values = nn.contains("const") ? json::array({nn["const"]}) : nn["enum"];
            if (!values.is_array()) return bad(at + "/enum", "must be an array");
            auto listed = [&](const json& v) {
                for (const auto& x : values) {
                    if (json_equal(x, v)) return true;
                }
                return false;
            };
            if (rest.contains("enum") || rest.contains("const")) {
                // A finite set: its values but those listed (exact; compile_enum
                // applies the rest's other keywords).
                json kept = json::array();
                const json own =
                    rest.contains("const") ? json::array({rest["const"]}) : rest["enum"];
                if (!own.is_array()) return bad(where + "/enum", "must be an array");
                for (const auto& v : own) {
                    if (!listed(v)) kept.push_back(v);
                }
                rest.erase("const");
                rest["enum"] = kept;
                return some(compile(rest, where, depth + 1));
            }
            bool plain_rest = true;
            for (auto it = rest.begin(); it != rest.end(); ++it) {
                plain_rest = plain_rest && (it.key() == "type" || !is_constraint(it.key()));
            }
            if (plain_rest) {
                // Per admitted type, its values but the listed ones: strings through the
                // key trie's complement, booleans and null by value; numbers, arrays and
                // objects only when none is listed.
                std::vector<std::string> strings;
                std::set<std::string> listed_types;
                for (const auto& v : values) {
                    std::string t = type_of(v);
                    if (t == "integer") t = "number";
                    listed_types.insert(t);
                    if (v.is_string()) strings.push_back(v.get<std::string>());
                }
                std::vector<ExprPtr> alts;
                for (const auto& t : have) {
                    if (t == "integer" && have.count("number")) continue;
                    if (t == "string") {
                        alts.push_back(key_not_in(strings));
                    } else if (t == "boolean") {
                        for (bool b : {true, false}) {
                            if (!listed(json(b))) alts.push_back(e_literal(b ? "true" : "false"));
                        }
                    } else if (t == "null") {
                        if (!listed(json(nullptr))) alts.push_back(e_literal("null"));
                    } else if ((t == "integer" || t == "number") && listed_types.count("number")) {
                        // The gaps between the listed integers, as bounds (exact: inclusive
                        // for integers, exclusive for numbers).
                        DSI_ASSIGN_OR_RETURN(ExprPtr e,
                                             numbers_not_in(t == "integer", values, at, where));
                        alts.push_back(e);
                    } else if (listed_types.count(t)) {
                        return unsupported(at, "'not' of an enum / const listing a value of type " +
                                                   t + " beside that type");
                    } else {
                        DSI_ASSIGN_OR_RETURN(ExprPtr e, compile_type(t, rest, where, depth));
                        alts.push_back(e);
                    }
                }
                return std::optional<ExprPtr>(e_alt(std::move(alts)));
            }
        }
        return unsupported(at,
                           "'not' of this schema (supported: type, one required name, "
                           "enum/const beside an enum or a plain type)");
    }

    // Integers (or numbers) other than the numbers in `values`, which must be integers
    // of at most 2^53: the ranges between them.
    Result<ExprPtr> numbers_not_in(bool integer, const json& values, const std::string& at,
                                   const std::string& where) {
        std::set<int64_t> listed;
        for (const auto& v : values) {
            if (!v.is_number()) continue;
            const double d = v.get<double>();
            if (type_of(v) != "integer" || std::fabs(d) > 9e15) {
                return unsupported(at,
                                   "'not' of an enum / const listing a number other than an "
                                   "integer up to 9e15 beside numbers");
            }
            listed.insert(v.is_number_float() ? static_cast<int64_t>(d) : v.get<int64_t>());
        }
        const char* lo_key = integer ? "minimum" : "exclusiveMinimum";
        const char* hi_key = integer ? "maximum" : "exclusiveMaximum";
        std::vector<ExprPtr> alts;
        std::optional<int64_t> prev;
        auto piece = [&](std::optional<int64_t> lo, std::optional<int64_t> hi) -> Status {
            json b = json::object();
            if (lo) b[lo_key] = integer ? *lo + 1 : *lo;
            if (hi) b[hi_key] = integer ? *hi - 1 : *hi;
            if (integer && lo && hi && *lo + 1 > *hi - 1) return Status::ok();
            DSI_ASSIGN_OR_RETURN(ExprPtr e, compile_number(integer, b, where));
            alts.push_back(e);
            return Status::ok();
        };
        for (int64_t x : listed) {
            DSI_RETURN_IF_ERROR(piece(prev, x));
            prev = x;
        }
        DSI_RETURN_IF_ERROR(piece(prev, std::nullopt));
        return e_alt(std::move(alts));
    }

    // The parts whose conjunction `s` is: its own keywords, each allOf branch, each
    // $ref target (recursively). A $ref cycle through these is UNIMPLEMENTED.
    Status flatten_all(const json& s, const std::string& where, std::vector<json>* parts,
                       std::vector<std::string>* path, int depth) {
        if (depth > options_.limits.max_nesting) {
            return resource_exhausted("JSON schema at '#" + where + "': allOf/$ref nested deeper than " +
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
                return unsupported(where, "$ref '" + ref + "' that refers back to itself through allOf");
            }
            DSI_ASSIGN_OR_RETURN(const json* target, resolve(ref));
            if (target == nullptr) return bad(where, "$ref '" + ref + "' does not resolve");
            path->push_back(ref);
            DSI_RETURN_IF_ERROR(flatten_all(*target, ref.substr(1), parts, path, depth + 1));
            path->pop_back();
        }
        if (s.contains("allOf")) {
            const json& all = s["allOf"];
            if (!all.is_array() || all.empty()) return bad(where + "/allOf", "must be a non-empty array");
            for (size_t i = 0; i < all.size(); ++i) {
                DSI_RETURN_IF_ERROR(
                    flatten_all(all[i], where + "/allOf/" + std::to_string(i), parts, path, depth + 1));
            }
        }
        return Status::ok();
    }

    // compile(s) as a rule of its own, one per distinct schema text.
    Result<ExprPtr> compile_shared(const json& s, const std::string& where, int depth) {
        std::string key = s.dump(-1, ' ', false, json::error_handler_t::replace);
        auto it = shared_rules_.find(key);
        if (it != shared_rules_.end()) return e_rule(it->second);
        uint32_t id = builder_.declare("merged:#" + where);
        shared_rules_.emplace(std::move(key), id);
        DSI_ASSIGN_OR_RETURN(ExprPtr body, compile(s, where, depth + 1));
        builder_.define(id, body);
        return e_rule(id);
    }

    // oneOf is exactly one branch. The union of the branches is that when no value can
    // match two (disjoint()); otherwise, per pair of branches i, j and type t they may
    // both match:
    // - both accept every value of type t (no keyword that reads t): every such value
    //   matches two branches, so t leaves every branch (exact);
    // - objects: i forbids a property that j requires and i does not (and j one that
    //   i requires), so no value of i' matches j (sound, a subset: objects of i that
    //   hold that property and still fail j are not generated);
    // else UNIMPLEMENTED naming the branches. *extra[i] gets the keywords to add.
    Status separate_branches(const std::vector<json>& effective,
                             const std::vector<std::set<std::string>>& types, const std::string& at,
                             std::vector<json>* extra) {
        std::set<std::string> dropped;
        for (size_t i = 0; i < types.size(); ++i) {
            for (size_t j = i + 1; j < types.size(); ++j) {
                for (const auto& t : types[i]) {
                    if (!types[j].count(t) || disjoint(effective[i], effective[j], t)) continue;
                    const bool scalar_number = t == "integer" || t == "number";
                    if (!scalar_number && accepts_every(effective[i], t) &&
                        accepts_every(effective[j], t)) {
                        dropped.insert(t);
                        continue;
                    }
                    if (only_values(effective[i]) && only_values(effective[j])) {
                        // Two finite value sets: a value in both matches two branches,
                        // so it leaves both (exact).
                        drop_shared_values(effective[i], effective[j], &(*extra)[i]);
                        drop_shared_values(effective[j], effective[i], &(*extra)[j]);
                        continue;
                    }
                    std::optional<std::string> ki, kj;
                    if (t == "object") {
                        ki = key_to_forbid(effective[i], effective[j]);
                        kj = key_to_forbid(effective[j], effective[i]);
                    }
                    if (!ki || !kj) {
                        return unsupported(at, "oneOf whose branches " + std::to_string(i) +
                                                   " and " + std::to_string(j) +
                                                   " may both match a " + t);
                    }
                    (*extra)[i]["properties"][*ki] = false;
                    (*extra)[j]["properties"][*kj] = false;
                }
            }
        }
        if (dropped.empty()) return Status::ok();
        for (size_t i = 0; i < types.size(); ++i) {
            json keep = json::array();
            bool drops = false;
            for (const auto& t : types[i]) {
                drops = drops || dropped.count(t) > 0;
                if (!dropped.count(t)) keep.push_back(t);
            }
            if (drops) (*extra)[i]["type"] = keep;
        }
        return Status::ok();
    }

    // `s` (an effective schema) is a finite set of values: enum / const, beside `type`
    // at most.
    static bool only_values(const json& s) {
        if (!s.is_object() ||
            !(s.contains("const") || (s.contains("enum") && s["enum"].is_array()))) {
            return false;
        }
        for (auto it = s.begin(); it != s.end(); ++it) {
            const std::string& k = it.key();
            if (is_constraint(k) && k != "enum" && k != "const" && k != "type") return false;
        }
        return true;
    }

    // Narrows *extra's enum to the values of `s` that `other` does not list.
    static void drop_shared_values(const json& s, const json& other, json* extra) {
        auto values = [](const json& x) {
            json v = x.contains("const") ? json::array({x["const"]}) : x["enum"];
            return v;
        };
        const json theirs = values(other);
        json keep = json::array();
        for (const auto& v : values(s)) {
            const bool shared = std::find(theirs.begin(), theirs.end(), v) != theirs.end();
            const bool kept = !extra->contains("enum") ||
                              std::find((*extra)["enum"].begin(), (*extra)["enum"].end(), v) !=
                                  (*extra)["enum"].end();
            if (!shared && kept) keep.push_back(v);
        }
        (*extra)["enum"] = keep;
    }

    // The JSON type whose values keyword k reads ("" for every type).
    static std::string type_read_by(const std::string& k) {
        static const std::map<std::string, std::string> kOnly = {
            {"minLength", "string"},
            {"maxLength", "string"},
            {"pattern", "string"},
            {"format", "string"},
            {"items", "array"},
            {"prefixItems", "array"},
            {"additionalItems", "array"},
            {"minItems", "array"},
            {"maxItems", "array"},
            {"uniqueItems", "array"},
            {"contains", "array"},
            {"minContains", "array"},
            {"maxContains", "array"},
            {"unevaluatedItems", "array"},
            {"properties", "object"},
            {"required", "object"},
            {"additionalProperties", "object"},
            {"patternProperties", "object"},
            {"minProperties", "object"},
            {"maxProperties", "object"},
            {"dependentRequired", "object"},
            {"dependentSchemas", "object"},
            {"dependencies", "object"},
            {"propertyNames", "object"},
            {"unevaluatedProperties", "object"},
            {"minimum", "number"},
            {"maximum", "number"},
            {"exclusiveMinimum", "number"},
            {"exclusiveMaximum", "number"},
            {"multipleOf", "number"}};
        auto it = kOnly.find(k);
        return it == kOnly.end() ? "" : it->second;
    }

    // `s` (an effective schema) admits every value of type t: it admits t and none of
    // its keywords but `type` reads values of t.
    bool accepts_every(const json& s, const std::string& t) {
        if (s.is_boolean()) return s.get<bool>();
        if (!s.is_object() || !admitted_types(s).count(t)) return false;
        for (auto it = s.begin(); it != s.end(); ++it) {
            if (!is_constraint(it.key()) || it.key() == "type") continue;
            const std::string only = type_read_by(it.key());
            if (only.empty() || only == t) return false;
        }
        return true;
    }

    // A property `other` requires and `s` does not (one `s` does not declare first):
    // forbidding it in `s` keeps `s` off every value of `other`.
    static std::optional<std::string> key_to_forbid(const json& s, const json& other) {
        auto names = [](const json& x, const char* k) {
            std::set<std::string> out;
            if (!x.is_object() || !x.contains(k)) return out;
            const json& v = x[k];
            if (v.is_array()) {
                for (const auto& n : v) {
                    if (n.is_string()) out.insert(n.get<std::string>());
                }
            } else if (v.is_object()) {
                for (auto it = v.begin(); it != v.end(); ++it) out.insert(it.key());
            }
            return out;
        };
        const std::set<std::string> own = names(s, "required"), declared = names(s, "properties");
        std::optional<std::string> out;
        for (const auto& k : names(other, "required")) {
            if (own.count(k)) continue;
            if (!declared.count(k)) return k;
            if (!out) out = k;
        }
        return out;
    }

    // `s` with its $ref / allOf parts merged (as compile() would), or `s` itself
    // when they do not merge.
    json effective_schema(const json& s, const std::string& where) {
        if (!s.is_object() || (!s.contains("$ref") && !s.contains("allOf"))) return s;
        std::vector<json> parts;
        std::vector<std::string> path;
        if (!flatten_all(s, where, &parts, &path, 0).is_ok()) return s;
        json merged = json::object();
        for (const auto& p : parts) {
            if (!merge_into(&merged, p)) return s;
        }
        return merged;
    }

    // No value of type `t` can satisfy both a and b (decided on the keywords; false
    // when unsure): disjoint enum / const sets, or objects told apart by a property
    // both require with disjoint enum / const sets (a discriminator), or one requires
    // a property the other forbids.
    bool disjoint(const json& a, const json& b, const std::string& t) {
        auto values = [&](const json& x, std::vector<json>* out) {
            if (!x.is_object()) return false;
            const json e = effective_schema(x, "");
            if (!e.is_object()) return false;
            if (e.contains("const")) {
                out->push_back(e["const"]);
                return true;
            }
            if (e.contains("enum") && e["enum"].is_array()) {
                for (const auto& v : e["enum"]) out->push_back(v);
                return true;
            }
            return false;
        };
        auto none_shared = [](const std::vector<json>& x, const std::vector<json>& y) {
            for (const auto& v : x) {
                if (std::find(y.begin(), y.end(), v) != y.end()) return false;
            }
            return true;
        };
        std::vector<json> va, vb;
        if (values(a, &va) && values(b, &vb)) {
            std::vector<json> ta, tb;  // those of type t
            for (const auto& v : va) {
                if (type_of(v) == t || (t == "number" && type_of(v) == "integer")) ta.push_back(v);
            }
            for (const auto& v : vb) {
                if (type_of(v) == t || (t == "number" && type_of(v) == "integer")) tb.push_back(v);
            }
            return none_shared(ta, tb);
        }
        if (t != "object" || !a.is_object() || !b.is_object()) return false;
        auto required = [](const json& x) {
            std::set<std::string> r;
            if (x.contains("required") && x["required"].is_array()) {
                for (const auto& k : x["required"]) {
                    if (k.is_string()) r.insert(k.get<std::string>());
                }
            }
            return r;
        };
        auto prop = [](const json& x, const std::string& k) -> const json* {
            if (x.contains("properties") && x["properties"].is_object() && x["properties"].contains(k)) {
                return &x["properties"][k];
            }
            return nullptr;
        };
        auto forbids = [&](const json& x, const std::string& k) {
            const json* p = prop(x, k);
            if (p != nullptr) return p->is_boolean() && !p->get<bool>();
            return x.contains("additionalProperties") && x["additionalProperties"] == false &&
                   !x.contains("patternProperties");
        };
        const std::set<std::string> ra = required(a), rb = required(b);
        for (const auto& k : ra) {
            if (forbids(b, k)) return true;
            const json* pa = prop(a, k);
            const json* pb = prop(b, k);
            std::vector<json> xa, xb;
            if (rb.count(k) && pa && pb && values(*pa, &xa) && values(*pb, &xb) && none_shared(xa, xb)) {
                return true;
            }
        }
        for (const auto& k : rb) {
            if (forbids(a, k)) return true;
        }
        return false;
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

    // Which of `values` `schema` accepts, decided by compiling `schema` (exact where
    // it compiles; the grammar never accepts an invalid value, so a value it rejects
    // is at worst left out — sound).
    Result<std::vector<bool>> values_satisfying(const json& schema, const std::string& where,
                                                const std::vector<json>& values) {
        SchemaCompiler sub(root_, options_);
        auto g = sub.run_on(schema, where);
        if (!g.is_ok()) {
            if (g.status().code() == StatusCode::kInvalidArgument &&
                g.status().message().find("accepts no input") != std::string::npos) {
                return std::vector<bool>(values.size(), false);
            }
            return g.status();
        }
        static const std::shared_ptr<const Vocabulary> kBytesOnly =
            Vocabulary::from_tokens({std::string(1, '\0')}, {});
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), kBytesOnly);
        std::vector<bool> out;
        for (const auto& v : values) {
            GrammarMatcher m(cg);
            out.push_back(m.advance_bytes(v.dump(-1, ' ', false, json::error_handler_t::replace)) &&
                          m.is_accepted());
        }
        return out;
    }

    Result<ExprPtr> compile_enum(const json& s, const std::string& where) {
        // enum / const beside other constraints: keep the values the rest accepts.
        json rest = json::object();
        for (auto it = s.begin(); it != s.end(); ++it) {
            const std::string& k = it.key();
            const bool conditional = (k == "then" || k == "else") && s.contains("if");
            if (k == "enum" || k == "const" || k == "type" || (!is_constraint(k) && !conditional)) {
                continue;
            }
            rest[k] = it.value();
        }
        if (!rest.empty()) {
            json filtered = json::object();
            for (const char* k : {"enum", "const", "type"}) {
                if (s.contains(k)) filtered[k] = s[k];
            }
            std::vector<json> values;
            if (s.contains("const")) values.push_back(s["const"]);
            if (s.contains("enum") && s["enum"].is_array()) {
                if (s["enum"].size() > options_.max_enum_values) {
                    return resource_exhausted("JSON schema at '#" + where + "/enum': more than " +
                                              std::to_string(options_.max_enum_values) + " values");
                }
                for (const auto& v : s["enum"]) values.push_back(v);
            }
            DSI_ASSIGN_OR_RETURN(std::vector<bool> ok, values_satisfying(rest, where, values));
            json kept = json::array();
            for (size_t i = 0; i < values.size(); ++i) {
                if (ok[i]) kept.push_back(values[i]);
            }
            if (s.contains("const")) {
                filtered["const"] = s["const"];
                if (!ok[0]) return e_fail();
            }
            if (s.contains("enum")) filtered["enum"] = kept;
            return compile_enum(filtered, where);
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

    // Integers that are multiples of k (canonical digits, optional zero fraction): a
    // remainder automaton over the decimal digits, one rule per remainder.
    ExprPtr multiples_of(uint32_t k) {
        auto [it, fresh] = multiple_rules_.emplace(k, std::vector<uint32_t>());
        std::vector<uint32_t>& rules = it->second;
        auto digit = [](uint32_t d) { return e_byte(static_cast<uint8_t>('0' + d)); };
        if (fresh) {
            for (uint32_t r = 0; r < k; ++r) rules.push_back(builder_.declare("mod" + std::to_string(k)));
            for (uint32_t r = 0; r < k; ++r) {
                std::vector<ExprPtr> alts;
                if (r == 0) alts.push_back(e_empty());
                for (uint32_t d = 0; d < 10; ++d) {
                    alts.push_back(e_seq({digit(d), e_rule(rules[(10 * r + d) % k])}));
                }
                builder_.define(rules[r], e_alt(std::move(alts)));
            }
        }
        std::vector<ExprPtr> first = {e_byte('0')};
        for (uint32_t d = 1; d < 10; ++d) first.push_back(e_seq({digit(d), e_rule(rules[d % k])}));
        return e_seq({e_opt(e_byte('-')), e_alt(std::move(first)), zero_fraction()});
    }

    Result<ExprPtr> compile_number(bool integer, const json& s, const std::string& where) {
        if (s.contains("multipleOf")) {
            const json& m = s["multipleOf"];
            if (!m.is_number() || !(m.get<double>() > 0)) {
                return bad(where + "/multipleOf", "must be a number above 0");
            }
            const double k = m.get<double>();
            constexpr double kMaxModulus = 1000;
            for (const char* b : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
                if (s.contains(b)) return unsupported(where + "/multipleOf", "multipleOf together with " + std::string(b));
            }
            if (std::floor(k) != k || k > kMaxModulus) {
                return unsupported(where + "/multipleOf", "multipleOf other than an integer up to 1000");
            }
            // A multiple of an integer is an integer, for numbers too.
            return multiples_of(static_cast<uint32_t>(k));
        }
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
        if (integer) return e_seq({ints, zero_fraction()});
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

    // [min, max] of a pair of counting keywords (minLength / maxLength, ...); max
    // UINT64_MAX when absent. A bound the grammar cannot count to is an error naming
    // the keyword and the limit (exact or rejected, never a silently weaker schema).
    Result<std::pair<uint64_t, uint64_t>> count_bounds(const json& s, const std::string& where,
                                                      const char* min_key, const char* max_key) {
        std::pair<uint64_t, uint64_t> out{0, UINT64_MAX};
        for (const char* k : {min_key, max_key}) {
            if (!s.contains(k)) continue;
            const json& v = s[k];
            if (!v.is_number() || v.get<double>() < 0 || std::floor(v.get<double>()) != v.get<double>()) {
                return bad(where + "/" + k, "must be a non-negative integer");
            }
            const double d = v.get<double>();
            if (d > options_.limits.max_repeat) {
                return resource_exhausted("JSON schema at '#" + where + "/" + k + "': " +
                                          std::to_string(static_cast<uint64_t>(std::min(d, 1e19))) +
                                          " above the limit of " + std::to_string(options_.limits.max_repeat));
            }
            (k == min_key ? out.first : out.second) = static_cast<uint64_t>(d);
        }
        return out;
    }

    Result<ExprPtr> compile_string(const json& s, const std::string& where) {
        bool has_len = s.contains("minLength") || s.contains("maxLength");
        DSI_ASSIGN_OR_RETURN(auto len, count_bounds(s, where, "minLength", "maxLength"));
        const uint32_t min_len = static_cast<uint32_t>(len.first);
        const uint32_t max_len = len.second == UINT64_MAX ? kUnbounded : static_cast<uint32_t>(len.second);
        std::string format = options_.format_assertion && s.contains("format") && s["format"].is_string()
                                 ? s["format"].get<std::string>()
                                 : "";
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
        if (has_format) return format_rule(format);
        if (!has_len) return string_any();
        if (max_len != kUnbounded && min_len > max_len) return e_fail();
        return e_seq({e_byte('"'), e_repeat(json_string_char_any(), min_len, max_len), e_byte('"')});
    }

    // One rule per format and schema: GitHub's webhook schemas have hundreds of
    // "format": "uri" fields, and lowering the uri grammar at each was most of the
    // front end's time (issue 21 corpus: p99 250 ms).
    ExprPtr format_rule(const std::string& format) {
        auto it = format_rules_.find(format);
        if (it != format_rules_.end()) return e_rule(it->second);
        uint32_t id = builder_.declare("format:" + format);
        format_rules_.emplace(format, id);
        auto r = compile_regex(format_regexes().at(format), RegexMatch::kFull,
                               CharEncoding::kJsonString, options_.limits);
        DSI_CHECK(r.is_ok(), r.status().to_string());
        builder_.define(id, e_seq({e_byte('"'), *r, e_byte('"')}));
        return e_rule(id);
    }

    static const std::map<std::string, std::string>& format_regexes() {
        // Subsets of each format's language (sound: everything matched is valid).
        static const std::map<std::string, std::string> k = [] {
            std::string leap = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)";
            std::string date =
                "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-"
                "(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|" + leap + "-02-29)";
            std::string time = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
            // Domain labels of e-mail addresses, letters in either case (as ajv-formats).
            std::string label = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?";
            // Host names: up to 4 labels of up to 62 characters (at most 251 in all,
            // within the 253 of RFC 1123).
            std::string host_label = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,60}[a-zA-Z0-9])?";
            // RFC 3339 appendix A durations (exact).
            std::string dur_s = "[0-9]+S", dur_m = "[0-9]+M(?:" + dur_s + ")?",
                        dur_h = "[0-9]+H(?:" + dur_m + ")?",
                        dur_t = "T(?:" + dur_h + "|" + dur_m + "|" + dur_s + ")",
                        dur_d = "[0-9]+D", dur_mo = "[0-9]+M(?:" + dur_d + ")?",
                        dur_y = "[0-9]+Y(?:" + dur_mo + ")?";
            std::string octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
            // RFC 3986 URIs with an authority: scheme "://" [userinfo "@"] reg-name
            // [":" port] path-abempty ["?" query] ["#" fragment], letters in either
            // case (issue 21: real-world URLs such as "https://Example.com/A" were
            // rejected). A subset of RFC 3986 and of ajv-formats' "uri" (no IP
            // literals in brackets, no URIs without "//").
            std::string pct = "%[0-9a-fA-F]{2}";
            std::string sub = "\\-a-zA-Z0-9._~!$&'()*+,;=";  // '-' escaped: more follows
            std::string pchar = "(?:[" + sub + ":@]|" + pct + ")";
            std::string uri = "[a-zA-Z][a-zA-Z0-9+.-]*://(?:(?:[" + sub + ":]|" + pct + ")*@)?(?:[" +
                              sub + "]|" + pct + ")*(?::[0-9]*)?(?:/" + pchar + "*)*(?:\\?(?:" +
                              pchar + "|[/?])*)?(?:#(?:" + pchar + "|[/?])*)?";
            // RFC 6570 URI templates as ajv-formats reads them: literals (printable
            // ASCII but space " ' % < > \\ ^ ` { | }), %-escapes, and expressions
            // {op? var(:prefix|*)?(,var...)*}; ASCII only (a subset).
            std::string var = "(?:[a-zA-Z0-9_]|" + pct + ")+(?::[1-9][0-9]{0,3}|\\*)?";
            std::string uri_template = "(?:[!#$&()*+,./0-9:;=?@A-Z\\[\\]_a-z~\\-]|" + pct +
                                       "|\\{[+#./;?&=,!@|]?" + var + "(?:," + var + ")*\\})*";
            std::string h = "[0-9a-f]";
            return std::map<std::string, std::string>{
                {"date", date},
                {"time", time},
                {"date-time", date + "T" + time},
                {"email", "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:" + label +
                              "\\.)+" + label},
                {"uuid", h + "{8}-" + h + "{4}-" + h + "{4}-" + h + "{4}-" + h + "{12}"},
                {"uri", uri},
                {"uri-template", uri_template},
                {"ipv4", octet + "\\." + octet + "\\." + octet + "\\." + octet},
                {"ipv6", "(?:" + h + "{1,4}:){7}" + h + "{1,4}"},
                {"hostname", host_label + "(?:\\." + host_label + "){0,3}"},
                {"duration", "P(?:(?:" + dur_d + "|" + dur_mo + "|" + dur_y + ")(?:" + dur_t + ")?|" + dur_t +
                                 "|[0-9]+W)"},
            };
        }();
        return k;
    }

    // The values `s` admits when they are a known finite set: its enum / const (those
    // its other keywords keep, decided by compiling it as compile_enum does), or every
    // value of null / boolean when those are its only types and nothing else reads
    // them; `false`: none. nullopt when `s` is not such a schema.
    Result<std::optional<std::vector<json>>> finite_values(const json& s_in,
                                                           const std::string& where) {
        using Out = std::optional<std::vector<json>>;
        const json s = effective_schema(s_in, where);
        if (s.is_boolean()) return s.get<bool>() ? Out() : Out(std::vector<json>{});
        if (!s.is_object() || s.contains("$ref") || s.contains("allOf")) return Out();
        std::vector<json> values;
        if (s.contains("const")) {
            values.push_back(s["const"]);
        } else if (s.contains("enum") && s["enum"].is_array()) {
            if (s["enum"].size() > options_.max_enum_values) return Out();
            for (const auto& v : s["enum"]) values.push_back(v);
        } else {
            std::set<std::string> types;
            for (auto it = s.begin(); it != s.end(); ++it) {
                if (!is_constraint(it.key())) continue;
                if (it.key() != "type") return Out();
                types = type_names(it.value());
            }
            if (types.empty()) return Out();
            for (const auto& t : types) {
                if (t == "null") {
                    values.push_back(json(nullptr));
                } else if (t == "boolean") {
                    values.push_back(json(true));
                    values.push_back(json(false));
                } else {
                    return Out();
                }
            }
            return Out(std::move(values));
        }
        DSI_ASSIGN_OR_RETURN(std::vector<bool> ok, values_satisfying(s, where, values));
        std::vector<json> kept;
        for (size_t i = 0; i < values.size(); ++i) {
            if (ok[i]) kept.push_back(values[i]);
        }
        return Out(std::move(kept));
    }

    // uniqueItems over elements from known finite sets (finite_values of each
    // prefixItems entry and of `items`): R(S) = the rest of an array whose elements so
    // far are the value classes in S (values equal as JSON Schema compares them are
    // one class), so |S| is also the next index: "," and a value of a class not in S
    // that index admits, then R(S + it); or the end once |S| >= minItems. Exact (the
    // values as compile_enum writes them); one rule per reachable S, capped
    // (kMaxUniqueStates), else UNIMPLEMENTED naming uniqueItems.
    Result<ExprPtr> unique_array(const json& s, const std::string& where, uint64_t min,
                                 uint64_t max) {
        const std::string why =
            "keyword 'uniqueItems' (supported when every element that can occur is one of a "
            "known finite set: enum, const, boolean, null)";
        std::vector<std::vector<json>> domains;  // per index below n; then `items`
        const size_t n =
            s.contains("prefixItems") && s["prefixItems"].is_array() ? s["prefixItems"].size() : 0;
        for (size_t i = 0; i < n && i < max; ++i) {
            DSI_ASSIGN_OR_RETURN(
                auto d,
                finite_values(s["prefixItems"][i], where + "/prefixItems/" + std::to_string(i)));
            if (!d) return unsupported(where + "/prefixItems/" + std::to_string(i), why);
            domains.push_back(std::move(*d));
        }
        std::vector<json> after;
        if (max > n) {
            if (!s.contains("items")) return unsupported(where, why);
            DSI_ASSIGN_OR_RETURN(auto d, finite_values(s["items"], where + "/items"));
            if (!d) return unsupported(where + "/items", why);
            after = std::move(*d);
        }
        // Value classes and, per index, each class's spellings.
        std::vector<json> classes;
        auto class_of = [&](const json& v) {
            for (size_t c = 0; c < classes.size(); ++c) {
                if (json_equal(classes[c], v)) return c;
            }
            classes.push_back(v);
            return classes.size() - 1;
        };
        auto spellings = [&](const std::vector<json>& d) {
            std::map<size_t, std::vector<std::string>> out;
            for (const auto& v : d) {
                auto& list = out[class_of(v)];
                std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
                if (std::find(list.begin(), list.end(), text) == list.end()) list.push_back(text);
            }
            return out;
        };
        std::vector<std::map<size_t, std::vector<std::string>>> at;
        for (const auto& d : domains) at.push_back(spellings(d));
        const auto at_after = spellings(after);
        if (classes.size() > 64) return unsupported(where, why + ": more than 64 distinct values");
        // Every array is at most as long as there are classes.
        max = std::min<uint64_t>(max, classes.size());
        if (min > max) return e_fail();
        std::map<uint64_t, uint32_t> rules;
        std::vector<uint64_t> todo = {0};
        rules[0] = builder_.declare("unique_items:#" + where);
        while (!todo.empty()) {
            const uint64_t set = todo.back();
            todo.pop_back();
            const size_t count = static_cast<size_t>(__builtin_popcountll(set));
            std::vector<ExprPtr> alts;
            if (count >= min) alts.push_back(e_empty());
            if (count < max) {
                const auto& here = count < at.size() ? at[count] : at_after;
                for (const auto& [c, texts] : here) {
                    const uint64_t bit = uint64_t{1} << c;
                    if (set & bit) continue;
                    auto [it, fresh] = rules.emplace(set | bit, 0);
                    if (fresh) {
                        if (rules.size() > kMaxUniqueStates) {
                            return unsupported(where, why + ": more than " +
                                                          std::to_string(kMaxUniqueStates) +
                                                          " sets of values to track");
                        }
                        it->second = builder_.declare("unique_items:#" + where);
                        todo.push_back(set | bit);
                    }
                    std::vector<ExprPtr> lits;
                    for (const auto& t : texts) lits.push_back(e_literal(t));
                    alts.push_back(e_seq({count == 0 ? e_empty() : sep_char(','),
                                          e_alt(std::move(lits)), e_rule(it->second)}));
                }
            }
            builder_.define(rules[set], alts.empty() ? e_fail() : e_alt(std::move(alts)));
        }
        return e_seq({open_char('['), e_rule(rules[0]), close_char(']')});
    }

    Result<ExprPtr> compile_array(const json& s, const std::string& where, int depth) {
        uint64_t min = 0, max = UINT64_MAX;
        for (const char* k : {"minItems", "maxItems"}) {
            if (!s.contains(k)) continue;
            const json& v = s[k];
            if (!v.is_number() || v.get<double>() < 0) {
                return bad(where + "/" + k, "must be a non-negative integer");
            }
            double d = v.get<double>();
            uint64_t n = d > 1e18 ? UINT64_MAX : static_cast<uint64_t>(d);
            (k[1] == 'i' ? min : max) = n;
        }
        if (min > max) return e_fail();
        // Arrays of at most one element are unique whatever their items.
        if (s.contains("uniqueItems") && s["uniqueItems"] == true && max > 1) {
            return unique_array(s, where, min, max);
        }
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
        size_t n = prefix.size();
        if (min > n + options_.limits.max_repeat) {
            return resource_exhausted("JSON schema at '#" + where + "/minItems': above the limit of " +
                                      std::to_string(options_.limits.max_repeat));
        }
        // Elements after the prefix: count in [max(0, min - n), max - n].
        uint64_t rest_min = min > n ? min - n : 0;
        uint64_t rest_max = max == UINT64_MAX ? UINT64_MAX : (max > n ? max - n : 0);
        if (rest_max != UINT64_MAX && rest_max > options_.limits.max_repeat) {
            // Exact or rejected (never silently unbounded).
            return resource_exhausted("JSON schema at '#" + where + "/maxItems': " + std::to_string(max) +
                                      " above the limit of " + std::to_string(options_.limits.max_repeat));
        }
        uint32_t rmax = rest_max == UINT64_MAX ? kUnbounded : static_cast<uint32_t>(rest_max);
        auto tail = [&](bool first) -> ExprPtr {
            if (first) {
                if (rmax == 0) return e_empty();
                ExprPtr more = e_repeat(e_seq({sep_char(','), item}), rest_min > 0 ? static_cast<uint32_t>(rest_min - 1) : 0,
                                        rmax == kUnbounded ? kUnbounded : rmax - 1);
                ExprPtr one = e_seq({item, more});
                return rest_min == 0 ? e_opt(one) : one;
            }
            return e_repeat(e_seq({sep_char(','), item}), static_cast<uint32_t>(rest_min), rmax);
        };
        // T(i): elements from index i (i < n: the prefix schema i).
        ExprPtr t = tail(n == 0);
        for (size_t i = n; i-- > 0;) {
            if (i >= max) {
                t = e_empty();
                continue;
            }
            ExprPtr here = e_seq({i == 0 ? e_empty() : sep_char(','), prefix[i], t});
            t = i + 1 > min ? e_alt({e_empty(), here}) : here;
            if (i == 0) break;
        }
        return e_seq({open_char('['), t, close_char(']')});
    }

    // A JSON string (canonical escaping) not equal to any of `keys`: the keys' trie,
    // leaving it for the shared string tail at the first character no key continues
    // with. Its own rule, whose alternatives all end in tail calls.
    ExprPtr key_not_in(const std::vector<std::string>& keys) {
        if (keys.empty()) return string_any();
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
        ExprPtr rest = string_tail();
        // Characters that leave the trie: at a node whose next characters are all plain
        // ASCII (the usual key names), the raw ASCII characters not among them (one
        // byte class), or any other character (escape, control, non-ASCII): one rule
        // for the whole grammar, ending in the string tail, called last. Before, every
        // node lowered its own complement (~17 alternatives): nearly all of the front
        // end's time on webhook schemas (issue 21: ~250 ms of ~254).
        CodepointSet plain;  // raw ASCII that is not special in a JSON string
        plain.add(0x20, 0x7F);
        CodepointSet quote_backslash;
        quote_backslash.add('"', '"');
        quote_backslash.add('\\', '\\');
        plain = plain.minus(quote_backslash);
        std::function<ExprPtr(int)> build = [&](int v) -> ExprPtr {
            std::vector<ExprPtr> alts;
            if (!nodes[v].end) alts.push_back(e_byte('"'));
            CodepointSet used;
            for (auto [cp, child] : nodes[v].next) {
                CodepointSet one;
                one.add(cp, cp);
                used.add(cp, cp);
                alts.push_back(e_seq({codepoints_expr(one, CharEncoding::kJsonString), build(child)}));
            }
            if (!used.minus(plain).empty()) {
                alts.push_back(e_seq({codepoints_expr(used.complement(), CharEncoding::kJsonString), rest}));
                return e_alt(std::move(alts));
            }
            CodepointSet ascii_rest = plain.minus(used);
            if (!ascii_rest.empty()) {
                alts.push_back(e_seq({codepoints_expr(ascii_rest, CharEncoding::kJsonString), rest}));
            }
            alts.push_back(non_plain_then_tail(plain));
            return e_alt(std::move(alts));
        };
        uint32_t id = builder_.declare("key_not_in");
        builder_.define(id, e_seq({e_byte('"'), build(0)}));
        return e_rule(id);
    }

    // Any JSON string character outside `plain`, then the rest of the string: one rule
    // per grammar (key_not_in).
    ExprPtr non_plain_then_tail(const CodepointSet& plain) {
        if (non_plain_rule_ == kNoRule) {
            non_plain_rule_ = builder_.declare("key_char_not_plain");
            builder_.define(non_plain_rule_,
                            e_seq({codepoints_expr(CodepointSet::all().minus(plain), CharEncoding::kJsonString),
                                   string_tail()}));
        }
        return e_rule(non_plain_rule_);
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
            if (additional_allowed) add_kv = e_seq({key_not_in(names), sep_char(':'), additional});
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
                branches.push_back(e_seq({e_byte('"'), patterns[i].key, e_byte('"'), sep_char(':'), v}));
            }
            if (!branches.empty()) add_kv = e_alt(std::move(branches));
        }
        if (s.contains("minProperties") || s.contains("maxProperties")) {
            return counted_members(s, where, props, required, add_kv);
        }
        // (One property with undeclared members: they may come before it.)
        if (options_.any_property_order && (props.size() > 1 || (props.size() == 1 && add_kv)) &&
            props.size() <=
                std::min<size_t>(options_.max_any_order_properties, kMaxAnyOrderProperties)) {
            return any_order_members(where, props, required, add_kv);
        }
        // Members in declaration order, then the additional ones, as two rules per
        // property: K(i) = at least one member from property i on (its own, or, when
        // optional, K(i+1)), M(i) = "," K(i), or nothing when no member from i on is
        // required. Each property's key and value are lowered once. Before, nested
        // alternations flattened into one rule per suffix, so every property's
        // member was copied into each earlier one's rule: O(n^2) elements for n
        // optional properties (webhook schemas: ~300 ms front end), and O(n^2)
        // positions, each a table to build (issue 21).
        const size_t n = props.size();
        std::vector<bool> empty_ok(n + 1, true);  // no required member from i on
        for (size_t i = n; i-- > 0;) empty_ok[i] = empty_ok[i + 1] && !required[i];
        std::vector<uint32_t> k_rule(n + 1), m_rule(n + 1);
        for (size_t i = 0; i <= n; ++i) {
            k_rule[i] = builder_.declare("members:#" + where);
            m_rule[i] = builder_.declare("more_members:#" + where);
        }
        builder_.define(k_rule[n], add_kv ? e_seq({add_kv, e_rule(m_rule[n])}) : e_fail());
        for (size_t i = n + 1; i-- > 0;) {
            if (i < n) {
                ExprPtr kv = e_seq({e_literal(key_literal(props[i].first)), sep_char(':'), props[i].second});
                ExprPtr own = e_seq({kv, e_rule(m_rule[i + 1])});
                builder_.define(k_rule[i], required[i] ? own : e_alt({own, e_rule(k_rule[i + 1])}));
            }
            ExprPtr more = e_seq({sep_char(','), e_rule(k_rule[i])});
            builder_.define(m_rule[i], empty_ok[i] ? e_alt({more, e_empty()}) : more);
        }
        ExprPtr first = empty_ok[0] ? e_alt({e_rule(k_rule[0]), e_empty()}) : e_rule(k_rule[0]);
        return e_seq({open_char('{'), first, close_char('}')});
    }

    // JsonSchemaOptions::any_property_order: R(S) = the members after those of the
    // declared properties in S (a bit set) were written: "," and the member of a
    // property not in S, then R(S + it); "," and an undeclared member, then R(S);
    // or nothing once S holds every required property. The first member has no comma
    // (F(S), used for S = {} only). Each member "key":value (and "," + it) is one
    // rule with many callers, so its position tables are shared by all subsets
    // (matcher.h: unknown caller); R(S) has only rule references, never a stack top.
    // 2^n rules for n properties, hence the cap.
    Result<ExprPtr> any_order_members(const std::string& where,
                                      const std::vector<std::pair<std::string, ExprPtr>>& props,
                                      const std::vector<bool>& required, const ExprPtr& add_kv) {
        const size_t n = props.size();
        DSI_CHECK(n <= kMaxAnyOrderProperties);
        auto key_literal = [](const std::string& k) {
            return json(k).dump(-1, ' ', false, json::error_handler_t::replace);
        };
        uint32_t required_bits = 0;
        std::vector<uint32_t> member(n), more(n);
        for (size_t i = 0; i < n; ++i) {
            if (required[i]) required_bits |= uint32_t{1} << i;
            member[i] = builder_.declare("member:#" + where + "/" + escape_pointer(props[i].first));
            builder_.define(member[i], e_seq({e_literal(key_literal(props[i].first)), sep_char(':'),
                                              props[i].second}));
            more[i] = builder_.declare("more_member:#" + where);
            builder_.define(more[i], e_seq({sep_char(','), e_rule(member[i])}));
        }
        uint32_t add = kNoRule, more_add = kNoRule;
        if (add_kv) {
            add = builder_.declare("undeclared_member:#" + where);
            builder_.define(add, add_kv);
            more_add = builder_.declare("more_undeclared_member:#" + where);
            builder_.define(more_add, e_seq({sep_char(','), e_rule(add)}));
        }
        const uint32_t num_sets = uint32_t{1} << n;
        std::vector<uint32_t> rest(num_sets);
        for (uint32_t set = 0; set < num_sets; ++set) {
            rest[set] = builder_.declare("members_after:#" + where);
        }
        for (uint32_t set = 0; set < num_sets; ++set) {
            std::vector<ExprPtr> alts;
            for (size_t i = 0; i < n; ++i) {
                uint32_t bit = uint32_t{1} << i;
                if (set & bit) continue;
                alts.push_back(e_seq({e_rule(more[i]), e_rule(rest[set | bit])}));
            }
            if (more_add != kNoRule) alts.push_back(e_seq({e_rule(more_add), e_rule(rest[set])}));
            if ((set & required_bits) == required_bits) alts.push_back(e_empty());
            builder_.define(rest[set], alts.empty() ? e_fail() : e_alt(std::move(alts)));
        }
        std::vector<ExprPtr> first;
        for (size_t i = 0; i < n; ++i) {
            first.push_back(e_seq({e_rule(member[i]), e_rule(rest[uint32_t{1} << i])}));
        }
        if (add != kNoRule) first.push_back(e_seq({e_rule(add), e_rule(rest[0])}));
        if (required_bits == 0) first.push_back(e_empty());
        return e_seq({open_char('{'), e_alt(std::move(first)), close_char('}')});
    }

    // Object members with minProperties / maxProperties: T(i, k) = the members from
    // declared property i on, k members written so far (k counted up to the bound
    // that still matters), then the additional members, their number bounded so the
    // total is in [min, max].
    Result<ExprPtr> counted_members(const json& s, const std::string& where,
                                    const std::vector<std::pair<std::string, ExprPtr>>& props,
                                    const std::vector<bool>& required, const ExprPtr& add_kv) {
        DSI_ASSIGN_OR_RETURN(auto bounds, count_bounds(s, where, "minProperties", "maxProperties"));
        // Plain copies, not a structured binding: clang 14 cannot capture bindings in
        // the lambda below.
        const uint64_t lo = bounds.first;
        const uint64_t hi = bounds.second;
        if (lo > hi) return e_fail();
        const size_t n = props.size();
        // Counts past this are all alike.
        const uint64_t cap = hi == UINT64_MAX ? lo : hi + 1;
        auto key_literal = [](const std::string& k) {
            return json(k).dump(-1, ' ', false, json::error_handler_t::replace);
        };
        std::map<std::pair<size_t, uint64_t>, ExprPtr> memo;
        std::function<ExprPtr(size_t, uint64_t)> t = [&](size_t i, uint64_t k) -> ExprPtr {
            auto [it, fresh] = memo.emplace(std::pair{i, k}, nullptr);
            if (!fresh) return it->second;
            ExprPtr out;
            if (i == n) {
                // r additional members with k + r in [lo, hi].
                uint64_t rmin = lo > k ? lo - k : 0;
                uint64_t rmax = hi == UINT64_MAX ? UINT64_MAX : (hi >= k ? hi - k : 0);
                if (!add_kv) {
                    out = rmin == 0 && k <= hi ? e_empty() : e_fail();
                } else if (k > hi) {
                    out = e_fail();
                } else {
                    uint32_t mx = rmax == UINT64_MAX ? kUnbounded : static_cast<uint32_t>(rmax);
                    ExprPtr more_item = e_seq({sep_char(','), add_kv});
                    if (k > 0) {
                        out = e_repeat(more_item, static_cast<uint32_t>(rmin), mx);
                    } else if (mx == 0) {
                        out = rmin == 0 ? e_empty() : e_fail();
                    } else {
                        ExprPtr first = e_seq({add_kv, e_repeat(more_item, rmin > 0 ? static_cast<uint32_t>(rmin - 1) : 0,
                                                                mx == kUnbounded ? kUnbounded : mx - 1)});
                        out = rmin == 0 ? e_opt(first) : first;
                    }
                }
            } else {
                ExprPtr kv = e_seq({e_literal(key_literal(props[i].first)), sep_char(':'), props[i].second});
                ExprPtr present = k + 1 > hi ? e_fail()
                                              : e_seq({k == 0 ? e_empty() : sep_char(','), kv,
                                                       t(i + 1, std::min<uint64_t>(k + 1, cap))});
                out = required[i] ? present : e_alt({present, t(i + 1, k)});
            }
            memo[{i, k}] = out;
            return out;
        };
        return e_seq({open_char('{'), t(0, 0), close_char('}')});
    }

    static constexpr uint32_t kNoRule = UINT32_MAX;
    static constexpr size_t kMaxAnyOrderProperties = 16;  // 2^16 rules
    // Properties a dependency splits on, conditions of one `if`: 2^k / k+1 cases.
    static constexpr size_t kMaxCaseSplits = 4;
    static constexpr size_t kMaxUniqueStates = 4096;  // unique_array() rules
    const json& root_;
    const JsonSchemaOptions& options_;
    GrammarBuilder builder_;
    uint32_t value_rule_ = kNoRule;
    uint32_t string_rule_ = kNoRule;
    uint32_t string_tail_rule_ = kNoRule;
    uint32_t non_plain_rule_ = kNoRule;  // non_plain_then_tail()
    uint32_t number_rule_ = kNoRule;
    std::unordered_map<std::string, uint32_t> ref_rules_;
    std::unordered_map<std::string, uint32_t> shared_rules_;  // compile_shared()
    std::unordered_map<std::string, uint32_t> format_rules_;  // format_rule()
    std::unordered_map<uint32_t, std::vector<uint32_t>> multiple_rules_;  // multiples_of()
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
