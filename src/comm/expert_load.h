// Glue between the EP all-to-all and the EPLB policy (S-EPLB; issue 19 deliverable 3,
// the pure part). The policy itself (windows, smoothing, min-max placement) is
// cluster::EplbController / cluster::place_experts; this file only
//  - counts, per MoE layer and logical expert, the (token, k) rows routed in one step —
//    the per-step input of EplbController::record_step, which keeps the window — from a
//    rank's own top-k ids or, globally, from the layout's per-slot row counts, and
//  - turns one layer of the policy's placement (ExpertPlacement::phy_to_log) into the
//    PlacementTable that layout() takes.
// comm/ sits below cluster/ (ARCHITECTURE.md), so both take plain arrays, not the
// cluster types. Thread model: ExpertLoadCounter has one owner; the function is pure.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "comm/moe_comm.h"

namespace dsi::comm {

class ExpertLoadCounter {
public:
    // REQUIRES: num_layers > 0, num_experts > 0.
    ExpertLoadCounter(int num_layers, int num_experts);

    // Adds one layer's routing of this step (top-k ids of this rank's tokens).
    // INVALID_ARGUMENT on a layer or expert id out of range (nothing is counted then).
    Status add(int layer, std::span<const int32_t> topk_ids);
    // Adds one layer's global load of a step from a layout: MoeLayout::slot_rows (rows per
    // physical slot, all ranks) summed over each expert's replicas. Every rank gets the
    // same loads this way, with no exchange beyond layout's own. INVALID_ARGUMENT on a
    // layer out of range or slot_rows not matching the placement.
    Status add_slot_rows(int layer, const PlacementTable& placement,
                         std::span<const int64_t> slot_rows);
    // Adds another counter's loads (another rank's, once they are gathered), so the sum
    // over ranks is the step's global load. INVALID_ARGUMENT on a size mismatch.
    Status merge(std::span<const double> loads);
    // [num_layers * num_experts], layer-major: what EplbController::record_step takes.
    std::span<const double> step_loads() const { return loads_; }
    // Starts the next step.
    void reset();

private:
    int num_layers_;
    int num_experts_;
    std::vector<double> loads_;
};

// Layer `layer` of a placement given as phy_to_log [num_layers * num_physical] (slot p of
// a layer on rank p / (num_physical / num_ranks), as cluster::ExpertPlacement puts it).
// INVALID_ARGUMENT when num_physical does not split over num_ranks, the array is too
// short, or the layer misses an expert (PlacementTable::create).
Result<PlacementTable> layer_placement(std::span<const int> phy_to_log, int num_physical, int layer,
                                       int num_experts, int num_ranks);

// A new placement for every MoE layer, as the live EPLB policy decided it.
struct PlacementDecision {
    std::vector<int> phy_to_log;  // [num_layers * num_physical]; empty: keep the placement
    // moe_lb (slowest rank / mean, mean over layers, replicas splitting their expert's load
    // evenly) of the new placement on the loads of the window it was computed from.
    double moe_lb_on_window = 0;
};

// The decision-maker live EPLB asks once per step (S-EPLB). The policy class itself lives
// in cluster/ (above comm/ and model/), so the live code sees it through this interface;
// cluster::LiveEplbPolicy implements it with cluster::EplbController. Every rank of a group
// holds its own instance and feeds it the same global loads, so every rank decides the
// same placement at the same step with no further exchange: an implementation must be a
// deterministic function of the loads it was given. Thread model: one owner.
class PlacementPolicy {
public:
    virtual ~PlacementPolicy() = default;
    // One step's global load per (MoE layer, logical expert), layer-major (what
    // ExpertLoadCounter::step_loads holds). INVALID_ARGUMENT on a wrong size.
    virtual Status record_step(std::span<const double> loads) = 0;
    // After record_step: the placement to switch to when one is due, else an empty one.
    virtual Result<PlacementDecision> decide() = 0;
};

}  // namespace dsi::comm
