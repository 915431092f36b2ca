#include "kv/host_swap.h"

#include <string>

#include "base/check.h"

namespace dsi::kv {

HostSwapSpace::HostSwapSpace(int64_t capacity_bytes, int64_t block_floats)
    : block_floats_(block_floats) {
    DSI_CHECK(block_floats > 0);
    const int64_t n = capacity_bytes > 0
                          ? capacity_bytes / (block_floats * static_cast<int64_t>(sizeof(float)))
                          : 0;
    mem_.resize(static_cast<size_t>(n));
    // Lowest slot ids first (free_ is used as a stack).
    for (int64_t s = n; s-- > 0;) free_.push_back(static_cast<int32_t>(s));
}

std::optional<std::vector<int32_t>> HostSwapSpace::allocate(int64_t n) {
    if (n < 0 || n > num_free()) return std::nullopt;
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const int32_t s = free_.back();
        free_.pop_back();
        auto& m = mem_[static_cast<size_t>(s)];
        if (m == nullptr) m = std::make_unique<float[]>(static_cast<size_t>(block_floats_));
        out.push_back(s);
    }
    return out;
}

void HostSwapSpace::release(std::span<const int32_t> slots) {
    pending_.insert(pending_.end(), slots.begin(), slots.end());
}

void HostSwapSpace::end_plan() {
    free_.insert(free_.end(), pending_.begin(), pending_.end());
    pending_.clear();
}

Status HostSwapSpace::check_invariants(std::span<const int32_t> held) const {
    std::vector<uint8_t> seen(mem_.size(), 0);
    auto mark = [&](int32_t s, const char* what) -> Status {
        if (s < 0 || s >= num_slots()) {
            return internal_error(std::string("swap slot out of range in ") + what);
        }
        if (seen[static_cast<size_t>(s)]++ != 0) {
            return internal_error("swap slot " + std::to_string(s) + " counted twice (" + what + ")");
        }
        return Status::ok();
    };
    for (int32_t s : free_) DSI_RETURN_IF_ERROR(mark(s, "free"));
    for (int32_t s : pending_) DSI_RETURN_IF_ERROR(mark(s, "pending"));
    for (int32_t s : held) {
        DSI_RETURN_IF_ERROR(mark(s, "held"));
        if (mem_[static_cast<size_t>(s)] == nullptr) {
            return internal_error("held swap slot " + std::to_string(s) + " has no memory");
        }
    }
    for (size_t s = 0; s < seen.size(); ++s) {
        if (seen[s] == 0) return internal_error("swap slot " + std::to_string(s) + " leaked");
    }
    return Status::ok();
}

}  // namespace dsi::kv
