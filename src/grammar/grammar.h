// Grammar: the one grammar representation behind every structured-output front end
// (EBNF, regex, JSON Schema; SPEC S-SO). Front ends build expression trees (Expr)
// per named rule; GrammarBuilder lowers them into a flat context-free grammar over
// BYTES: each rule is a list of alternatives, each alternative a sequence of
// elements, and an element is either a byte class (a set of bytes, one byte of
// input) or a reference to a rule. Unicode is handled by the front ends, which spell
// code-point classes as UTF-8 byte sequences.
//
// The matcher (matcher.h) runs this grammar as a nondeterministic pushdown
// automaton: a state is a set of stacks of grammar positions (graph-structured,
// hash-consed), advanced one byte at a time. That needs a grammar without left
// recursion (also through nullable prefixes); build() rejects one with a message
// naming the rules of the cycle.
//
// Limits (Limits below) bound grammar size so a pathological input gets a fast
// RESOURCE_EXHAUSTED instead of a memory blow-up.
//
// Thread model: Expr trees and Grammar are immutable values once built and may be
// shared by any number of threads; GrammarBuilder is single-owner.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"

namespace dsi::grammar {

// A set of bytes (256 bits).
struct ByteSet {
    uint64_t words[4] = {0, 0, 0, 0};

    bool test(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
    void set(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
    void set_range(uint8_t lo, uint8_t hi) {
        for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
    }
    bool empty() const { return (words[0] | words[1] | words[2] | words[3]) == 0; }
    bool operator==(const ByteSet&) const = default;
};

// Expression tree node. Shared (shared_ptr) because front ends reuse subtrees
// (a character class, a JSON value rule body) in many places; the builder lowers a
// shared subtree once.
struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

inline constexpr uint32_t kUnbounded = UINT32_MAX;

struct Expr {
    enum class Kind : uint8_t { kEmpty, kFail, kBytes, kSeq, kAlt, kRepeat, kRule };
    Kind kind = Kind::kEmpty;
    ByteSet bytes;                  // kBytes
    std::vector<ExprPtr> children;  // kSeq, kAlt; kRepeat: exactly one
    uint32_t min = 0;               // kRepeat
    uint32_t max = 0;               // kRepeat; kUnbounded for no upper bound
    uint32_t rule = 0;              // kRule: rule id from GrammarBuilder
};

ExprPtr e_empty();
ExprPtr e_fail();
ExprPtr e_bytes(const ByteSet& set);
ExprPtr e_byte(uint8_t b);
ExprPtr e_literal(std::string_view bytes);
ExprPtr e_seq(std::vector<ExprPtr> items);
ExprPtr e_alt(std::vector<ExprPtr> items);
ExprPtr e_repeat(ExprPtr item, uint32_t min, uint32_t max);
ExprPtr e_opt(ExprPtr item);
ExprPtr e_star(ExprPtr item);
ExprPtr e_plus(ExprPtr item);
ExprPtr e_rule(uint32_t rule_id);

// Bounds on what a compile may build (S-SO limits; issue 7 item 5).
struct Limits {
    size_t max_elements = size_t{1} << 21;  // flat grammar elements
    size_t max_rules = size_t{1} << 17;
    uint32_t max_repeat = 20000;  // largest finite bound of one {m,n}
    int max_nesting = 256;        // nesting depth of regex groups / schema subschemas
};

// Flat grammar. Element encoding (uint32): top two bits are the tag.
class Grammar {
public:
    static constexpr uint32_t kTagEnd = 0u << 30;
    static constexpr uint32_t kTagClass = 1u << 30;
    static constexpr uint32_t kTagRule = 2u << 30;
    static constexpr uint32_t kTagMask = 3u << 30;
    static constexpr uint32_t kEnd = kTagEnd;

    static uint32_t tag(uint32_t e) { return e & kTagMask; }
    static uint32_t payload(uint32_t e) { return e & ~kTagMask; }

    const std::vector<uint32_t>& elements() const { return elements_; }
    const std::vector<ByteSet>& classes() const { return classes_; }
    // Start positions (into elements()) of each alternative of rule `id`.
    const std::vector<uint32_t>& alternatives(uint32_t id) const { return rule_alts_[id]; }
    const std::string& rule_name(uint32_t id) const { return rule_names_[id]; }
    size_t num_rules() const { return rule_alts_.size(); }
    uint32_t root() const { return root_; }

    // Human-readable GBNF-like dump (tests, docs, debugging).
    std::string to_string() const;
    // Compact binary form and back (compiled grammars serialise; issue 7 item 3).
    std::string serialize() const;
    static Result<Grammar> deserialize(std::string_view bytes);

private:
    friend class GrammarBuilder;
    std::vector<uint32_t> elements_;
    std::vector<ByteSet> classes_;
    std::vector<std::vector<uint32_t>> rule_alts_;
    std::vector<std::string> rule_names_;
    uint32_t root_ = 0;
};

class GrammarBuilder {
public:
    explicit GrammarBuilder(const Limits& limits = {}) : limits_(limits) {}

    // A new rule; its body is given later with define(). Names are for messages.
    uint32_t declare(std::string name);
    // REQUIRES: `id` came from declare() and is not yet defined.
    void define(uint32_t id, ExprPtr body);
    bool is_defined(uint32_t id) const { return bodies_[id] != nullptr; }
    const std::string& name(uint32_t id) const { return names_[id]; }
    size_t num_rules() const { return names_.size(); }
    const Limits& limits() const { return limits_; }

    // Lowers every rule; checks that all rules are defined, sizes are in limits and
    // there is no left recursion; drops alternatives that can never complete (so a
    // matcher never enters a dead end). INVALID_ARGUMENT when the root derives nothing.
    Result<Grammar> build(uint32_t root);

private:
    Status lower_rule(uint32_t id);
    // Appends the symbols of `e` to `out`; false when `e` can never match.
    Result<bool> append_symbols(const ExprPtr& e, std::vector<uint32_t>* out);
    // Alternatives (symbol sequences) of `e`.
    Result<std::vector<std::vector<uint32_t>>> alternatives_of(const ExprPtr& e);
    Result<uint32_t> aux_rule_for(const ExprPtr& e);
    Result<uint32_t> repeat_tail_rule(const ExprPtr& item_expr, uint32_t item_sym,
                                      uint32_t count);  // count == kUnbounded: star
    Result<uint32_t> single_symbol(const ExprPtr& e, bool* never);
    uint32_t class_id(const ByteSet& set);
    Status check_size() const;
    void inline_byte_rules();
    Status check_left_recursion() const;
    Status drop_unproductive(uint32_t root);

    Limits limits_;
    std::vector<std::string> names_;
    std::vector<ExprPtr> bodies_;
    std::vector<std::vector<std::vector<uint32_t>>> lowered_;  // rule -> alts -> symbols
    std::vector<bool> lowered_done_;
    std::unordered_map<const Expr*, uint32_t> aux_rules_;
    std::unordered_map<const Expr*, std::unordered_map<uint32_t, uint32_t>> tail_rules_;
    // The O_k rules of bounded repetitions (O_k ::= item O_{k-1} | ""): their item is
    // inlined like a loop body's (inline_byte_rules).
    std::unordered_set<uint32_t> counted_rules_;
    std::vector<ByteSet> classes_;
    std::unordered_map<std::string, uint32_t> class_index_;
    size_t num_symbols_ = 0;
};

}  // namespace dsi::grammar
