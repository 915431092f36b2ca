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
// Masks. A token is allowed when at least one stack of the state takes all its bytes,
// so the mask is the union over stacks. Per stack-top position p (a byte-class
// element) the compiled grammar holds p's context-independent token sets
// (PositionTokens, the idea of XGrammar's adaptive token mask cache): walking the
// vocabulary trie from the stack [p | unknown caller], a token is
//   - accepted when some path consumes all its bytes without returning from p's rule
//     (then every real caller accepts it too),
//   - rejected when every path dies inside the rule,
//   - uncertain otherwise (some path returns to the unknown caller first).
// fill_mask() ORs the accepted set of each stack's top and checks only the uncertain
// tokens against the real stack (a walk over them in trie order, sharing prefixes and
// skipping tokens that share a failed prefix). The tables are built per position on
// first use, or all at compile time by precompute() (the compile service does that).
// plain_walk_mask() is the reference: a depth-first walk of the whole trie from the
// full state, pruning a subtree at the first byte no stack takes.
// On top, whole masks are cached in the CompiledGrammar keyed by the state's
// structure (the position chains of its stacks), so a state seen before — by this
// request or any other using the same compiled grammar — costs a lookup and a copy.
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

struct PositionTokens;
class PositionTableCache;

struct MatcherOptions {
    size_t max_stacks = 4096;              // per state; more is a grammar error
    size_t mask_cache_entries = 4096;      // per compiled grammar (16 KB each at 129K)
    // Memory for PositionTokens tables per compiled grammar; positions past it use the
    // plain trie walk (correct, slower).
    size_t max_position_table_bytes = size_t{256} << 20;
    // The compile service builds every position's table at compile time (else on
    // first use; see docs/grammar.md for the trade-off).
    bool precompute = false;
    // Tables shared by structure across positions and compiled grammars (nullptr: a
    // private cache per compiled grammar). shared_ptr: the compile service and every
    // compiled grammar it makes hold it.
    std::shared_ptr<PositionTableCache> table_cache;
};

// Context-independent token sets of one stack-top position (see the file comment).
// Accepted ids are stored densely (one bit per id) or as a sorted list, whichever is
// smaller; uncertain tokens as indices into Vocabulary::trie_tokens() in pre-order
// with the number of leading bytes each shares with the previous one.
struct PositionTokens {
    std::vector<uint64_t> accepted_bits;
    std::vector<int32_t> accepted_ids;
    std::vector<uint32_t> uncertain;
    std::vector<uint8_t> uncertain_lcp;
    size_t num_bytes() const {
        return accepted_bits.size() * 8 + accepted_ids.size() * 4 + uncertain.size() * 5;
    }
};

// Tables keyed by position structure: the grammar reachable from a position until
// its rule returns (byte classes by value, rules renumbered in visit order) plus the
// vocabulary fingerprint, so equal keys have equal tables. A JSON string or number
// rule is built once per process, not once per schema or per property.
// Bounded by bytes; when full, new tables are used unshared (no eviction).
// Thread model: internally locked; any thread.
class PositionTableCache {
public:
    explicit PositionTableCache(size_t max_bytes = size_t{512} << 20) : max_bytes_(max_bytes) {}
    std::shared_ptr<const PositionTokens> find(const std::string& key) const;
    // Returns the cached table for `key` (the existing one if another thread won).
    std::shared_ptr<const PositionTokens> insert(const std::string& key,
                                                 std::shared_ptr<const PositionTokens> table);
    struct Stats {
        int64_t hits = 0;
        int64_t misses = 0;
        int64_t entries = 0;
        int64_t bytes = 0;
    };
    Stats stats() const;

private:
    size_t max_bytes_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, std::shared_ptr<const PositionTokens>> map_;  // GUARDED_BY(mu_)
    size_t bytes_ = 0;                                                            // GUARDED_BY(mu_)
    mutable int64_t hits_ = 0;                                                    // GUARDED_BY(mu_)
    mutable int64_t misses_ = 0;                                                  // GUARDED_BY(mu_)
};

class GrammarMatcher;

