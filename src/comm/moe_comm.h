// Expert-parallel (EP) all-to-all for MoE layers: the transport-agnostic interface
// (SPEC S-ENG-2, S-EPLB; issue 19 deliverable 2). docs/comm.md has the picture.
//
// A group of N ranks (processes, or threads in tests) each holds some tokens (its
// "home" tokens, attention data-parallel) and some expert slots. One MoE call is three
// collective steps, every rank calling each step in the same order:
//   1. layout(placement, top-k ids)  -> MoeLayout: each (token, k) goes to one replica
//      of its expert (rank, slot), chosen by a fixed ReplicaChoice rule; per-destination
//      counts and the row each (token, k) lands on at its destination.
//   2. dispatch(layout, hidden rows) -> DispatchView: the rows this rank received, grouped
//      by local expert slot, each with its origin (rank, token, k).
//   3. the caller runs each local expert on its rows and writes one output row per
//      received row (same order) — best straight into expert_output_buffer(), no copy —
//      then combine(layout, outputs, gate weights) -> on the home rank, for every token,
//      out[t] = sum over k = 0..top_k-1, in that order, of gate[t][k] * y[t][k], the
//      accumulator starting at +0.0f. The summation order is fixed and each y row is
//      computed by the same expert function wherever it runs, so the result is bitwise
//      independent of the EP size and of which replica served an expert.
//
// Memory layout (all f32/int32, row-major, dense):
//   hidden rows   [num_tokens][hidden]        this rank's tokens (dispatch input)
//   top-k ids     [num_tokens][top_k]         logical expert ids (layout input)
//   gate weights  [num_tokens][top_k]         (combine input)
//   received rows [num_recv][hidden]          grouped by local slot ascending; inside a
//                                             slot by source rank, then token, then k
//   origins       [num_recv]                  RowOrigin of each received row
//   expert output [num_recv][hidden]          same order as the received rows
//   combined      [num_tokens][hidden]        (combine output)
// One row is sent per (token, k) (a token whose two experts sit on one rank is sent
// twice: simple, and the combine needs one output per (token, k) anyway).
//
// Errors: bad input on any rank (expert id out of range, more tokens than the group's
// capacity, a placement that misses an expert) fails the step on *every* rank (the
// offending rank says why, the others say which rank failed), so no rank waits for a
// peer that gave up. A peer that dies or leaves makes every wait return UNAVAILABLE; a
// wait past its deadline returns DEADLINE_EXCEEDED. A misuse only this rank can see (a
// span of the wrong size in dispatch/combine, steps out of order) returns
// INVALID_ARGUMENT / FAILED_PRECONDITION and makes this rank leave, so its peers get
// UNAVAILABLE at once instead of waiting for their deadline. After any of these the
// communicator is broken (every later call returns the same error): the group must be
// rebuilt (the engine restarts with the healthy ranks, S-DEPLOY).
//
// Thread model: a MoeCommunicator belongs to one thread (its rank's step loop). Calls
// on different ranks run concurrently; that is the point.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/combine_kernel.h"

namespace dsi::comm {

// Where the physical expert slots are: rank r owns slots [r * slots_per_rank,
// (r + 1) * slots_per_rank); slot_expert[p] is the logical expert held by physical slot
// p, or -1 for an empty slot. An expert may have several slots (redundant replicas,
// S-EPLB). This is the convention of cluster::ExpertPlacement::phy_to_log for one layer.
class PlacementTable {
public:
    PlacementTable() = default;
    // INVALID_ARGUMENT: a size <= 0, slot_expert not num_ranks * slots_per_rank long, an
    // id outside [-1, num_experts), or an expert with no slot ("expert 5 has no slot").
    static Result<PlacementTable> create(int num_experts, int num_ranks, int slots_per_rank,
                                         std::vector<int> slot_expert);
    // Expert e on rank e / (num_experts / num_ranks), one slot each; the remaining slots
    // of a rank (slots_per_rank - num_experts / num_ranks) hold replicas of experts
    // 0, 1, ... in order. REQUIRES: num_experts % num_ranks == 0 and slots_per_rank >=
    // num_experts / num_ranks. For tests and as a baseline.
    static Result<PlacementTable> identity(int num_experts, int num_ranks, int slots_per_rank);

