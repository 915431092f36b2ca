// EPLB: expert-parallel load balancing — redundant experts and their placement on EP
// ranks (SPEC S-EPLB).
//
// Policy:
//  - Each rank holds its share of the logical experts plus `redundant_experts_per_rank`
//    replicas of hot experts; the physical total is rounded up to a multiple of the EP
//    size (prefill default 4 per rank, decode 1 per rank).
//  - Loads are counted over a window of steps (prefill 100, decode 1,000) and the
//    placement is recomputed every M steps (prefill 1,000, decode 10,000).
//  - Placement is min-max (minimise the most loaded rank), the heuristic of DeepSeek's
//    public EPLB: hierarchical when the expert groups divide evenly over nodes (pack
//    groups to nodes, replicate the hottest experts inside each node, pack replicas to
//    the node's ranks), otherwise global (one group, one node). Replication gives the next
//    replica to the expert with the highest load per replica; packing is greedy
//    largest-first into the lightest rank that still has a free slot.
//  - Our addition (`refine`, on by default): a swap search that moves replicas between
//    the most loaded rank and any other rank of the same node while that lowers the
//    maximum, so the result is never worse than the reference heuristic.
//  - Smoothing (ours, a setting): the placement is computed from the last window
//    (kLastWindow, the SPEC's "loads of the last N steps") or from the mean of the last
//    smoothing_windows completed windows (kMeanOfWindows), or an exponential moving
//    average over completed windows (kEma). Default for both phases: EMA with alpha 0.2
//    (about the last 5-10 windows). Measured (bench/RESULTS.md): when popularity
//    fluctuates around a stable mean, averaging reaches the floor of a fixed placement
//    and the last window alone is worst; when popularity wanders, the last window is
//    best and a 10-window mean worst; the EMA has the lowest worst case of the three.
//  - moe_lb = load of the slowest rank / mean rank load. Replica dispatch (a setting of
//    the measurement): kEvenSplit, a replica carries load / count (tokens are spread
//    over replicas by a fixed rule); kLeastLoadedReplica, each token of a replicated
//    expert goes to the replica whose rank is least loaded at that moment, so the
//    replicas share their expert's load dynamically and absorb drift.
// Ties break to the lower index everywhere, so results are deterministic. No I/O.
// Thread model: functions are pure; EplbController is not thread-safe (one owner).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace dsi::cluster {

enum class EplbSmoothing { kLastWindow, kMeanOfWindows, kEma };

// S-EPLB per phase: (redundant experts per rank, statistics window in steps, rebalance
// interval in steps) = prefill (4, 100, 1,000), decode (1, 1,000, 10,000).
struct EplbSettings {
    int redundant_experts_per_rank = 4;
    int64_t window_steps = 100;
    int64_t rebalance_interval_steps = 1000;
    bool refine = true;
    EplbSmoothing smoothing = EplbSmoothing::kEma;
    int smoothing_windows = 10;  // kMeanOfWindows: completed windows averaged (1..64)
    double ema_alpha = 0.2;      // kEma: weight of the newest completed window, (0, 1]

    static EplbSettings prefill_defaults() { return {4, 100, 1000, true}; }
    static EplbSettings decode_defaults() { return {1, 1000, 10000, true}; }
    Status validate() const;
};

// S-EPLB: num_logical + redundant_per_rank * ep_size, rounded up to a multiple of ep_size.
int num_physical_experts(int num_logical, int ep_size, int redundant_per_rank);

struct EplbLayout {
    int num_groups = 1;  // expert groups (group-limited routing); 1 = no groups
    int num_nodes = 1;   // nodes with a fast intra-node fabric
    int num_ranks = 1;   // EP size (devices); a multiple of num_nodes
    int num_physical = 0;
};

struct ExpertPlacement {
    int num_layers = 0;
    int num_logical = 0;
    int num_physical = 0;
    int num_ranks = 0;
    // Physical slot p of layer l sits on rank p / slots_per_rank().
    std::vector<int> phy_to_log;     // [num_layers * num_physical]
    std::vector<int> replica_index;  // [num_layers * num_physical]: which copy of its expert
    std::vector<int> replica_count;  // [num_layers * num_logical]