class CompiledGrammar {
public:
    CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocab,
                    MatcherOptions options = {});
    ~CompiledGrammar();
    CompiledGrammar(const CompiledGrammar&) = delete;
    CompiledGrammar& operator=(const CompiledGrammar&) = delete;

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

    // PositionTokens of byte-class element `pos`, or nullptr when not built yet.
    // The returned table lives as long as this CompiledGrammar.
    const PositionTokens* position_tokens(uint32_t pos) const {
        return tables_[slot_of_pos_[pos]].load(std::memory_order_acquire);
    }
    // Publishes a table for `pos` (the first one stored wins) and returns the
    // published one; nullptr when the memory bound is reached (caller walks instead).
    const PositionTokens* store_position_tokens(
        uint32_t pos, std::shared_ptr<const PositionTokens> table) const;
    // Structure key of position `pos` for the table cache ("" when the reachable
    // grammar is too large to be worth sharing) when its table is built from the first
    // `levels` positions of its static continuation (below), then an unknown caller.
    // first_byte >= 0: the walk takes only that byte first (the key writes the
    // position's own class as {first_byte}: equal to the key of a position whose class
    // is that byte and whose grammar is the same, and so is its table). Keys longer
    // than max_key_bytes are "".
    std::string position_key(uint32_t pos, size_t levels, int first_byte = -1,
                             size_t max_key_bytes = kMaxKeyBytes) const;
    static constexpr size_t kMaxKeyBytes = 16384;
    // Static continuation of the rule holding class position `pos`: the positions a
    // stack continues at after that rule returns, innermost first, ending in
    // kChainAccept (the grammar's end) or kChainUnknown (a caller that differs between
    // stacks). A rule referenced from exactly one place (tail self-references aside)
    // always returns there, so every stack whose top is in it has this chain below it.
    // Tables built from the chain leave fewer tokens context-dependent.
    static constexpr uint32_t kChainAccept = UINT32_MAX;
    static constexpr uint32_t kChainUnknown = UINT32_MAX - 1;
    const std::vector<uint32_t>& continuation(uint32_t pos) const {
        return chains_[rule_of_slot_[slot_of_pos_[pos]]];
    }
    PositionTableCache& table_cache() const { return *table_cache_; }
    // Builds the table of `pos` (see GrammarMatcher). Builds of one compiled grammar are
    // serialised and share one memo session (walk states and subtree results), so the
    // n-th table of a grammar mostly replays what earlier walks found.
    // first_byte >= 0: only the tokens that start with that byte.
    std::unique_ptr<PositionTokens> build_table(uint32_t pos, size_t levels,
                                                int first_byte = -1) const;
    // The table of `pos` from `levels` positions of its continuation, given `fewer`, a
    // table of the same position from fewer levels: only fewer's uncertain tokens are
    // stepped (through the same builder as build_table).
    std::unique_ptr<PositionTokens> refine_table(uint32_t pos, size_t levels,
                                                 const PositionTokens& fewer) const;
    // The table of `pos` from `levels` positions of its continuation, given `longer`, a
    // table of a position that behaves as `pos` for every token of at most `max_bytes`
    // bytes and accepts a superset of what `pos` accepts: only `longer`'s uncertain
    // tokens and its accepted ones longer than max_bytes are stepped.
    std::unique_ptr<PositionTokens> narrow_table(uint32_t pos, size_t levels, size_t max_bytes,
                                                 const PositionTokens& longer) const;
    // For a position in the link O_k of a bounded repetition (link_items_) with k at
    // most max_token_bytes + 1: the same position in O_{k+1} when that link exists and
    // has the same continuation, else kNoPosition. Within a token of at most k bytes
    // the two behave alike (neither reaches its bound), and O_k accepts a subset of
    // what O_{k+1} does, so O_k's table is O_{k+1}'s narrowed by the tokens longer than
    // k bytes (narrow_table): a bounded string of length N builds its tables from the
    // unbounded loop's shared one, not one vocabulary walk per character (issue 21:
    // the last ~128 characters of a maxLength 140 string were the slowest mask steps).
    static constexpr uint32_t kNoPosition = UINT32_MAX;
    uint32_t longer_link_position(uint32_t pos) const;
    // k when `pos` lies in the link O_k of a bounded repetition, else 0.
    uint32_t link_items_at(uint32_t pos) const {
        return link_items_[rule_of_slot_[slot_of_pos_[pos]]];
    }
    // Byte-class element positions (the possible stack tops).
    const std::vector<uint32_t>& class_positions() const { return class_positions_; }
    struct TableStats {
        int64_t positions = 0;  // class positions in the grammar
        int64_t built = 0;      // tables built
        int64_t bytes = 0;      // their memory
        int64_t num_uncertain = 0;
        int64_t narrowed = 0;  // built by narrow_table() (bounded repetitions)
    };
    TableStats table_stats() const;

