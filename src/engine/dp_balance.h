// DpBalancer: which rank of an --ep group runs a new request (attention data parallelism,
// issue 19; docs/comm.md "Attention data parallelism across the ranks"). A pure policy:
// no I/O, no clock — its state is exactly what rank 0 relays (every request starts,
// streams its tokens and finishes through rank 0's DpFront), so nothing in it is stale
// and no time is needed to age a report; sim/ can drive it as it is.
//
// Policy: the rank with the fewest running sequences (a decode step's attention work
// and the group's lockstep are set by the busiest rank, so equal sequence counts keep
// the ranks' steps equally long); ties to the fewest KV tokens (prompt + generated, the
// attention reads and the block pool's fill), then to the fewest requests so far (requests
// that arrive one after another still take turns), then to the lowest rank. A request that
// must stay on rank 0 (grammar masks, n > 1, KV export: their state does not travel)
// counts on rank 0 like any other.
//
// Thread model: one owner thread (the DpFront's).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dsi::engine {

class DpBalancer {
public:
    struct RankLoad {
        int64_t running_seqs = 0;
        int64_t kv_tokens = 0;
        int64_t requests = 0;  // assigned since the start
    };
    // REQUIRES: num_ranks >= 1.
    explicit DpBalancer(int num_ranks);

    int num_ranks() const { return static_cast<int>(loads_.size()); }
    // The rank for a new request: any rank when `any_rank`, else 0.
    int pick(bool any_rank) const;
    void on_start(int rank, int64_t prompt_tokens);
    void on_token(int rank);
    void on_finish(int rank, int64_t tokens);
    // The group restarted with `num_ranks` (EP failover): rank 0 keeps its load when
    // `keep_rank0` (it lives in the front's process), the other ranks start empty (their
    // sequences are re-run and counted again); a rank that stays keeps its requests count.
    void resize(int num_ranks, bool keep_rank0 = true);
    std::span<const RankLoad> loads() const { return loads_; }

private:
    std::vector<RankLoad> loads_;
};

}  // namespace dsi::engine
