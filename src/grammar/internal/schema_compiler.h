// SchemaCompiler: the JSON Schema -> grammar compiler behind grammar/json_schema.h,
// split by concept over json_schema.cc (structure, shared rules, $ref, merging, the
// compile() dispatch), json_schema_combinators.cc (dependencies, if / then / else, not,
// oneOf separation, enum / const) and json_schema_types.cc (numbers, strings, formats,
// arrays, objects). Internal to grammar/.
// Thread model: one compiler per compilation, on one thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/check.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/unicode_set.h"

namespace dsi::grammar::internal {

using json = nlohmann::ordered_json;

// Keywords that constrain instances (draft 2020-12 and the older drafts' spellings).
// Every other keyword — annotations, vendor extensions (x-..., nullable, enumNames),
// typos — is ignored, as the specification says of unknown keywords.
const std::set<std::string>& constraint_keywords();
// Constraining keywords not compiled: UNIMPLEMENTED naming the keyword.
const std::set<std::string>& unsupported_keywords();

// Keywords that constrain ("then" / "else" only do through "if").
inline bool is_constraint(const std::string& k) { return constraint_keywords().count(k) > 0; }

// A property name as a JSON Pointer token (RFC 6901: ~ -> ~0, / -> ~1).
std::string escape_pointer(const std::string& s);
// The JSON Schema type of a value ("integer" for a float with no fraction).
std::string type_of(const json& v);

// The type names a `type` keyword lists (a string or an array of strings).
std::set<std::string> type_names(const json& t);

// JSON Schema equality: numbers by value (1 == 1.0), objects whatever their member
// order (ordered_json compares members in order, so compare unordered copies).
bool json_equal(const json& a, const json& b);

// Natural numbers (no leading zeros) with digit string in [x, y], same length.
ExprPtr same_length_range(const std::string& x, const std::string& y);

// Naturals in [a, b]; b < 0 means unbounded.
ExprPtr natural_range(uint64_t a, int64_t b);

class SchemaCompiler {
public:
    SchemaCompiler(const json& root, const JsonSchemaOptions& options)
        : root_(root), options_(options), builder_(options.limits) {}

    Result<Grammar> run() { return run_on(root_, ""); }

