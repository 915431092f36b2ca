#include "comm/expert_load.h"

#include <algorithm>
#include <string>

namespace dsi::comm {

ExpertLoadCounter::ExpertLoadCounter(int num_layers, int num_experts)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      loads_(static_cast<size_t>(num_layers) * num_experts, 0.0) {
    DSI_CHECK(num_layers > 0 && num_experts > 0, "ExpertLoadCounter: empty shape");
}

Status ExpertLoadCounter::add(int layer, std::span<const int32_t> topk_ids) {
    if (layer < 0 || layer >= num_layers_) {
        return invalid_argument("expert load: layer " + std::to_string(layer) + " not in [0, " +
                                std::to_string(num_layers_) + ")");
    }
    for (int32_t e : topk_ids) {
        if (e < 0 || e >= num_experts_) {
            return invalid_argument("expert load: expert " + std::to_string(e) + " not in [0, " +
                                    std::to_string(num_experts_) + ")");
        }
    }
    double* row = loads_.data() + static_cast<size_t>(layer) * num_experts_;
    for (int32_t e : topk_ids) {
        row[e] += 1.0;
    }
    return Status::ok();
}

Status ExpertLoadCounter::add_slot_rows(int layer, const PlacementTable& placement,
                                        std::span<const int64_t> slot_rows) {
    if (layer < 0 || layer >= num_layers_ || placement.num_experts() != num_experts_ ||
        slot_rows.size() != placement.slot_expert().size()) {
        return invalid_argument("expert load: layer " + std::to_string(layer) + ", " +
                                std::to_string(slot_rows.size()) + " slot counts for " +
                                std::to_string(placement.slot_expert().size()) + " slots of " +
                                std::to_string(placement.num_experts()) + " experts");
    }
    double* row = loads_.data() + static_cast<size_t>(layer) * num_experts_;
    for (size_t p = 0; p < slot_rows.size(); ++p) {
        const int e = placement.slot_expert()[p];
        if (e >= 0) {
            row[e] += static_cast<double>(slot_rows[p]);
        }
    }
    return Status::ok();
}

Status ExpertLoadCounter::merge(std::span<const double> loads) {
    if (loads.size() != loads_.size()) {
        return invalid_argument("expert load: merging " + std::to_string(loads.size()) +
                                " loads into " + std::to_string(loads_.size()));
    }
    for (size_t i = 0; i < loads.size(); ++i) {
        loads_[i] += loads[i];
    }
    return Status::ok();
}

void ExpertLoadCounter::reset() { std::fill(loads_.begin(), loads_.end(), 0.0); }

Result<PlacementTable> layer_placement(std::span<const int> phy_to_log, int num_physical,
                                       int layer, int num_experts, int num_ranks) {
    if (num_ranks <= 0 || num_physical <= 0 || num_physical % num_ranks != 0) {
        return invalid_argument("placement: " + std::to_string(num_physical) +
                                " physical experts do not split over " +
                                std::to_string(num_ranks) + " ranks");
    }
    const size_t begin = static_cast<size_t>(layer) * num_physical;
    if (layer < 0 || begin + num_physical > phy_to_log.size()) {
        return invalid_argument("placement: no layer " + std::to_string(layer) + " in " +
                                std::to_string(phy_to_log.size()) + " slots");
    }
    std::vector<int> slots(phy_to_log.begin() + static_cast<std::ptrdiff_t>(begin),
                           phy_to_log.begin() + static_cast<std::ptrdiff_t>(begin + num_physical));
    return PlacementTable::create(num_experts, num_ranks, num_physical / num_ranks,
                                  std::move(slots));
}

}  // namespace dsi::comm
