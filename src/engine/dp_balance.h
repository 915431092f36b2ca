// DpBalancer: which rank of an --ep group runs a new request (attention data parallelism,
// issue 19; docs/comm.md "Attention data parallelism across the ranks"). A pure policy:
// no I/O, no clock — its state is exactly what rank 0 relays (every request starts,
// streams its tokens and finishes through rank 0's DpFront), so nothing in it is stale
// and no time is needed to age a report; sim/ can drive it as it is.
//
// Load rule: the rank with the fewest running sequences (a decode step's attention work
// and the group's lockstep are set by the busiest rank, so equal sequence counts keep
// the ranks' steps equally long); ties to the fewest KV tokens (prompt + generated, the
// attention reads and the block pool's fill), then to the fewest requests so far (requests
// that arrive one after another still take turns), then to the lowest rank. A request that
// must stay on rank 0 (grammar masks, n > 1, KV export: their state does not travel)
// counts on rank 0 like any other.
//
// Prefix rule (Options::prefix, `--ep-dp-routing prefix`, the default; SGLang's cache-aware
// DP router): each rank runs its own prefix cache, so a request that shares a prefix with
// one sent earlier is cheapest where that one ran. The balancer keeps, per rank, the
// prefix chain keys (kv/block_key.h: the keys the ranks' prefix index holds, one per full
// 128-token block, salted with the model identity and the request's cache_salt) of the
// token sequences it sent there (learn(): the prompt at the start, prompt + output at
// the finish, since a rank publishes the blocks its decode fills too). For a new request
// it counts, on every rank, the leading keys of the prompt's chain that rank holds (its
// matched prefix); the rank with the longest match wins (ties: the load rule among them)
// unless it is too loaded: its running sequences exceed the least-loaded rank's (the load
// rule's pick) by more than balance_abs_seqs AND by a factor above balance_rel (both, as
// SGLang's balance_abs_threshold / balance_rel_threshold); then, or when every rank
// matches as much (none, or a prefix all hold), the load rule. Defaults: 2 sequences and
// 1.25x, far tighter than SGLang's router (64, 1.5) between independent servers: the ranks
// of an --ep group step in lockstep, so a busier rank stretches every rank's step, and a
// loose bound starves the other ranks — one system prompt shared by every request sent
// all 32 requests of a multi-turn run to rank 0 with 8 (bench/RESULTS.md "Prefix-aware
// rank choice"); 2 lets the other ranks learn the shared prefix and keeps turns of one
// conversation on their rank.
//
// Bounded memory: at most max_blocks_per_rank keys per rank (default 65,536 = 8.4 M
// tokens, about 100 bytes each: ~6.5 MiB per rank), further capped by the rank's KV pool
// (set_pool_blocks: a rank cannot cache more full blocks than its pool holds). Ageing is
// LRU: learn() touches a chain leaf first, so a block is never older than the blocks that
// extend it, and the oldest key (a leaf) goes first, as the rank's pool evicts its least
// recently used cached block. The keys are what the front sent, not what the rank still
// holds (its pool also holds running sequences' blocks and evicts on its own): a match is
// a prediction; the rank's usage.cached_tokens is the truth.
// A rank that restarts (EP failover: resize; bench's fresh engines: forget) has an empty
// prefix cache, and its keys are forgotten.
//
// Thread model: one owner thread (the DpFront's).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_key.h"

namespace dsi::engine {

// (Outside the class: a default argument cannot use a nested type's member initializers.)
struct DpBalanceOptions {
    bool prefix = true;  // false: the load rule only (--ep-dp-routing load)
    int64_t balance_abs_seqs = 2;
    double balance_rel = 1.25;
    int64_t max_blocks_per_rank = int64_t{1} << 16;
};

class DpBalancer {
public:
    using Options = DpBalanceOptions;
    struct RankLoad {
        int64_t running_seqs = 0;
        int64_t kv_tokens = 0;
        int64_t requests = 0;  // assigned since the start
    };
    enum class Reason {
        kLoad,        // the load rule (load routing; or every rank matches as much)
        kPrefix,      // a rank holding the longest matched prefix (others hold less)
        kOverloaded,  // the longest match's rank was too loaded: the load rule
        kRankZero,    // the request must stay on rank 0
    };
    struct Choice {
        int rank = 0;
        int64_t matched_blocks = 0;  // of the prompt's chain, on `rank`
        Reason reason = Reason::kLoad;
    };
    // REQUIRES: num_ranks >= 1; options.max_blocks_per_rank >= 0, balance_abs_seqs >= 0,
    // balance_rel >= 1.
    explicit DpBalancer(int num_ranks, Options options = {});

    int num_ranks() const { return static_cast<int>(loads_.size()); }
    const Options& options() const { return options_; }
    // The rank for a new request: any rank when `any_rank`, else 0. `chain`: the prompt's
    // full-block chain keys (empty: no full block, or no prefix rule wanted).
    Choice pick(bool any_rank, std::span<const kv::BlockKey> chain = {}) const;
    // The leading keys of `chain` that `rank` holds.
    int64_t matched_blocks(int rank, std::span<const kv::BlockKey> chain) const;
    // `rank` was sent the token sequence whose full-block chain is `chain` (its prefix
    // cache will hold those blocks): touched, evicting the oldest keys past the cap.
    // A no-op without the prefix rule.
    void learn(int rank, std::span<const kv::BlockKey> chain);
    // `rank`'s KV pool has `blocks` blocks: its keys are capped at that too (<= 0: no
    // pool cap).
    void set_pool_blocks(int rank, int64_t blocks);
    // `rank` restarted with an empty prefix cache: its keys are gone.
    void forget(int rank);
    int64_t num_blocks(int rank) const {
        return static_cast<int64_t>(ranks_.at(static_cast<size_t>(rank)).lru.size());
    }

    void on_start(int rank, int64_t prompt_tokens);
    void on_token(int rank);
    void on_finish(int rank, int64_t tokens);
    // The group restarted with `num_ranks` (EP failover): rank 0 keeps its load and its
    // keys when `keep_rank0` (it lives in the front's process), the other ranks start empty
    // (their sequences are re-run and counted again; their prefix caches are new); a rank
    // that stays keeps its requests count.
    void resize(int num_ranks, bool keep_rank0 = true);
    std::span<const RankLoad> loads() const { return loads_; }

private:
    // One rank's keys, most recently used first.
    struct Keys {
        std::list<kv::BlockKey> lru;
        std::unordered_map<kv::BlockKey, std::list<kv::BlockKey>::iterator, kv::BlockKeyHash> where;
        int64_t pool_blocks = 0;  // 0: unknown
    };
    // The load rule over ranks r with match[r] == best (every rank when `match` is empty).
    int least_loaded(std::span<const int64_t> match, int64_t best) const;
    int64_t cap(const Keys& k) const;
    void trim(Keys& k);

    Options options_;
    std::vector<RankLoad> loads_;
    std::vector<Keys> ranks_;
};

}  // namespace dsi::engine
