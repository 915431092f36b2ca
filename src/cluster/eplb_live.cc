#include "cluster/eplb_live.h"

#include <string>

namespace dsi::cluster {

Result<std::unique_ptr<LiveEplbPolicy>> LiveEplbPolicy::create(const EplbSettings& settings,
                                                               int num_layers, int num_experts,
                                                               int num_ranks) {
    DSI_RETURN_IF_ERROR(settings.validate());
    if (num_layers < 1 || num_experts < 1 || num_ranks < 1 || num_ranks > num_experts) {
        return invalid_argument("eplb: " + std::to_string(num_ranks) + " ranks, " +
                                std::to_string(num_experts) + " experts, " +
                                std::to_string(num_layers) + " MoE layers");
    }
    EplbLayout layout;
    layout.num_ranks = num_ranks;
    layout.num_physical =
        num_physical_experts(num_experts, num_ranks, settings.redundant_experts_per_rank);
    return std::unique_ptr<LiveEplbPolicy>(
        new LiveEplbPolicy(settings, num_layers, num_experts, layout));
}

Status LiveEplbPolicy::record_step(std::span<const double> loads) {
    return controller_.record_step(loads);
}

Result<comm::PlacementDecision> LiveEplbPolicy::decide() {
    comm::PlacementDecision d;
    if (!controller_.rebalance_due()) {
        return d;
    }
    DSI_ASSIGN_OR_RETURN(ExpertPlacement placement, controller_.rebalance());
    d.moe_lb_on_window = moe_lb(placement, controller_.window_load()).mean;
    d.phy_to_log = std::move(placement.phy_to_log);
    return d;
}

PlacementPolicyFactory live_eplb_factory(const EplbSettings& settings) {
    return [settings](int num_layers, int num_experts,
                      int num_ranks) -> Result<std::unique_ptr<comm::PlacementPolicy>> {
        DSI_ASSIGN_OR_RETURN(std::unique_ptr<LiveEplbPolicy> p,
                             LiveEplbPolicy::create(settings, num_layers, num_experts, num_ranks));
        return std::unique_ptr<comm::PlacementPolicy>(std::move(p));
    };
}

}  // namespace dsi::cluster
