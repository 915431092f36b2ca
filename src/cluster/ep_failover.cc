#include "cluster/ep_failover.h"

#include <string>

#include "cluster/eplb.h"

namespace dsi::cluster {

Result<EpRestartPlan> plan_ep_restart(const std::vector<bool>& device_healthy, int num_logical,
                                      int redundant_per_rank, int min_ep_size) {
    if (num_logical <= 0 || redundant_per_rank < 0 || min_ep_size < 1) {
        return invalid_argument("ep failover: need experts > 0, redundancy >= 0, min size >= 1");
    }
    EpRestartPlan p;
    for (int d = 0; d < static_cast<int>(device_healthy.size()); ++d) {
        if (device_healthy[d]) {
            p.devices.push_back(d);
        }
    }
    // S-DEPLOY: restart with EP size = the number of healthy devices.
    p.ep_size = static_cast<int>(p.devices.size());
    if (p.ep_size < min_ep_size) {
        return unavailable("ep failover: " + std::to_string(p.ep_size) +
                           " healthy devices, instance needs " + std::to_string(min_ep_size));
    }
    p.num_physical_experts = num_physical_experts(num_logical, p.ep_size, redundant_per_rank);
    p.experts_per_rank = p.num_physical_experts / p.ep_size;
    return p;
}

}  // namespace dsi::cluster
