// SchemaCompiler, combinators: dependencies, if / then / else, not, oneOf separation, enum /
// const (internal/schema_compiler.h).
#include "grammar/internal/schema_compiler.h"

namespace dsi::grammar::internal {

Result<ExprPtr> SchemaCompiler::compile_cases(const std::vector<std::vector<json>>& cases,
                                              const std::string& where, const std::string& keyword,
                                              int depth) {
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
            return e.status().with_context("JSON schema at '#" + where + "': through '" + keyword +
                                           "'");
        }
        alts.push_back(*e);
    }
    return e_alt(std::move(alts));
}

bool SchemaCompiler::lists_name(const json& s, const char* k, const std::string& name) {
    if (!s.is_object() || !s.contains(k)) return false;
    const json& v = s[k];
    if (v.is_array()) return std::find(v.begin(), v.end(), json(name)) != v.end();
    return v.is_object() && v.contains(name);
}

std::optional<json> SchemaCompiler::non_object_types(const json& s) {
    json out = json::array();
    for (const auto& t : admitted_types(s)) {
        if (t != "object") out.push_back(t);
    }
    if (out.empty()) return std::nullopt;
    return json{{"type", out}};
}

Result<ExprPtr> SchemaCompiler::compile_dependencies(const json& s, const std::string& where,
                                                     int depth) {
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

Result<ExprPtr> SchemaCompiler::compile_if(const json& s, const std::string& where, int depth) {
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
                conds.push_back(
                    {json{{"required", json::array({r})}},
                     {json{{"type", "object"}, {"properties", {{r.get<std::string>(), false}}}}}});
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
            return unsupported(at, "keyword 'if' whose schema uses '" + k +
                                       "' (decidable: type, enum, const, required, properties)");
        }
    }
    if (conds.size() > kMaxCaseSplits) {
        return unsupported(
            at, "keyword 'if' with more than " + std::to_string(kMaxCaseSplits) + " conditions");
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

Result<std::optional<ExprPtr>> SchemaCompiler::compile_not(const json& s, const std::string& where,
                                                           int depth) {
    static const std::vector<std::string> kAll = {"null",   "boolean", "integer", "number",
                                                  "string", "array",   "object"};
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
    std::set<std::string> have = rest.contains("type")
                                     ? types_of(rest["type"])
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
            const json own = rest.contains("const") ? json::array({rest["const"]}) : rest["enum"];
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
                    return unsupported(at, "'not' of an enum / const listing a value of type " + t +
                                               " beside that type");
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

Result<ExprPtr> SchemaCompiler::numbers_not_in(bool integer, const json& values,
                                               const std::string& at, const std::string& where) {
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

Status SchemaCompiler::separate_branches(const std::vector<json>& effective,
                                         const std::vector<std::set<std::string>>& types,
                                         const std::string& at, std::vector<json>* extra) {
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
                    return unsupported(at, "oneOf whose branches " + std::to_string(i) + " and " +
                                               std::to_string(j) + " may both match a " + t);
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

bool SchemaCompiler::only_values(const json& s) {
    if (!s.is_object() || !(s.contains("const") || (s.contains("enum") && s["enum"].is_array()))) {
        return false;
    }
    for (auto it = s.begin(); it != s.end(); ++it) {
        const std::string& k = it.key();
        if (is_constraint(k) && k != "enum" && k != "const" && k != "type") return false;
    }
    return true;
}

void SchemaCompiler::drop_shared_values(const json& s, const json& other, json* extra) {
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

std::string SchemaCompiler::type_read_by(const std::string& k) {
    static const std::map<std::string, std::string> kOnly = {{"minLength", "string"},
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

bool SchemaCompiler::accepts_every(const json& s, const std::string& t) {
    if (s.is_boolean()) return s.get<bool>();
    if (!s.is_object() || !admitted_types(s).count(t)) return false;
    for (auto it = s.begin(); it != s.end(); ++it) {
        if (!is_constraint(it.key()) || it.key() == "type") continue;
        const std::string only = type_read_by(it.key());
        if (only.empty() || only == t) return false;
    }
    return true;
}

std::optional<std::string> SchemaCompiler::key_to_forbid(const json& s, const json& other) {
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

json SchemaCompiler::effective_schema(const json& s, const std::string& where) {
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

bool SchemaCompiler::disjoint(const json& a, const json& b, const std::string& t) {
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
        if (x.contains("properties") && x["properties"].is_object() &&
            x["properties"].contains(k)) {
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
        if (rb.count(k) && pa && pb && values(*pa, &xa) && values(*pb, &xb) &&
            none_shared(xa, xb)) {
            return true;
        }
    }
    for (const auto& k : rb) {
        if (forbids(a, k)) return true;
    }
    return false;
}

std::set<std::string> SchemaCompiler::admitted_types(const json& s) {
    std::set<std::string> all = {"null",   "boolean", "integer", "number",
                                 "string", "array",   "object"};
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

Result<std::vector<bool>> SchemaCompiler::values_satisfying(const json& schema,
                                                            const std::string& where,
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

Result<ExprPtr> SchemaCompiler::compile_enum(const json& s, const std::string& where) {
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
        if (!allowed.empty() && !allowed.count(ty) &&
            !(ty == "integer" && allowed.count("number"))) {
            continue;
        }
        std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
        if (seen.insert(text).second) alts.push_back(e_literal(text));
    }
    return e_alt(std::move(alts));
}

}  // namespace dsi::grammar::internal
