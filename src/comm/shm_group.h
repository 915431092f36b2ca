// ShmMoeCommunicator: the MoE all-to-all (moe_comm.h) between processes of one host
// through one POSIX shared-memory segment (shm_open + mmap). docs/comm.md has the byte
// layout and the protocol; in short:
//
//  - Segment "/<name>": a 4 KiB header (magic, version, the MoeShape every rank must
//    agree on, a futex word), one 64-byte control block per rank (pid, state, sequence
//    number, process start time, two all_gather values), then per rank and per parity (calls alternate between two buffer sets) a
//    count table [num_ranks][1 + slots_per_rank] int32 written by the senders, the
//    receive rows [recv_capacity][hidden] f32 and their origins, and the expert output
//    rows [recv_capacity][hidden] f32. Senders write rows straight to the receiver's
//    rows at the offset layout() computed (one copy); the home rank reads the expert
//    outputs straight from the serving rank's buffer (no copy) while it sums.
//  - Each collective step ends in a barrier: a rank stores its sequence number in its own
//    control line and waits (acquire) until every rank's number has reached its own; it
//    bumps and wakes the futex word only when a rank sleeps on it (a sleeper count beside
//    the word), so a barrier that ends in the spin makes no system call. Waits spin
//    briefly, then sleep on the futex in slices of at most 5 ms; between slices they check
//    the deadline and whether the peers they wait for are alive (pid gone, a zombie or
//    reused, or the peer's control block says it left) -> UNAVAILABLE.
//  - Rank 0 creates the segment (O_EXCL) and initialises it; the other ranks open it,
//    retrying until the attach deadline, check magic, version and shape
//    (FAILED_PRECONDITION "segment layout differs: hidden 64 here, 32 in the segment"),
//    and claim their control block. When every rank has attached, rank 0 unlinks the
//    name: the memory lives as long as a mapping does, so a killed group leaves nothing
//    behind. A group that never forms is unlinked by rank 0 at its deadline; a crashed
//    rank 0 may leave the name behind (unlink() below, as the tests' fixture does).
//  - Two buffer sets alternate by call, so a rank may start call c + 1 while a slower
//    rank still reads call c; it cannot get two calls ahead (the barriers prevent it).
//
// Thread model: one communicator per rank, used by one thread. Ranks may be threads of
// one process (tests): each opens the segment itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/moe_comm.h"

namespace dsi::comm {

struct ShmOptions {
    std::string name;  // segment name without the leading '/': [A-Za-z0-9_.-], <= 200 chars
    int rank = 0;
    MoeShape shape;
    int64_t attach_timeout_ms = 10'000;  // for the segment to appear and all ranks to attach
    int64_t op_timeout_ms = 10'000;      // every collective step's deadline
    // A dispatch that sends more bytes than this from this rank writes them with streaming
    // (non-temporal) stores, a smaller one with plain stores (they stay in cache). -1:
    // twice this core's L2 (shm_group.cc says why).
    int64_t streaming_min_bytes = -1;
    // Polled while the group forms (about every ms): true gives UNAVAILABLE at once. The
    // launcher's word that a rank died before it attached, which the waiting ranks cannot
    // see (apps/: EpLaunch). Unset: only the attach deadline ends the wait.
    std::function<bool()> abandoned;
    // Test hook: called on this rank after dispatch() wrote its rows and before it
    // publishes them (the fault tests kill the rank here). Empty in production.
    std::function<void(uint64_t call)> before_dispatch_publish;
};

class ShmMoeCommunicator final : public MoeCommunicator {
public:
    // Rank 0 creates the segment, the others attach; returns once all num_ranks ranks have
    // attached. INVALID_ARGUMENT (bad name/rank/shape), ALREADY_EXISTS (the name is taken,
    // or the rank is attached already), FAILED_PRECONDITION (a segment with another
    // layout or version), RESOURCE_EXHAUSTED (rank 0: /dev/shm cannot hold the segment;
    // its pages are reserved up front), DEADLINE_EXCEEDED (the group did not form in
    // time), INTERNAL (a system call failed).
    static Result<std::unique_ptr<ShmMoeCommunicator>> create(const ShmOptions& options);
    // Removes the name (NOT_FOUND if there is none). For fixtures cleaning up after a
    // failed run; a formed group unlinks itself.
    static Status unlink(const std::string& name);
    // Bytes of the segment for `shape` (the sizing rule of the header above).
    static int64_t segment_bytes(const MoeShape& shape);

    ~ShmMoeCommunicator() override;  // marks this rank as left (peers get UNAVAILABLE)

    int rank() const override { return rank_; }
    const MoeShape& shape() const override { return shape_; }
    Result<MoeLayout> layout(const PlacementTable& placement, std::span<const int32_t> topk_ids,
                             int num_tokens, ReplicaChoice choice) override;
    Result<DispatchView> dispatch(const MoeLayout& layout,
                                  std::span<const float> hidden_rows) override;
    std::span<float> expert_output_buffer(const MoeLayout& layout) override;
    Status combine(const MoeLayout& layout, std::span<const float> expert_outputs,
                   std::span<const float> gate, std::span<float> out) override;
    Status barrier() override;
    Result<std::vector<int64_t>> all_gather(int64_t value, int64_t timeout_ms = 0) override;

private:
    struct Segment;
    enum class Phase { kIdle, kLaidOut, kDispatched };
    ShmMoeCommunicator(const ShmOptions& options, std::unique_ptr<Segment> segment);
    // timeout_ms 0: options_.op_timeout_ms.
    Status wait_all(uint64_t target, const char* step, int64_t timeout_ms = 0);
    // The first rank whose barrier number is below `target`, or -1.
    int first_behind(uint64_t target, std::memory_order order);
    Status check_call(const MoeLayout& layout, Phase expected, const char* step);
    void mark_left();
    // Breaks the group on a misuse the peers cannot see (a wrong size or order in this
    // rank's call): this rank leaves, so they fail now, not at their deadline.
    Status leave_group(Status status);

    int rank_;
    MoeShape shape_;
    ShmOptions options_;
    std::unique_ptr<Segment> seg_;
    uint64_t seq_ = 0;   // barriers passed
    uint64_t call_ = 0;  // layout() calls; parity = call_ % 2
    uint64_t gathers_ = 0;  // all_gather() calls; parity = gathers_ % 2
    Phase phase_ = Phase::kIdle;
    Status broken_;      // sticky: a peer died or a deadline passed
};

}  // namespace dsi::comm
