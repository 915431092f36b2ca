#include "cluster/ve_lb.h"

#include <string>

namespace dsi::cluster {

Result<int64_t> image_patches(int64_t width_px, int64_t height_px, int64_t patch_px) {
    if (patch_px <= 0 || width_px < 0 || height_px < 0) {
        return invalid_argument("image_patches: need patch > 0 and non-negative size");
    }
    return (width_px / patch_px) * (height_px / patch_px);  // S-LB
}

Result<VeChoice> VeLb::choose(const std::vector<VeMachine>& machines) {
    std::vector<int> up;
    for (int m = 0; m < static_cast<int>(machines.size()); ++m) {
        if (machines[m].up && !machines[m].patches_in_flight.empty()) {
            up.push_back(m);
        }
    }
    if (up.empty()) {
        return unavailable("ve lb: no vision encoder machine is up");
    }
    // S-LB: random machine first, then the least-loaded device on it.
    VeChoice c;
    c.machine = up[rng_.next() % up.size()];
    const auto& p = machines[c.machine].patches_in_flight;
    c.device = 0;
    for (int d = 1; d < static_cast<int>(p.size()); ++d) {
        if (p[d] < p[c.device]) {
            c.device = d;
        }
    }
    return c;
}

}  // namespace dsi::cluster
