// StateSlotPool: fixed-size per-sequence state slots that are not paged.
//
// V4-class models keep, per sequence, a sliding-window KV ring (window 128 + 6, S-KV-8)
// and compressor partial state; each sequence owns exactly one slot for its lifetime.
// MLA models need none. Policy: slots are handed out lowest id first; allocate() fails
// with RESOURCE_EXHAUSTED when all are taken (the scheduler treats a slot like a block
// when admitting). Thread model: not thread-safe; owned by the engine's scheduling thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"

namespace dsi::kv {

using SlotId = int32_t;

class StateSlotPool {
public:
    // REQUIRES: num_slots >= 0, slot_floats >= 1.
    StateSlotPool(int64_t num_slots, int64_t slot_floats);

    int64_t num_slots() const { return static_cast<int64_t>(taken_.size()); }
    int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
    bool is_taken(SlotId id) const {
        return id >= 0 && id < num_slots() && taken_[static_cast<size_t>(id)] != 0;
    }
    Result<SlotId> allocate();
    // REQUIRES: `id` is taken.
    void release(SlotId id);
    // slot_floats floats; lives as long as the pool.
    float* data(SlotId id);
    Status check_invariants() const;

private:
    int64_t slot_floats_;
    std::unique_ptr<float[]> data_;
    std::vector<uint8_t> taken_;
    std::vector<SlotId> free_;
};

}  // namespace dsi::kv
