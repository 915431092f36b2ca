// The landed EPLB policy (cluster::EplbController, eplb.h) behind the interface the live
// expert-parallel group asks (comm::PlacementPolicy; S-EPLB, issue 19 deliverable 3).
//
// Policy: record every step's global loads; when the controller's rebalance interval is
// due, place on its estimated loads (eplb.h: window, smoothing, min-max placement) and
// return the new placement with its moe_lb on the last window's loads. The placement is
// global (one node: the ranks of one host) with one expert group. Deterministic (eplb.h
// breaks ties to the lower index), so ranks fed the same loads decide the same.
// No I/O; thread model: one owner.
#pragma once

#include <functional>
#include <memory>

#include "cluster/eplb.h"
#include "comm/expert_load.h"

namespace dsi::cluster {

class LiveEplbPolicy final : public comm::PlacementPolicy {
public:
    // INVALID_ARGUMENT on bad settings or shape. The physical slots are
    // num_physical_experts(num_experts, num_ranks, settings.redundant_experts_per_rank).
    static Result<std::unique_ptr<LiveEplbPolicy>> create(const EplbSettings& settings,
                                                          int num_layers, int num_experts,
                                                          int num_ranks);

    Status record_step(std::span<const double> loads) override;
    Result<comm::PlacementDecision> decide() override;

private:
    LiveEplbPolicy(const EplbSettings& settings, int num_layers, int num_experts,
                   const EplbLayout& layout)
        : controller_(settings, num_layers, num_experts, layout) {}

    EplbController controller_;
};

// What ExpertParallelOptions::placement_policy takes: makes a LiveEplbPolicy with
// `settings` for a group's shape (MoE layers, routed experts, ranks).
using PlacementPolicyFactory = std::function<Result<std::unique_ptr<comm::PlacementPolicy>>(
    int num_layers, int num_experts, int num_ranks)>;
PlacementPolicyFactory live_eplb_factory(const EplbSettings& settings);

}  // namespace dsi::cluster