    int slots_per_rank() const { return num_physical / num_ranks; }
    // Every logical expert has >= 1 replica, counts match phy_to_log, replica indices are
    // 0..count-1, and no rank holds more than slots_per_rank() experts.
    Status validate() const;
};

// `load`: [num_layers * num_logical] non-negative loads (tokens routed to each expert).
Result<ExpertPlacement> place_experts(std::span<const double> load, int num_layers,
                                      int num_logical, const EplbLayout& layout,
                                      bool refine = true);

// The placement an EP deployment starts with: expert e on rank e / (num_logical / ranks),
// no redundancy used (redundant slots hold copies of experts in order). For baselines.
Result<ExpertPlacement> identity_placement(int num_layers, int num_logical,
                                           const EplbLayout& layout);

struct MoeLb {
    double mean = 0;  // mean over layers of (max rank load / mean rank load)
    double max = 0;   // worst layer
};
enum class ReplicaDispatch { kEvenSplit, kLeastLoadedReplica };
// kLeastLoadedReplica is computed fluidly: each replicated expert's load is cut into
// kDispatchChunks equal parts, handed out in rounds (heaviest expert first), each part to
// the currently least-loaded rank holding a replica of it (ties: lower rank).
inline constexpr int kDispatchChunks = 64;
std::vector<double> rank_loads(const ExpertPlacement& placement, std::span<const double> load,
                               int layer, ReplicaDispatch dispatch = ReplicaDispatch::kEvenSplit);
MoeLb moe_lb(const ExpertPlacement& placement, std::span<const double> load,
             ReplicaDispatch dispatch = ReplicaDispatch::kEvenSplit);

// Counts loads over a sliding window of steps and says when to re-place. The window is
// kept as 10 sub-windows of window_steps / 10 steps each (memory stays
// O(10 x layers x experts) for the decode window of 1,000 steps), so the statistics
// cover between 0.9 and 1.0 of a window. Completed windows (fixed boundaries every
// window_steps steps) feed the smoothed estimate: a ring of the last smoothing_windows
// window sums, or an EMA. rebalance() places on estimated_load().
class EplbController {
public:
    // REQUIRES: settings.validate() is OK.
    EplbController(const EplbSettings& settings, int num_layers, int num_logical,
                   const EplbLayout& layout);

    // `load`: [num_layers * num_logical] for one step. INVALID_ARGUMENT on a wrong size.
    Status record_step(std::span<const double> load);
    bool rebalance_due() const { return steps_since_rebalance_ >= settings_.rebalance_interval_steps; }
    // Places on the window's loads and restarts the interval count.
    Result<ExpertPlacement> rebalance();
    std::vector<double> window_load() const;
    // The loads the next placement uses, per settings.smoothing (scaled to one window).
    // Before the first completed window: window_load().
    std::vector<double> estimated_load() const;
    int num_completed_windows() const { return static_cast<int>(completed_windows_); }
    int64_t steps() const { return steps_; }

private:
    static constexpr int kSubWindows = 10;
    EplbSettings settings_;
    int num_layers_;
    int num_logical_;
    EplbLayout layout_;
    int64_t sub_window_steps_;
    std::vector<std::vector<double>> sub_windows_;  // ring of kSubWindows + 1 (current)
    int current_ = 0;
    int64_t steps_in_current_ = 0;
    int64_t steps_ = 0;
    int64_t steps_since_rebalance_ = 0;
    // Smoothing over completed windows.
    std::vector<double> window_acc_;                // the window being filled
    int64_t steps_in_window_ = 0;
    std::vector<std::vector<double>> history_;      // kMeanOfWindows ring
    std::vector<double> ema_;                       // kEma
    int64_t completed_windows_ = 0;
};

}  // namespace dsi::cluster
