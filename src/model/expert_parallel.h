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
// Live EPLB (S-EPLB; docs/comm.md "Live EPLB"): each MoE layer has its own placement.
// Every layout gives every rank the rows each physical slot of the group receives, so
// every rank counts the same global per-expert loads with no extra exchange; after each
// forward pass (a "step") every rank feeds them to its own copy of the placement policy
// (comm::PlacementPolicy, injected; deterministic), so all ranks decide the same new
// placement at the same step. Each rank then loads the experts its new slots need
// (WeightMover, the model: in the background, serving continues on the old placement);
// the agreement at the start of every later forward pass carries one "ready" bit per
// rank, and the pass at which every rank reports ready switches all ranks at once,
// before its first MoE layer. Results do not change (the combine is in fixed k order on
// the home rank), only where rows are computed.
//
// Thread model: one ExpertParallelGroup per rank, used by the thread that runs the
// model's forward passes (the model's callers serialise them already); stats() may be
// called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "comm/expert_load.h"
#include "comm/moe_comm.h"
#include "model/config.h"

namespace dsi {

// EP failover (S-DEPLOY): the group rank 0 continues with after a peer died.
struct EpRestart {
    int num_ranks = 1;  // the healthy ranks; 1: no group, rank 0 holds every expert
    std::string group;  // the new group's segment name (num_ranks > 1)
};

// The all-to-all a group runs on: shared memory (ranks of one host) or UCX (ranks on any
// hosts; docs/comm.md "Between hosts: UCX").
enum class EpTransport { kShm, kUcx };

struct ExpertParallelOptions {
    int num_ranks = 1;  // 1: no expert parallelism (below ignored), unless placement_policy
    int rank = 0;
    // The group's shared-memory segment name (comm::ShmOptions::name); every rank the same.
    std::string group;
    EpTransport transport = EpTransport::kShm;
    // kUcx: "host:port" where rank 0 listens and the others join (comm::UcxGroupOptions::
    // coordinator); every rank the same. A restarted group binds it again.
    std::string coordinator;
    // Spare slots per rank holding replicas of experts 0, 1, ... (comm::PlacementTable::
    // identity); results do not change with them, only where rows are computed.
    int redundant_experts_per_rank = 0;
    // Rows one rank sends per MoE exchange; a larger forward pass runs in rounds. Sizes
    // the segment (comm::ShmMoeCommunicator::segment_bytes).
    int max_tokens_per_call = 128;
    int64_t attach_timeout_ms = 60'000;  // every rank attached (ranks load in parallel)
    // Polled while the group forms: true ends the attach with UNAVAILABLE (a rank the
    // launcher saw die before it attached; comm::ShmOptions::abandoned).
    std::function<bool()> abandoned;
    int64_t op_timeout_ms = 60'000;      // one collective step of a forward pass
    // An idle rank's wait for its peers' next step (they may be loading, tokenizing or
    // between requests); dead peers are still seen at once.
    int64_t idle_timeout_ms = 600'000;
    comm::ReplicaChoice replica_choice = comm::ReplicaChoice::kLocalFirst;
    // Live EPLB: makes this rank's placement policy for the group's shape (MoE layers,
    // routed experts, ranks); unset: the identity placement stays. apps/ wires
    // cluster::LiveEplbPolicy in (cluster/ sits above model/).
    using PolicyFactory = std::function<Result<std::unique_ptr<comm::PlacementPolicy>>(
        int num_moe_layers, int num_experts, int num_ranks)>;
    PolicyFactory placement_policy;
    // Wait for a new placement's weights at the step it was decided, so the switch happens
    // at the next forward pass (tests, benchmarks). Off: they load in the background and
    // the switch waits until every rank has them.
    bool wait_for_moved_weights = false;
    // Steps over which stats() measures moe_lb (slowest rank / mean).
    int64_t stats_window_steps = 100;
    // EP failover (S-DEPLOY), rank 0 only. When set, a forward pass that fails because a
    // peer died or left (UNAVAILABLE) does not fail: `restart` (apps/: reaps the old
    // ranks, starts the new group's others) gives the group of the healthy ranks; this
    // rank loads the experts its new slots need, joins it and resumes the pass at the MoE
    // layer that failed (model/internal/ep_host.h) — the same inputs, so the same bits;
    // nothing runs twice and nothing is lost. Counted in ExpertParallelStats::failovers.
    std::function<Result<EpRestart>(const Status& failure)> restart;
    // Tests: called on this rank before each MoE layer's exchanges (a rank that dies in
    // the middle of a forward pass).
    std::function<void(int moe_layer)> on_moe_layer;