    // The grammar of `schema`, a subschema of the root at `where` ($refs resolve
    // against the root).
    Result<Grammar> run_on(const json& schema, const std::string& where);

private:
    Status unsupported(const std::string& where, const std::string& what) const {
        return unimplemented("JSON schema at '" + (where.empty() ? "#" : "#" + where) +
                             "': " + what + " is not supported");
    }
    Status bad(const std::string& where, const std::string& what) const {
        return invalid_argument("JSON schema at '" + (where.empty() ? "#" : "#" + where) +
                                "': " + what);
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
    ExprPtr value_rule();
    ExprPtr string_any();
    // The rest of a JSON string after its opening quote: characters, closing quote.
    // One rule for every string of the grammar (values, keys after their declared-name
    // prefix), called last in its alternative, so the mask tables' walks meet the same
    // states and share their results (matcher.h).
    ExprPtr string_tail();
    ExprPtr digits_expr(uint32_t min) {
        ByteSet d;
        d.set_range('0', '9');
        return e_repeat(e_bytes(d), min, kUnbounded);
    }
    // Canonical integer digits (-0 included).
    ExprPtr integer_digits() {
        ByteSet nz;
        nz.set_range('1', '9');
        return e_seq(
            {e_opt(e_byte('-')), e_alt({e_byte('0'), e_seq({e_bytes(nz), digits_expr(0)})})});
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
    ExprPtr integer_any();
    ExprPtr number_any();

    // ---- $ref ----------------------------------------------------------------------
    Result<const json*> resolve(const std::string& ref);

    Result<ExprPtr> ref_expr(const std::string& ref, const std::string& where);

    // ---- merging (allOf, $ref siblings, anyOf/oneOf with a base schema) -------------
    // Each member `side` declares that `other` does not declare must also hold `x`
    // (other's additionalProperties): rewrites side's `properties` in place.
    static void close_over(json* side, const json& other, const json& x);

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
    static bool merge_into(json* a, const json& b_in);

    // ---- the schema compiler --------------------------------------------------------
    Result<ExprPtr> compile(const json& s, const std::string& where, int depth);

    // ---- case splits: dependencies, if / then / else ---------------------------------
    // The union of `cases`, each the conjunction of its parts (merged as allOf is, $ref
    // and allOf inside a part folded in; a `false` part drops its case). The callers
    // make the cases disjoint (an object with / without a property, a condition held
    // / failed), so the union is exactly the schema. A case whose parts do not merge
    // is UNIMPLEMENTED naming `keyword`.
    Result<ExprPtr> compile_cases(const std::vector<std::vector<json>>& cases,
                                  const std::string& where, const std::string& keyword, int depth);

    static bool lists_name(const json& s, const char* k, const std::string& name);

    // `s` (no $ref / allOf left) never holds property `name` in an object: declared
    // false, or undeclared where undeclared members are forbidden.
    static bool forbids_name(const json& s, const std::string& name) {
        if (lists_name(s, "properties", name)) return s["properties"][name] == false;
        return s.value("additionalProperties", json(true)) == false &&
               !s.contains("patternProperties");
    }

    // The types other than object that `s` admits, as a `type` part ({} when none).
    std::optional<json> non_object_types(const json& s);

    // dependentRequired / dependentSchemas and draft 4's `dependencies` (a list of
    // names or a schema per name): each trigger name splits the objects into those
    // without it (`properties: {name: false}`) and those with it (`required: [name]`
    // and the dependency); other values hold none of it. Exact; a name the rest
    // requires or forbids takes one side only. 2^k cases for k undecided names,
    // so k is capped (kMaxCaseSplits).
    Result<ExprPtr> compile_dependencies(const json& s, const std::string& where, int depth);

    // if / then / else, where the `if` schema is decidable here: a conjunction of
    // conditions we can also negate -- `type`, `enum` / `const`, each `required`
    // name, and each `properties` entry (`not` of its schema as compile_not
    // supports: type, enum / const, ...). Cases: every condition holds (then), or
    // condition i fails while those before it hold (else): disjoint, so exact.
    // Other `if` keywords are UNIMPLEMENTED naming the keyword.
    Result<ExprPtr> compile_if(const json& s, const std::string& where, int depth);

    // `not` of simple schemas, folded into the rest of `s`: not {type: ...} removes
    // types; not {required: [k]} (an object without k); not {enum / const: strings}
    // beside a plain string type (any other string); not true / {} (nothing);
    // not false. Anything else is UNIMPLEMENTED.
    Result<std::optional<ExprPtr>> compile_not(const json& s, const std::string& where, int depth);

    // Integers (or numbers) other than the numbers in `values`, which must be integers
    // of at most 2^53: the ranges between them.
    Result<ExprPtr> numbers_not_in(bool integer, const json& values, const std::string& at,
                                   const std::string& where);

    // The parts whose conjunction `s` is: its own keywords, each allOf branch, each
    // $ref target (recursively). A $ref cycle through these is UNIMPLEMENTED.
    Status flatten_all(const json& s, const std::string& where, std::vector<json>* parts,
                       std::vector<std::string>* path, int depth);

    // compile(s) as a rule of its own, one per distinct schema text.
    Result<ExprPtr> compile_shared(const json& s, const std::string& where, int depth);

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
                             std::vector<json>* extra);

    // `s` (an effective schema) is a finite set of values: enum / const, beside `type`
    // at most.
    static bool only_values(const json& s);

    // Narrows *extra's enum to the values of `s` that `other` does not list.
    static void drop_shared_values(const json& s, const json& other, json* extra);

    // The JSON type whose values keyword k reads ("" for every type).
    static std::string type_read_by(const std::string& k);

    // `s` (an effective schema) admits every value of type t: it admits t and none of
    // its keywords but `type` reads values of t.
    bool accepts_every(const json& s, const std::string& t);

    // A property `other` requires and `s` does not (one `s` does not declare first):
    // forbidding it in `s` keeps `s` off every value of `other`.
    static std::optional<std::string> key_to_forbid(const json& s, const json& other);

    // `s` with its $ref / allOf parts merged (as compile() would), or `s` itself
    // when they do not merge.
    json effective_schema(const json& s, const std::string& where);

    // No value of type `t` can satisfy both a and b (decided on the keywords; false
    // when unsure): disjoint enum / const sets, or objects told apart by a property
    // both require with disjoint enum / const sets (a discriminator), or one requires
    // a property the other forbids.
    bool disjoint(const json& a, const json& b, const std::string& t);

    std::set<std::string> admitted_types(const json& s);

    // Which of `values` `schema` accepts, decided by compiling `schema` (exact where
    // it compiles; the grammar never accepts an invalid value, so a value it rejects
    // is at worst left out — sound).
    Result<std::vector<bool>> values_satisfying(const json& schema, const std::string& where,
                                                const std::vector<json>& values);

    Result<ExprPtr> compile_enum(const json& s, const std::string& where);

    Result<ExprPtr> compile_type(const std::string& t, const json& s, const std::string& where,
                                 int depth);

    // Integers that are multiples of k (canonical digits, optional zero fraction): a
    // remainder automaton over the decimal digits, one rule per remainder.
    ExprPtr multiples_of(uint32_t k);

    Result<ExprPtr> compile_number(bool integer, const json& s, const std::string& where);

    // Integers in [lo, hi] (either side may be open), canonical spelling.
    ExprPtr int_range(bool has_lo, int64_t lo, bool has_hi, int64_t hi);

    // [min, max] of a pair of counting keywords (minLength / maxLength, ...); max
    // UINT64_MAX when absent. A bound the grammar cannot count to is an error naming
    // the keyword and the limit (exact or rejected, never a silently weaker schema).
    Result<std::pair<uint64_t, uint64_t>> count_bounds(const json& s, const std::string& where,
                                                       const char* min_key, const char* max_key);

    Result<ExprPtr> compile_string(const json& s, const std::string& where);

    // One rule per format and schema: GitHub's webhook schemas have hundreds of
    // "format": "uri" fields, and lowering the uri grammar at each was most of the
    // front end's time (issue 21 corpus: p99 250 ms).
    ExprPtr format_rule(const std::string& format);

    static const std::map<std::string, std::string>& format_regexes();

    // The values `s` admits when they are a known finite set: its enum / const (those
    // its other keywords keep, decided by compiling it as compile_enum does), or every
    // value of null / boolean when those are its only types and nothing else reads
    // them; `false`: none. nullopt when `s` is not such a schema.
    Result<std::optional<std::vector<json>>> finite_values(const json& s_in,
                                                           const std::string& where);

    // uniqueItems over elements from known finite sets (finite_values of each
    // prefixItems entry and of `items`): R(S) = the rest of an array whose elements so
    // far are the value classes in S (values equal as JSON Schema compares them are
    // one class), so |S| is also the next index: "," and a value of a class not in S
    // that index admits, then R(S + it); or the end once |S| >= minItems. Exact (the
    // values as compile_enum writes them); one rule per reachable S, capped
    // (kMaxUniqueStates), else UNIMPLEMENTED naming uniqueItems.
    Result<ExprPtr> unique_array(const json& s, const std::string& where, uint64_t min,
                                 uint64_t max);

    Result<ExprPtr> compile_array(const json& s, const std::string& where, int depth);

    // A JSON string (canonical escaping) not equal to any of `keys`: the keys' trie,
    // leaving it for the shared string tail at the first character no key continues
    // with. Its own rule, whose alternatives all end in tail calls.
    ExprPtr key_not_in(const std::vector<std::string>& keys);

    // Any JSON string character outside `plain`, then the rest of the string: one rule
    // per grammar (key_not_in).
    ExprPtr non_plain_then_tail(const CodepointSet& plain);

    // Whether the JSON-string-encoded `name` (without quotes) is in the language of
    // `e` (a regex expression: no rule references). Names with bytes whose JSON
    // spelling could differ from the regex encoding's (controls, '"', '\\', non-ASCII)
    // answer true: callers use the answer conservatively.
    static bool name_matches(const std::string& name, const ExprPtr& e);

    static bool is_trivial_schema(const json& s);

    // The schema every one of `schemas` must hold at once (allOf; one schema as is).
    Result<ExprPtr> compile_all(const json& schemas, const std::string& where, int depth);

    Result<ExprPtr> compile_object(const json& s, const std::string& where, int depth);

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
                                      const std::vector<bool>& required, const ExprPtr& add_kv);

    // Object members with minProperties / maxProperties: T(i, k) = the members from
    // declared property i on, k members written so far (k counted up to the bound
    // that still matters), then the additional members, their number bounded so the
    // total is in [min, max].
    Result<ExprPtr> counted_members(const json& s, const std::string& where,
                                    const std::vector<std::pair<std::string, ExprPtr>>& props,
                                    const std::vector<bool>& required, const ExprPtr& add_kv);

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
    std::unordered_map<std::string, uint32_t> shared_rules_;              // compile_shared()
    std::unordered_map<std::string, uint32_t> format_rules_;              // format_rule()
    std::unordered_map<uint32_t, std::vector<uint32_t>> multiple_rules_;  // multiples_of()
    std::vector<std::pair<std::string, uint32_t>> pending_refs_;
};

}  // namespace dsi::grammar::internal
