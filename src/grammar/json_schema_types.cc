// SchemaCompiler, types: numbers, strings, formats, finite values, arrays, objects
// (internal/schema_compiler.h).
#include "grammar/internal/schema_compiler.h"

namespace dsi::grammar::internal {

Result<ExprPtr> SchemaCompiler::compile_type(const std::string& t, const json& s,
                                             const std::string& where, int depth) {
    if (t == "null") return e_literal("null");
    if (t == "boolean") return e_alt({e_literal("true"), e_literal("false")});
    if (t == "integer" || t == "number") return compile_number(t == "integer", s, where);
    if (t == "string") return compile_string(s, where);
    if (t == "array") return compile_array(s, where, depth);
    return compile_object(s, where, depth);
}

ExprPtr SchemaCompiler::multiples_of(uint32_t k) {
    auto [it, fresh] = multiple_rules_.emplace(k, std::vector<uint32_t>());
    std::vector<uint32_t>& rules = it->second;
    auto digit = [](uint32_t d) { return e_byte(static_cast<uint8_t>('0' + d)); };
    if (fresh) {
        for (uint32_t r = 0; r < k; ++r)
            rules.push_back(builder_.declare("mod" + std::to_string(k)));
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

Result<ExprPtr> SchemaCompiler::compile_number(bool integer, const json& s,
                                               const std::string& where) {
    if (s.contains("multipleOf")) {
        const json& m = s["multipleOf"];
        if (!m.is_number() || !(m.get<double>() > 0)) {
            return bad(where + "/multipleOf", "must be a number above 0");
        }
        const double k = m.get<double>();
        constexpr double kMaxModulus = 1000;
        for (const char* b : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
            if (s.contains(b))
                return unsupported(where + "/multipleOf",
                                   "multipleOf together with " + std::string(b));
        }
        if (std::floor(k) != k || k > kMaxModulus) {
            return unsupported(where + "/multipleOf",
                               "multipleOf other than an integer up to 1000");
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
        bool is_min =
            k[0] == 'm' ? std::string(k) == "minimum" : std::string(k) == "exclusiveMinimum";
        bool exclusive = k[0] == 'e';
        int64_t bound = 0;
        if (!std::isfinite(d) || std::fabs(d) > 9e15)
            return unsupported(where + "/" + k, "a bound this large");
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
        if (ok)
            alts.push_back(e_seq(
                {int_range(true, std::max<int64_t>(has_lo ? lo : 0, 0), has_hi, hi - 1), frac}));
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

ExprPtr SchemaCompiler::int_range(bool has_lo, int64_t lo, bool has_hi, int64_t hi) {
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

Result<std::pair<uint64_t, uint64_t>> SchemaCompiler::count_bounds(const json& s,
                                                                   const std::string& where,
                                                                   const char* min_key,
                                                                   const char* max_key) {
    std::pair<uint64_t, uint64_t> out{0, UINT64_MAX};
    for (const char* k : {min_key, max_key}) {
        if (!s.contains(k)) continue;
        const json& v = s[k];
        if (!v.is_number() || v.get<double>() < 0 ||
            std::floor(v.get<double>()) != v.get<double>()) {
            return bad(where + "/" + k, "must be a non-negative integer");
        }
        const double d = v.get<double>();
        if (d > options_.limits.max_repeat) {
            return resource_exhausted(
                "JSON schema at '#" + where + "/" + k +
                "': " + std::to_string(static_cast<uint64_t>(std::min(d, 1e19))) +
                " above the limit of " + std::to_string(options_.limits.max_repeat));
        }
        (k == min_key ? out.first : out.second) = static_cast<uint64_t>(d);
    }
    return out;
}

Result<ExprPtr> SchemaCompiler::compile_string(const json& s, const std::string& where) {
    bool has_len = s.contains("minLength") || s.contains("maxLength");
    DSI_ASSIGN_OR_RETURN(auto len, count_bounds(s, where, "minLength", "maxLength"));
    const uint32_t min_len = static_cast<uint32_t>(len.first);
    const uint32_t max_len =
        len.second == UINT64_MAX ? kUnbounded : static_cast<uint32_t>(len.second);
    std::string format =
        options_.format_assertion && s.contains("format") && s["format"].is_string()
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

ExprPtr SchemaCompiler::format_rule(const std::string& format) {
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

const std::map<std::string, std::string>& SchemaCompiler::format_regexes() {
    // Subsets of each format's language (sound: everything matched is valid).
    static const std::map<std::string, std::string> k = [] {
        std::string leap =
            "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)";
        std::string date =
            "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-"
            "(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|" +
            leap + "-02-29)";
        std::string time =
            "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-"
            "3]):[0-5][0-9])";
        // Domain labels of e-mail addresses, letters in either case (as ajv-formats).
        std::string label = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?";
        // Host names: up to 4 labels of up to 62 characters (at most 251 in all,
        // within the 253 of RFC 1123).
        std::string host_label = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,60}[a-zA-Z0-9])?";
        // RFC 3339 appendix A durations (exact).
        std::string dur_s = "[0-9]+S", dur_m = "[0-9]+M(?:" + dur_s + ")?",
                    dur_h = "[0-9]+H(?:" + dur_m + ")?",
                    dur_t = "T(?:" + dur_h + "|" + dur_m + "|" + dur_s + ")", dur_d = "[0-9]+D",
                    dur_mo = "[0-9]+M(?:" + dur_d + ")?", dur_y = "[0-9]+Y(?:" + dur_mo + ")?";
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
                          sub + "]|" + pct + ")*(?::[0-9]*)?(?:/" + pchar + "*)*(?:\\?(?:" + pchar +
                          "|[/?])*)?(?:#(?:" + pchar + "|[/?])*)?";
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
            {"email", "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:" +
                          label + "\\.)+" + label},
            {"uuid", h + "{8}-" + h + "{4}-" + h + "{4}-" + h + "{4}-" + h + "{12}"},
            {"uri", uri},
            {"uri-template", uri_template},
            {"ipv4", octet + "\\." + octet + "\\." + octet + "\\." + octet},
            {"ipv6", "(?:" + h + "{1,4}:){7}" + h + "{1,4}"},
            {"hostname", host_label + "(?:\\." + host_label + "){0,3}"},
            {"duration", "P(?:(?:" + dur_d + "|" + dur_mo + "|" + dur_y + ")(?:" + dur_t + ")?|" +
                             dur_t + "|[0-9]+W)"},
        };
    }();
    return k;
}

Result<std::optional<std::vector<json>>> SchemaCompiler::finite_values(const json& s_in,
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

Result<ExprPtr> SchemaCompiler::unique_array(const json& s, const std::string& where, uint64_t min,
                                             uint64_t max) {
    const std::string why =
        "keyword 'uniqueItems' (supported when every element that can occur is one of a "
        "known finite set: enum, const, boolean, null)";
    std::vector<std::vector<json>> domains;  // per index below n; then `items`
    const size_t n =
        s.contains("prefixItems") && s["prefixItems"].is_array() ? s["prefixItems"].size() : 0;
    for (size_t i = 0; i < n && i < max; ++i) {
        DSI_ASSIGN_OR_RETURN(auto d, finite_values(s["prefixItems"][i],
                                                   where + "/prefixItems/" + std::to_string(i)));
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

Result<ExprPtr> SchemaCompiler::compile_array(const json& s, const std::string& where, int depth) {
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
            DSI_ASSIGN_OR_RETURN(
                ExprPtr e, compile(p[i], where + "/prefixItems/" + std::to_string(i), depth + 1));
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
        return resource_exhausted("JSON schema at '#" + where +
                                  "/maxItems': " + std::to_string(max) + " above the limit of " +
                                  std::to_string(options_.limits.max_repeat));
    }
    uint32_t rmax = rest_max == UINT64_MAX ? kUnbounded : static_cast<uint32_t>(rest_max);
    auto tail = [&](bool first) -> ExprPtr {
        if (first) {
            if (rmax == 0) return e_empty();
            ExprPtr more = e_repeat(e_seq({sep_char(','), item}),
                                    rest_min > 0 ? static_cast<uint32_t>(rest_min - 1) : 0,
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

ExprPtr SchemaCompiler::key_not_in(const std::vector<std::string>& keys) {
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
            alts.push_back(
                e_seq({codepoints_expr(used.complement(), CharEncoding::kJsonString), rest}));
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

ExprPtr SchemaCompiler::non_plain_then_tail(const CodepointSet& plain) {
    if (non_plain_rule_ == kNoRule) {
        non_plain_rule_ = builder_.declare("key_char_not_plain");
        builder_.define(
            non_plain_rule_,
            e_seq({codepoints_expr(CodepointSet::all().minus(plain), CharEncoding::kJsonString),
                   string_tail()}));
    }
    return e_rule(non_plain_rule_);
}

bool SchemaCompiler::name_matches(const std::string& name, const ExprPtr& e) {
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
            case Expr::Kind::kEmpty:
                return in;
            case Expr::Kind::kFail:
                return out;
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
            case Expr::Kind::kRule:
                return std::vector<char>(in.size(), 1);  // unknown: maybe
        }
        return out;
    };
    return ends(*e, start).back() != 0;
}

bool SchemaCompiler::is_trivial_schema(const json& s) {
    if (s.is_boolean()) return s.get<bool>();
    if (!s.is_object()) return false;
    for (auto it = s.begin(); it != s.end(); ++it) {
        if (is_constraint(it.key())) return false;
    }
    return true;
}

Result<ExprPtr> SchemaCompiler::compile_all(const json& schemas, const std::string& where,
                                            int depth) {
    if (schemas.empty()) return value_rule();
    if (schemas.size() == 1) return compile(schemas[0], where, depth + 1);
    json all = {{"allOf", schemas}};
    return compile(all, where, depth + 1);
}

Result<ExprPtr> SchemaCompiler::compile_object(const json& s, const std::string& where, int depth) {
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
            auto r = compile_regex(it.key(), RegexMatch::kSearch, CharEncoding::kJsonString,
                                   options_.limits);
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
            return unsupported(
                where + "/additionalProperties",
                "a schema (other than true / false) together with patternProperties");
        } else {
            DSI_ASSIGN_OR_RETURN(additional,
                                 compile(a, where + "/additionalProperties", depth + 1));
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
    auto key_literal = [](const std::string& k) {
        return json(k).dump(-1, ' ', false, json::error_handler_t::replace);
    };
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
                DSI_ASSIGN_OR_RETURN(v, compile_all(nontrivial_pattern_schemas,
                                                    where + "/patternProperties", depth));
            }
            branches.push_back(
                e_seq({e_byte('"'), patterns[i].key, e_byte('"'), sep_char(':'), v}));
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
            ExprPtr kv =
                e_seq({e_literal(key_literal(props[i].first)), sep_char(':'), props[i].second});
            ExprPtr own = e_seq({kv, e_rule(m_rule[i + 1])});
            builder_.define(k_rule[i], required[i] ? own : e_alt({own, e_rule(k_rule[i + 1])}));
        }
        ExprPtr more = e_seq({sep_char(','), e_rule(k_rule[i])});
        builder_.define(m_rule[i], empty_ok[i] ? e_alt({more, e_empty()}) : more);
    }
    ExprPtr first = empty_ok[0] ? e_alt({e_rule(k_rule[0]), e_empty()}) : e_rule(k_rule[0]);
    return e_seq({open_char('{'), first, close_char('}')});
}

Result<ExprPtr> SchemaCompiler::any_order_members(
    const std::string& where, const std::vector<std::pair<std::string, ExprPtr>>& props,
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

Result<ExprPtr> SchemaCompiler::counted_members(
    const json& s, const std::string& where,
    const std::vector<std::pair<std::string, ExprPtr>>& props, const std::vector<bool>& required,
    const ExprPtr& add_kv) {
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
                    ExprPtr first = e_seq(
                        {add_kv, e_repeat(more_item, rmin > 0 ? static_cast<uint32_t>(rmin - 1) : 0,
                                          mx == kUnbounded ? kUnbounded : mx - 1)});
                    out = rmin == 0 ? e_opt(first) : first;
                }
            }
        } else {
            ExprPtr kv =
                e_seq({e_literal(key_literal(props[i].first)), sep_char(':'), props[i].second});
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

}  // namespace dsi::grammar::internal
