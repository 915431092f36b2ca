// EP failover: how an expert-parallel instance restarts after device failures
// (SPEC S-DEPLOY).
//
// Policy: one instance's devices form one communication domain, so a failed device
// takes the whole instance down; it restarts with EP size = the number of healthy
// devices it has (no waiting for a replacement). The expert layout is recomputed for
// the new size (S-EPLB rounding). Below min_ep_size (e.g. the experts no longer fit in
// HBM) the instance stays down: UNAVAILABLE, and P/D quota redundancy plus request
// re-routing carry the load. Pure function. Thread model: none (no state).
#pragma once

#include <span>
#include <vector>

#include "base/status.h"

namespace dsi::cluster {

struct EpRestartPlan {
    int ep_size = 0;
    std::vector<int> devices;  // healthy device indices, in order; rank i = devices[i]
    int num_physical_experts = 0;
    int experts_per_rank = 0;
};

Result<EpRestartPlan> plan_ep_restart(const std::vector<bool>& device_healthy, int num_logical,
                                      int redundant_per_rank, int min_ep_size);

}  // namespace dsi::cluster