private:
    void compute_chains(const std::vector<bool>& reached);
    // The table builder, made on first use. REQUIRES: builder_mu_ held.
    GrammarMatcher& builder() const;
    // Finds the links of bounded repetitions (see link_items_, link_longer_).
    // REQUIRES: compute_chains() ran.
    void compute_links(const std::vector<bool>& reached);
    // Sets key_floor_bytes_. REQUIRES: compute_links() ran.
    void compute_key_floors();

    Grammar grammar_;
    std::shared_ptr<const Vocabulary> vocab_;
    MatcherOptions options_;
    std::vector<uint32_t> class_positions_;
    std::vector<uint32_t> slot_of_pos_;  // element position -> slot (class elements only)
    std::vector<uint32_t> rule_of_slot_;  // slot -> the rule holding that position
    std::vector<std::vector<uint32_t>> chains_;  // per rule: continuation() (unreached: unknown)
    // Per rule: k when it is the link O_k of a bounded repetition of byte-class items
    // (O_k ::= item O_{k-1} | "", O_1 ::= item | "", every item alternative one or
    // more byte classes: at most k items, each at least one byte), else 0. Within a
    // token (at most max_token_bytes bytes) O_k with k above that bound behaves as the
    // unbounded loop over the same item, so position_key() writes it as that loop and
    // every such position shares one table: a string with maxLength 1,024 built a
    // new table at each character (~10 ms each; issue 21).
    std::vector<uint32_t> link_items_;
    // Per link rule O_k: the link O_{k+1} that refers to it with the same items and
    // continuation (longer_link_position()), else kNoRule.
    static constexpr uint32_t kNoRule = UINT32_MAX;
    std::vector<uint32_t> link_longer_;
    // Per rule: a lower bound of the bytes position_key() spends (counted with every
    // class whole, as its caps are) on the rules reachable from it: its own
    // alternatives and those of the heaviest chain of rule components below it. A
    // position referring to a rule whose floor is above the cap gets "" at once
    // instead of after writing up to 16 KB (issue 21: 111,503 such keys, 1.4 s of the
    // real-world corpus's 17 s of masks, most in its slowest steps).
    std::vector<uint64_t> key_floor_bytes_;
    std::unique_ptr<std::atomic<const PositionTokens*>[]> tables_;
    std::shared_ptr<PositionTableCache> table_cache_;
    mutable std::vector<std::shared_ptr<const PositionTokens>> owned_tables_;  // GUARDED_BY(mu_)
    mutable size_t table_bytes_ = 0;                                     // GUARDED_BY(mu_)
    mutable int64_t table_uncertain_ = 0;                                // GUARDED_BY(mu_)
    mutable std::mutex mu_;
    mutable std::unordered_map<std::string, std::vector<uint64_t>> cache_;  // GUARDED_BY(mu_)
    mutable std::mutex builder_mu_;
    mutable std::unique_ptr<GrammarMatcher> builder_;  // GUARDED_BY(builder_mu_)
    mutable std::atomic<int64_t> hits_{0};
    mutable std::atomic<int64_t> misses_{0};
    mutable std::atomic<int64_t> num_narrowed_{0};
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
    // Same without the whole-mask cache (tests, benchmarks); uses position tables.
    void fill_mask_uncached(TokenBitmask* mask);
    // Reference: plain trie walk from the whole state, no tables, no cache.
    void plain_walk_mask(TokenBitmask* mask);
    // Builds the PositionTokens of every class position not built yet (the
    // compile-time precomputation).
    void precompute();
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
    friend class CompiledGrammar;
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
    // Parent of the stack a PositionTokens table is built from: the unknown caller.
    static constexpr uint32_t kContext = UINT32_MAX - 1;

    uint32_t node(uint32_t pos, uint32_t parent);
    void truncate_pool(size_t mark);
    void rehash();
    // Stacks after consuming `b` from `in`, into `out` (cleared first).
    void step(std::span<const uint32_t> in, uint8_t b, std::vector<uint32_t>* out);
    void expand(uint32_t pos, uint32_t parent, std::vector<uint32_t>* out, int depth);
    void initial_state();
    std::string state_key(std::span<const uint32_t> stacks) const;
    bool advance_state_bytes(std::string_view bytes, std::vector<uint32_t>* stacks);
    void ensure_levels();
    // Depth-first trie walk from `stacks`: on_live(i) for each trie node whose bytes
    // some stack takes; on_dead(i, reached_context) for the root of each subtree no
    // stack takes (then skipped); reached_context: some path returned to kContext.
    // memo: states are interned and transitions memoised (memo_begin() .. memo_end()
    // session; the pool keeps every node until memo_end()).
    // on_enter(i, state) (memo walks): before a live node's subtree; true skips it
    // (the caller accounted for it). state: memo state id | kCtxBit.
    // first_byte >= 0: only the subtree of that byte.
    template <class Live, class Dead, class Enter>
    void walk(std::span<const uint32_t> stacks, bool memo, Live on_live, Dead on_dead,
              Enter on_enter, int first_byte = -1);
    void memo_begin();
    void memo_end();
    uint32_t memo_intern(const std::vector<uint32_t>& stacks);
    // Next state id | kCtxBit when a path returned to kContext; 0 = dead.
    uint32_t memo_step(uint32_t sid, uint8_t b);
    // Sets in `mask` every token some stack of `stacks` takes (plain trie walk).
    void walk_trie(std::span<const uint32_t> stacks, TokenBitmask* mask);
    // From the first `levels` positions of the position's static continuation, then
    // an unknown caller.
    // first_byte >= 0: only the tokens that start with that byte.
    std::unique_ptr<PositionTokens> build_position_tokens(uint32_t pos, size_t levels,
                                                          int first_byte = -1);
    // The stack a table of `pos` from `levels` continuation positions is built from.
    uint32_t table_start(uint32_t pos, size_t levels);
    std::unique_ptr<PositionTokens> refine_position_tokens(uint32_t pos, size_t levels,
                                                           const PositionTokens& fewer);
    std::unique_ptr<PositionTokens> narrow_position_tokens(uint32_t pos, size_t levels,
                                                           size_t max_bytes,
                                                           const PositionTokens& longer);
    // Steps each candidate (trie_tokens() indices in trie order; lcps[i]: the leading
    // bytes candidate i shares with candidate i - 1) from the table start of `pos`
    // through the memo session: alive after its last byte -> *accepted; dead after
    // some path returned to the unknown caller -> table->uncertain; else rejected.
    void step_candidates(uint32_t pos, size_t levels, std::span<const uint32_t> candidates,
                         std::span<const uint8_t> lcps, std::vector<int32_t>* accepted,
                         PositionTokens* table);
    // The table of a bounded repetition's link from its longer neighbour's
    // (CompiledGrammar::longer_link_position), nullptr when `pos` is not such a link.
    std::unique_ptr<PositionTokens> from_longer_link(uint32_t pos);
    // The table of `pos` from the shared cache, else built (and offered to the cache).
    std::shared_ptr<const PositionTokens> cached_or_built(uint32_t pos, size_t levels);
    // The table of `pos` with an unknown caller right after its rule, put together from
    // one table per byte of its class (each shared by structure, so across grammars
    // whatever the rest of the class); nullptr for narrow classes and large grammars.
    std::shared_ptr<const PositionTokens> by_first_byte(uint32_t pos);
    const PositionTokens* table_for(uint32_t pos);
    // The table of a position whose sequence starts with a run of at least 2 byte
    // classes, from the trie along the run alone: tokens inside the run accepted,
    // leaving it rejected, going past it uncertain (checked on the real stack, so
    // exact whatever follows). No key, no walk. nullptr when more than
    // kMaxRunUncertain tokens would be uncertain or kMaxRunNodes trie nodes visited.
    std::unique_ptr<PositionTokens> run_tokens(uint32_t pos);
    // Sets the uncertain tokens of `t` that stack `id` takes.
    void check_uncertain(uint32_t id, const PositionTokens& t, TokenBitmask* mask);

    std::shared_ptr<const CompiledGrammar> compiled_;
    const Grammar* g_;
    const std::vector<uint32_t>* elems_;
    const std::vector<ByteSet>* classes_;
    std::vector<Node> nodes_;
    std::vector<uint32_t> slots_;  // open addressing, node id + 1; 0 = empty
    std::vector<State> history_;
    // Expansion scratch of one step() / initial_state(), stamped with expand_gen_ so
    // each check is O(1): the linear scans made a step over a state with N stacks cost
    // O(N^2) (objects with ~100 optional properties: ~40 us per step, tens of ms per
    // table walk; issue 21).
    void begin_expansion();
    // Marks the rule reference at `pos` expanded with `parent`; false if it was already
    // (a nullable cycle, or the same continuation reached twice).
    bool mark_visited(uint32_t pos, uint32_t parent);
    struct VisitSlot {
        uint64_t key;  // pos << 32 | parent
        uint32_t gen;
    };
    uint32_t expand_gen_ = 0;
    std::vector<uint32_t> out_gen_;          // per node id: stamp when added to the output
    std::vector<VisitSlot> visit_slots_;     // open addressing on (pos, parent)
    size_t num_visited_ = 0;
    bool overflow_ = false;
    bool reached_context_ = false;  // an expansion returned to kContext
    std::vector<std::vector<uint32_t>> levels_;  // trie walk scratch per depth
    std::vector<size_t> level_marks_;
    std::vector<uint8_t> ctx_;  // per depth: some path returned to kContext
    std::vector<uint32_t> sid_;  // per depth: memo state id
    struct VecHash {
        size_t operator()(const std::vector<uint32_t>& v) const;
    };
    static constexpr uint32_t kCtxBit = 1u << 31;
    static constexpr uint32_t kUnknownTrans = UINT32_MAX;
    bool memo_active_ = false;
    size_t memo_mark_ = 0;
    std::vector<std::vector<uint32_t>> memo_states_;
    std::vector<ByteSet> memo_first_;  // per memo state: the bytes some stack takes
    std::unordered_map<std::vector<uint32_t>, uint32_t, VecHash> memo_index_;
    // memo_step() results by state and byte, in blocks of 64 states kept across
    // sessions: one growing vector reallocated (and page-faulted) megabytes at each
    // doubling, a stall of ~10 ms inside some mask step (issue 21).
    static constexpr uint32_t kTransBlockShift = 6;
    std::vector<std::vector<uint32_t>> memo_trans_;  // copyable: matchers are copied
    size_t num_memo_trans_states_ = 0;
    uint32_t& trans(uint32_t sid, uint8_t b) {
        return memo_trans_[sid >> kTransBlockShift]
                          [(size_t{sid & ((1u << kTransBlockShift) - 1)} << 8) | b];
    }
    // Token results of trie subtrees walked from a memo state (build_position_tokens):
    // key (state | ctx bit) << 32 | trie node. Valid for the memo session.
    struct SubtreeResult {
        std::vector<int32_t> accepted;
        std::vector<uint32_t> uncertain;  // trie_tokens indices
    };
    std::unordered_map<uint64_t, SubtreeResult> subtree_cache_;
    size_t subtree_bytes_ = 0;
    static constexpr size_t kMaxMemoStates = 20000;
    static constexpr size_t kMaxSubtreeBytes = size_t{64} << 20;
    static constexpr uint32_t kMinSubtreeTokens = 32;
    // by_first_byte(): classes of at least this many bytes, grammars whose key (with an
    // unknown caller) fits in this many bytes; cached_or_built() refines its table when
    // at most this many tokens stay uncertain.
    static constexpr int kMinSplitBytes = 8;
    static constexpr size_t kMaxSplitKeyBytes = 4096;
    static constexpr size_t kMaxRefineTokens = 2048;
    static constexpr size_t kMaxRunUncertain = 4;
    static constexpr size_t kMaxRunNodes = 2048;
    std::vector<uint32_t> scratch_a_, scratch_b_;
};

}  // namespace dsi::grammar