    // A group: several ranks, or one rank with a placement policy (live EPLB moving
    // experts between one rank's slots: EP 1 of the bitwise tests).
    bool enabled() const { return num_ranks > 1 || placement_policy != nullptr; }
};

// What a group measured (rank 0 sees the whole group's loads, like every rank).
struct ExpertParallelStats {
    int num_ranks = 1;              // the group's ranks now (after failovers)
    int64_t failovers = 0;          // restarts with the healthy ranks (S-DEPLOY)
    bool restarting = false;        // a front's group restart is in progress (reap, start)
    int64_t steps = 0;              // group forward passes
    int64_t placement_changes = 0;  // switches to a new placement, all ranks at once
    // Rows each rank's experts computed since the start, all MoE layers ([num_ranks]).
    std::vector<int64_t> rank_rows;
    // moe_lb measured over one stats window: per MoE layer the rows of the busiest rank
    // over the mean rank's, averaged over the layers that got rows.
    struct Window {
        int64_t end_step = 0;
        int64_t placement = 0;  // placement changes before the window
        double moe_lb = 0;
        // The placement computed from this window's loads (at its end), evaluated on
        // those loads as the policy predicts it; 0 when none was computed then.
        double placed_moe_lb = 0;
    };
    std::vector<Window> windows;  // completed windows, oldest first (the last 1,000)
    // The latest placement's moe_lb on the loads of the window it was computed from (as
    // the policy predicts it; 0 before the first change).
    double placed_moe_lb = 0;
};

// INVALID_ARGUMENT when the options cannot place `config`'s routed experts: a rank out of
// range, more ranks than routed experts ("--ep 16: more ranks than the 8 routed experts"),
// more redundant experts per rank than experts, a model without routed experts.
Status validate_expert_parallel(const ExpertParallelOptions& options, const ModelConfig& config);

// S-EPLB: slots per rank = (E + redundant * N) / N, the total rounded up to a multiple of
// N, so any N <= E places (8 experts over 3 ranks: 3 slots each, one holding a replica).
int slots_per_rank(int num_experts, int num_ranks, int redundant_per_rank);
// The placement a group starts with: comm::PlacementTable::identity when N divides E,
// else rank r holds a contiguous run of E / N experts (the first E mod N ranks one more)
// and the remaining slots hold replicas of experts 0, 1, ... in rank order.
Result<comm::PlacementTable> initial_placement(int num_experts, int num_ranks, int slots);

class ExpertParallelGroup {
public:
    static constexpr int64_t kIdle = -1;
    static constexpr int64_t kLeaving = -2;

    // Validates, then creates or attaches the segment (comm::ShmMoeCommunicator::create:
    // returns once all ranks attached, or DEADLINE_EXCEEDED / FAILED_PRECONDITION ...).
    static Result<std::unique_ptr<ExpertParallelGroup>> create(const ExpertParallelOptions& options,
                                                               const ModelConfig& config);
    ~ExpertParallelGroup();

    // How the model changes the experts it holds when the placement changes.
    class WeightMover {
    public:
        virtual ~WeightMover() = default;
        // Starts loading (off the caller's thread) the experts that `next_local` needs:
        // the logical expert of each local slot (-1: empty), [num_moe_layers *
        // slots_per_rank], layer-major.
        virtual void begin_move(std::vector<int> next_local) = 0;
        // true once loaded; the load's error if it failed.
        virtual Result<bool> move_ready() = 0;
        // Between forward passes: the loaded experts replace the current ones.
        // REQUIRES: move_ready() gave true.
        virtual void commit_move() = 0;
    };
    // REQUIRES: `mover` outlives the group's use; set before the first forward pass.
    void set_weight_mover(WeightMover* mover) { mover_ = mover; }

    int rank() const { return options_.rank; }
    int num_ranks() const { return options_.num_ranks; }
    int num_moe_layers() const { return static_cast<int>(placements_.size()); }
    const comm::PlacementTable& placement(int moe_layer) const { return placements_[moe_layer]; }
    // Logical expert of each local slot of MoE layer `moe_layer` (-1: empty),
    // slots_per_rank long.
    std::span<const int> local_experts(int moe_layer) const;
    // With at most the last `max_windows` windows.
    ExpertParallelStats stats(size_t max_windows) const DSI_EXCLUDES(stats_mu_);

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
    Status run_moe(int moe_layer, std::span<const float> hidden, int64_t num_tokens,
                   std::span<const int32_t> ids, std::span<const float> gate, int rounds,
                   const ExpertFn& expert, std::span<float> out);

    // Leaves the group now (this rank failed between collectives): peers get UNAVAILABLE
    // at their next wait instead of their deadline.
    void abandon();

private:
    ExpertParallelGroup(ExpertParallelOptions options, std::vector<comm::PlacementTable> placements,
                        std::unique_ptr<comm::MoeCommunicator> comm,
                        std::unique_ptr<comm::PlacementPolicy> policy);
    // The agreement at the start of a forward pass: ends the previous step (loads to the
    // policy, maybe a new placement staged), gathers `value` with this rank's ready bit,
    // switches the placement when every rank is ready.
    Result<std::vector<int64_t>> gather(int64_t value, int64_t timeout_ms);
    Status end_step();
    Status stage(std::span<const int> phy_to_log);
    int rounds_for(std::span<const int64_t> values) const;

    ExpertParallelOptions options_;
    std::vector<comm::PlacementTable> placements_;  // per MoE layer
    std::unique_ptr<comm::MoeCommunicator> comm_;
    std::unique_ptr<comm::PlacementPolicy> policy_;
    WeightMover* mover_ = nullptr;
    bool stopped_ = false;
    bool step_open_ = false;  // a forward pass ran since the last agreement
    comm::ExpertLoadCounter step_load_;
    std::vector<comm::PlacementTable> staged_;  // the next placement, weights loading
    std::vector<int64_t> window_rank_rows_;     // [num_moe_layers * num_ranks]
    int64_t window_steps_ = 0;
    mutable Mutex stats_mu_;
    ExpertParallelStats stats_ DSI_GUARDED_BY(stats_mu_);
};

}  // namespace dsi