    int num_experts() const { return num_experts_; }
    int num_ranks() const { return num_ranks_; }
    int slots_per_rank() const { return slots_per_rank_; }
    std::span<const int> slot_expert() const { return slot_expert_; }
    // The physical slots holding expert e, ascending. REQUIRES: 0 <= e < num_experts().
    std::span<const int> replicas(int e) const {
        return std::span<const int>(replica_slots_)
            .subspan(replica_begin_[e], replica_begin_[e + 1] - replica_begin_[e]);
    }

private:
    int num_experts_ = 0;
    int num_ranks_ = 0;
    int slots_per_rank_ = 0;
    std::vector<int> slot_expert_;
    std::vector<int> replica_begin_;  // [num_experts + 1] into replica_slots_
    std::vector<int> replica_slots_;
};

// Which replica serves a (token, k) when an expert has several. Every rule is a pure
// function of (placement, source rank, token, k), so a run is reproducible; the combined
// result does not depend on the rule (it changes only where the work happens).
enum class ReplicaChoice {
    kFirst,       // the lowest physical slot
    kSpread,      // replica (token * num_ranks + source rank + k) mod count: spreads load
    kLocalFirst,  // a replica on the source rank if there is one (no copy to a peer), else kSpread
    // The j-th (token, k) row of expert e that this rank sends in this call (in (token, k)
    // order) goes to replica (j + source rank) mod count: each source splits a replicated
    // expert's rows evenly (within one row) over its replicas, whatever the tokens' order
    // and whatever k the expert comes at (kSpread's (token * num_ranks + rank + k) mod
    // count depends on k alone when num_ranks is a multiple of count). The split live
    // EPLB's moe_lb assumes (cluster/eplb.h kEvenSplit).
    kRoundRobin,
};

// Fixed sizes of a group; all ranks must agree (a shared-memory segment records them
// and refuses a rank that differs).
struct MoeShape {
    int num_ranks = 1;
    int hidden = 0;               // f32 values per row
    int top_k = 0;                // experts per token
    int max_tokens_per_rank = 0;  // tokens one rank may send per call
    int slots_per_rank = 0;       // expert slots per rank (incl. redundant ones)
    // Rows one rank may receive per call; 0 = num_ranks * max_tokens_per_rank * top_k
    // (every routed row of every rank on one rank, the worst case).
    int64_t max_recv_rows = 0;

    int64_t recv_capacity() const {
        return max_recv_rows > 0 ? max_recv_rows : int64_t{num_ranks} * max_tokens_per_rank * top_k;
    }
    // INVALID_ARGUMENT on a non-positive field.
    Status validate() const;
};

struct RowOrigin {
    int32_t rank = 0;   // the token's home rank
    int32_t token = 0;  // index among that rank's tokens of this call
    int32_t k = 0;      // position in the token's top-k list
};

// Route of every (token, k) of this rank: the handle layout() returns, used by dispatch()
// and combine() of the same call. Callers read it; only a MoeCommunicator fills it.
struct MoeLayout {
    uint64_t call = 0;  // which call of the communicator it belongs to
    int num_tokens = 0;
    int top_k = 0;
    std::vector<int32_t> dst_rank;     // [num_tokens * top_k]
    std::vector<int32_t> dst_slot;     // [num_tokens * top_k] local slot on dst_rank
    std::vector<int64_t> dst_row;      // [num_tokens * top_k] row in dst_rank's receive order
    std::vector<int32_t> send_counts;  // [num_ranks] rows this rank sends to each rank
    // This rank's receive side: rows of local slot s are [slot_offsets[s], slot_offsets[s + 1]).
    std::vector<int64_t> slot_offsets;  // [slots_per_rank + 1]
    // Rows every physical slot of the group receives in this call ([num_ranks *
    // slots_per_rank], the same on every rank): the step's global expert load, for EPLB
    // (ExpertLoadCounter::add_slot_rows) without another exchange.
    std::vector<int64_t> slot_rows;
    int64_t num_recv() const { return slot_offsets.empty() ? 0 : slot_offsets.back(); }
};

// What dispatch() delivered to this rank. The spans live until the next layout() on the
// same communicator (they may point into shared memory).
struct DispatchView {
    std::span<const float> rows;            // [num_recv * hidden]
    std::span<const RowOrigin> origins;     // [num_recv]
    std::span<const int64_t> slot_offsets;  // [slots_per_rank + 1]
};

// Pure part of layout(), shared by every transport: the destination (rank, local slot)
// of each (token, k). INVALID_ARGUMENT when the table does not match `shape`, ids are not
// num_tokens * top_k long, or an id is out of range ("token 3, k 1: expert 99 not in
// [0, 16)"); RESOURCE_EXHAUSTED when num_tokens > shape.max_tokens_per_rank.
Status route_tokens(const MoeShape& shape, const PlacementTable& placement, int rank,
                    std::span<const int32_t> topk_ids, int num_tokens, ReplicaChoice choice,
                    MoeLayout& layout);

// Pure part of layout() after the counts are exchanged, shared by every transport.
// `count(src, dst, s)`: the rows rank src sends to local slot s of rank dst. Fills, for
// this `rank`: L.slot_offsets (its receive side), L.slot_rows (every physical slot of the
// group) and L.dst_row (each (token, k) of L.dst_rank / L.dst_slot in its destination's
// receive order: slot, then source rank, then (token, k)). Every rank computes every
// destination's order from the same counts, so a capacity error is seen by all alike:
// RESOURCE_EXHAUSTED "<who>: rank 1 would receive 70 rows, capacity 64".
template <typename CountOf>
Status order_receives(const MoeShape& shape, int rank, const char* who, CountOf&& count,
                      MoeLayout& L) {
    const int n = shape.num_ranks;
    const int slots = shape.slots_per_rank;
    std::vector<int64_t> next(static_cast<size_t>(n) * slots);
    L.slot_offsets.clear();
    L.slot_rows.assign(static_cast<size_t>(n) * slots, 0);
    for (int dst = 0; dst < n; ++dst) {
        int64_t offset = 0;
        for (int s = 0; s < slots; ++s) {
            if (dst == rank) {
                L.slot_offsets.push_back(offset);
            }
            const int64_t slot_begin = offset;
            for (int src = 0; src < n; ++src) {
                if (src == rank) {
                    next[static_cast<size_t>(dst) * slots + s] = offset;
                }
                offset += count(src, dst, s);
            }
            L.slot_rows[static_cast<size_t>(dst) * slots + s] = offset - slot_begin;
        }
        if (dst == rank) {
            L.slot_offsets.push_back(offset);
        }
        if (offset > shape.recv_capacity()) {
            return resource_exhausted(std::string(who) + ": rank " + std::to_string(dst) +
                                      " would receive " + std::to_string(offset) +
                                      " rows, capacity " + std::to_string(shape.recv_capacity()));
        }
    }
    for (size_t i = 0; i < L.dst_rank.size(); ++i) {
        L.dst_row[i] = next[static_cast<size_t>(L.dst_rank[i]) * slots + L.dst_slot[i]]++;
    }
    return Status::ok();
}

// Pure part of combine(): out[t] = sum_k gate[t][k] * y(t, k) in fixed k order from
// +0.0f, where y(t, k) = row_of(t, k) (a pointer to `hidden` floats). Every transport
// calls this, so the summation is one piece of code. Each token's row goes through the
// best combine kernel of this CPU (combine_kernel.h: every variant gives the same bits;
// the accumulators stay in registers over the k rows).
template <typename RowOf>
void combine_in_order(int num_tokens, int top_k, int hidden, std::span<const float> gate,
                      std::span<float> out, RowOf&& row_of) {
    const CombineRowFn fn = combine_kernels().front().fn;
    constexpr int kMaxStackK = 32;
    const float* stack_rows[kMaxStackK];
    std::vector<const float*> heap_rows(top_k > kMaxStackK ? static_cast<size_t>(top_k) : 0);
    const float** rows = top_k > kMaxStackK ? heap_rows.data() : stack_rows;
    for (int t = 0; t < num_tokens; ++t) {
        for (int k = 0; k < top_k; ++k) {
            rows[k] = row_of(t, k);
        }
        fn(out.data() + static_cast<size_t>(t) * hidden,
           rows, gate.data() + static_cast<size_t>(t) * top_k, top_k, hidden);
    }
}

// The MoE all-to-all of one EP group. Implementations: ShmMoeCommunicator (shm_group.h,
// processes of one host) and UcxMoeCommunicator (ucx_group.h, processes on any hosts).
class MoeCommunicator {
public:
    virtual ~MoeCommunicator() = default;

