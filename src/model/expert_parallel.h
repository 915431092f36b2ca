// Expert parallelism (EP) of one model instance over N rank processes of one host
// (issue 19; docs/comm.md "Expert parallelism in the engine"; SPEC S-ENG-2).
//
// Every rank loads the dense layers, attention, the router and the shared experts, and
// only the routed experts of its own slots (comm::PlacementTable: expert e on rank
// e / (E / N), plus optional redundant replicas). Each rank runs its own tokens
// (attention data parallelism); in every MoE layer the ranks exchange rows through a
// comm::MoeCommunicator (shared memory, comm/shm_group.h): layout -> dispatch -> local
// experts -> combine, the combine summing each token's top-k outputs on its home rank in
// fixed k order, so a token's result is bitwise the one a single process gives.
//
// Lockstep (the contract every rank keeps): every forward pass of any rank is a
// collective. It starts with one all_gather of what each rank brings — its token count
// (> 0), kIdle or kLeaving — and then every MoE layer runs the same number of rounds on
// every rank (rounds = max over ranks of ceil(tokens / max_tokens_per_call); a rank's
// tokens are cut into chunks of max_tokens_per_call, a rank with fewer chunks sends empty
// ones). A rank with no work calls idle(): when a peer brings tokens it runs an empty
// forward pass (MoE exchanges only); when every rank is idle it returns at once; when
// every rank is leaving the group has stopped. No rank ever waits for a peer that will not
// come: a dead peer is UNAVAILABLE (comm/ detects it), a live but silent one is
// DEADLINE_EXCEEDED; either breaks the group for good.
//
// Thread model: one ExpertParallelGroup per rank, used by the thread that runs the
// model's forward passes (the model's callers serialise them already).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/moe_comm.h"
#include "model/config.h"

namespace dsi {

struct ExpertParallelOptions {
    int num_ranks = 1;  // 1: no expert parallelism (everything below is ignored)
    int rank = 0;
    // The group's shared-memory segment name (comm::ShmOptions::name); every rank the same.
    std::string group;
    // Spare slots per rank holding replicas of experts 0, 1, ... (comm::PlacementTable::
    // identity); results do not change with them, only where rows are computed.
    int redundant_experts_per_rank = 0;
    // Rows one rank sends per MoE exchange; a larger forward pass runs in rounds. Sizes
    // the segment (comm::ShmMoeCommunicator::segment_bytes).
    int max_tokens_per_call = 128;
    int64_t attach_timeout_ms = 60'000;  // every rank attached (ranks load in parallel)
    int64_t op_timeout_ms = 60'000;      // one collective step of a forward pass
    // An idle rank's wait for its peers' next step (they may be loading, tokenizing or
    // between requests); dead peers are still seen at once.
    int64_t idle_timeout_ms = 600'000;
    comm::ReplicaChoice replica_choice = comm::ReplicaChoice::kLocalFirst;

    bool enabled() const { return num_ranks > 1; }
};

// INVALID_ARGUMENT when the options cannot place `config`'s routed experts: a rank out of
// range, more ranks than routed experts ("--ep 16: more ranks than the 8 routed experts"),
// a rank count that does not divide them, a model without routed experts, DeepSeek V4.
Status validate_expert_parallel(const ExpertParallelOptions& options, const ModelConfig& config);

class ExpertParallelGroup {
public:
    static constexpr int64_t kIdle = -1;
    static constexpr int64_t kLeaving = -2;

    // Validates, then creates or attaches the segment (comm::ShmMoeCommunicator::create:
    // returns once all ranks attached, or DEADLINE_EXCEEDED / FAILED_PRECONDITION ...).
    static Result<std::unique_ptr<ExpertParallelGroup>> create(const ExpertParallelOptions& options,
                                                               const ModelConfig& config);
    ~ExpertParallelGroup();

    int rank() const { return options_.rank; }
    int num_ranks() const { return options_.num_ranks; }
    const comm::PlacementTable& placement() const { return placement_; }
    // Logical expert of each local slot (-1: empty), slots_per_rank long.
    std::span<const int> local_experts() const;

    // Collective: the start of a forward pass bringing `num_tokens` (> 0). Returns the MoE
    // rounds every layer runs.
    Result<int> begin_forward(int64_t num_tokens);
    // Collective, for a rank without work. > 0: a peer brought tokens, run an empty forward
    // pass with that many rounds; 0: every rank is idle; kStopped: every rank is leaving
    // (the group is over: idle() keeps returning kStopped, begin_forward fails).
    static constexpr int kStopped = -1;
    Result<int> idle(bool leaving);

    // One MoE layer's routed experts, collective: `rounds` exchanges of this rank's tokens
    // (`hidden` [num_tokens, H], `ids` / `gate` [num_tokens, top_k], ids sorted as the
    // router gives them). `expert(slot, x, rows, y)` runs local slot `slot`'s expert on
    // `rows` rows of x and writes y (both [rows, H]). out [num_tokens, H] = per token the
    // gate-weighted sum of its experts' outputs in k order (from +0.0f).
    using ExpertFn = std::function<void(int slot, const float* x, int64_t rows, float* y)>;
    Status run_moe(std::span<const float> hidden, int64_t num_tokens,
                   std::span<const int32_t> ids, std::span<const float> gate, int rounds,
                   const ExpertFn& expert, std::span<float> out);

    // Leaves the group now (this rank failed between collectives): peers get UNAVAILABLE
    // at their next wait instead of their deadline.
    void abandon();

private:
    ExpertParallelGroup(ExpertParallelOptions options, comm::PlacementTable placement,
                        std::unique_ptr<comm::MoeCommunicator> comm);
    Result<std::vector<int64_t>> gather(int64_t value, int64_t timeout_ms);
    int rounds_for(std::span<const int64_t> values) const;

    ExpertParallelOptions options_;
    comm::PlacementTable placement_;
    std::unique_ptr<comm::MoeCommunicator> comm_;
    bool stopped_ = false;
};

}  // namespace dsi
