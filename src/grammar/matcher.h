// Token-level matching of a compiled grammar: the per-request matcher the engine
// drives at each decode step (SPEC S-SO): fill_mask() -> sampling applies the mask
// (logits[i] = -inf where the bit is 0) -> advance(sampled id).
//
// Design. The grammar (grammar.h) runs as a nondeterministic pushdown automaton over
// bytes. A state is a set of stacks; a stack is a chain of nodes (grammar position,
// parent) in a per-matcher pool, hash-consed so equal stacks are one node id and a
// state is a small sorted vector of ids. Advancing by a byte moves every stack whose
// top byte class holds the byte and expands rule references / pops finished rules.
// The empty stack means "accepted": stop ids (EOS) are allowed only there.
//
// Masks. fill_mask() walks the vocabulary trie (vocabulary.h) depth-first, advancing
// the state byte by byte and pruning a whole subtree at the first byte no stack
// takes; speculative nodes are popped from the pool as the walk backs up. Results
// are cached in the CompiledGrammar keyed by the state's structure (the position
// chains of its stacks), so a state seen before — by this request or any other using
// the same compiled grammar — costs a hash lookup and a 16 KB copy.
//
// Speculative decoding: rollback(n) undoes the last n advances (history of states
// with pool marks); fill_draft_masks() gives the mask at every draft position.
//
// Thread model: CompiledGrammar is immutable but for its mask cache, which is
// internally locked; share it across threads. GrammarMatcher is single-owner.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"
#include "grammar/vocabulary.h"

namespace dsi::grammar {

// One bit per vocabulary id; bit set = token allowed.
class TokenBitmask {
public:
    TokenBitmask() = default;
    explicit TokenBitmask(int32_t vocab_size) { resize(vocab_size); }
    void resize(int32_t vocab_size) {
        size_ = vocab_size;
        words_.assign((static_cast<size_t>(vocab_size) + 63) / 64, 0);
    }
    void clear() { std::fill(words_.begin(), words_.end(), 0); }
    void set(int32_t id) { words_[id >> 6] |= uint64_t{1} << (id & 63); }
    bool test(int32_t id) const { return (words_[id >> 6] >> (id & 63)) & 1; }
    int32_t size() const { return size_; }
    int64_t count() const;
    std::span<uint64_t> words() { return words_; }
    std::span<const uint64_t> words() const { return words_; }
    bool operator==(const TokenBitmask&) const = default;

private:
    int32_t size_ = 0;
    std::vector<uint64_t> words_;
};

// logits[i] = -inf where mask bit i is 0 (ids past mask.size() are masked too).
void apply_token_bitmask(std::span<float> logits, const TokenBitmask& mask);

struct MatcherOptions {
    size_t max_stacks = 4096;              // per state; more is a grammar error
    size_t mask_cache_entries = 4096;      // per compiled grammar (16 KB each at 129K)
};

class CompiledGrammar {
public:
    CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocab,
                    MatcherOptions options = {});

    const Grammar& grammar() const { return grammar_; }
    const Vocabulary& vocab() const { return *vocab_; }
    const std::shared_ptr<const Vocabulary>& vocab_ptr() const { return vocab_; }
    const MatcherOptions& options() const { return options_; }

    // Mask cache (internally locked). Returns false on a miss.
    bool lookup_mask(const std::string& key, TokenBitmask* out) const;
    void store_mask(const std::string& key, const TokenBitmask& mask) const;
    struct CacheStats {
        int64_t hits = 0;
        int64_t misses = 0;
        int64_t entries = 0;
    };
    CacheStats cache_stats() const;

private:
    Grammar grammar_;
    std::shared_ptr<const Vocabulary> vocab_;
    MatcherOptions options_;
    mutable std::mutex mu_;
    mutable std::unordered_map<std::string, std::vector<uint64_t>> cache_;  // GUARDED_BY(mu_)
    mutable std::atomic<int64_t> hits_{0};
    mutable std::atomic<int64_t> misses_{0};
};

class GrammarMatcher {
public:
    // REQUIRES: grammar != nullptr.
    explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

    // Consumes one token. False (state unchanged) when the token is not allowed; a
    // stop id is allowed only when is_accepted() and then terminates the matcher.
    bool advance(int32_t token_id);
    // Consumes raw bytes as one step (tests, prompts that pre-fill output).
    bool advance_bytes(std::string_view bytes);
    // The allowed tokens now. REQUIRES: mask sized to the vocabulary (or larger).
    void fill_mask(TokenBitmask* mask);
    // Same without the cache (tests, benchmarks).
    void fill_mask_uncached(TokenBitmask* mask);
    // The output so far is a complete sentence of the grammar.
    bool is_accepted() const;
    // A stop id was consumed.
    bool is_terminated() const { return history_.back().terminated; }
    // No continuation exists (neither bytes nor stop) — only after a forced advance.
    bool is_dead() const { return history_.back().stacks.empty(); }
    // Undo the last n successful advances. OUT_OF_RANGE when n > num_steps().
    Status rollback(int n);
    int num_steps() const { return static_cast<int>(history_.size()) - 1; }
    // masks[i] = mask after draft[0..i) (masks.size() == draft.size() + 1). Draft
    // tokens past the first rejected one get an all-zero mask. The state is
    // unchanged afterwards. Returns the number of draft tokens accepted.
    int fill_draft_masks(std::span<const int32_t> draft, std::span<TokenBitmask> masks);

    const CompiledGrammar& compiled() const { return *compiled_; }

private:
    struct Node {
        uint32_t pos;
        uint32_t parent;
    };
    struct State {
        std::vector<uint32_t> stacks;  // sorted node ids; kAccept = the empty stack
        size_t pool_mark;
        bool terminated = false;
    };
    static constexpr uint32_t kNone = UINT32_MAX;

    uint32_t node(uint32_t pos, uint32_t parent);
    void truncate_pool(size_t mark);
    void rehash();
    // Stacks after consuming `b` from `in`, into `out` (cleared first).
    void step(std::span<const uint32_t> in, uint8_t b, std::vector<uint32_t>* out);
    void expand(uint32_t pos, uint32_t parent, std::vector<uint32_t>* out, int depth);
    void initial_state();
    std::string state_key(std::span<const uint32_t> stacks) const;
    bool advance_state_bytes(std::string_view bytes, std::vector<uint32_t>* stacks);

    std::shared_ptr<const CompiledGrammar> compiled_;
    const Grammar* g_;
    const std::vector<uint32_t>* elems_;
    const std::vector<ByteSet>* classes_;
    std::vector<Node> nodes_;
    std::vector<uint32_t> slots_;  // open addressing, node id + 1; 0 = empty
    std::vector<State> history_;
    std::vector<std::pair<uint32_t, uint32_t>> visited_;  // expansion cycle guard
    bool overflow_ = false;
    std::vector<std::vector<uint32_t>> levels_;  // trie walk scratch per depth
    std::vector<size_t> level_marks_;
    std::vector<uint32_t> scratch_a_, scratch_b_;
};

}  // namespace dsi::grammar