    virtual int rank() const = 0;
    virtual const MoeShape& shape() const = 0;
    int size() const { return shape().num_ranks; }

    // Collective. `topk_ids`: [num_tokens * top_k]. Errors as in route_tokens (on the
    // rank with the bad input; the others get FAILED_PRECONDITION naming that rank),
    // RESOURCE_EXHAUSTED when some rank would receive more than shape().recv_capacity()
    // rows (on every rank), UNAVAILABLE / DEADLINE_EXCEEDED (header comment).
    virtual Result<MoeLayout> layout(const PlacementTable& placement,
                                     std::span<const int32_t> topk_ids, int num_tokens,
                                     ReplicaChoice choice) = 0;
    // Collective. `hidden_rows`: [layout.num_tokens * hidden] (else INVALID_ARGUMENT).
    // FAILED_PRECONDITION when `layout` is not the latest one of this communicator or was
    // dispatched already. Both break the group (header comment).
    virtual Result<DispatchView> dispatch(const MoeLayout& layout,
                                          std::span<const float> hidden_rows) = 0;
    // Where the caller may write the expert outputs of the current call
    // ([layout.num_recv() * hidden]) so that combine() copies nothing. Lives as the
    // DispatchView does.
    virtual std::span<float> expert_output_buffer(const MoeLayout& layout) = 0;
    // Collective. `expert_outputs`: [layout.num_recv() * hidden] (expert_output_buffer()
    // or any other memory); `gate`: [num_tokens * top_k]; `out`: [num_tokens * hidden].
    virtual Status combine(const MoeLayout& layout, std::span<const float> expert_outputs,
                           std::span<const float> gate, std::span<float> out) = 0;
    // Collective: returns when every rank has called it (or an error as above).
    virtual Status barrier() = 0;
    // Collective: every rank's `value`, indexed by rank (the same vector on every rank).
    // The engine's lockstep agreement (docs/comm.md "Expert parallelism in the engine":
    // how many tokens each rank brings to a forward pass, or that it is idle or leaving).
    // `timeout_ms` > 0 replaces the group's per-step deadline for this call (an idle rank
    // waits for its peers' next step longer than a step may take); dead peers are
    // detected as in every wait (UNAVAILABLE).
    virtual Result<std::vector<int64_t>> all_gather(int64_t value, int64_t timeout_ms = 0) = 0;
};

}  // namespace dsi::comm
