#include "kv/state_slots.h"

#include <string>

#include "base/check.h"

namespace dsi::kv {

StateSlotPool::StateSlotPool(int64_t num_slots, int64_t slot_floats)
    : slot_floats_(slot_floats),
      data_(new float[static_cast<size_t>(num_slots * slot_floats)]),
      taken_(static_cast<size_t>(num_slots), 0) {
    DSI_CHECK(num_slots >= 0 && slot_floats >= 1);
    for (int64_t i = num_slots - 1; i >= 0; --i) free_.push_back(static_cast<SlotId>(i));
}

Result<SlotId> StateSlotPool::allocate() {
    if (free_.empty()) {
        return resource_exhausted("all " + std::to_string(num_slots()) + " state slots taken");
    }
    SlotId id = free_.back();
    free_.pop_back();
    taken_[id] = 1;
    return id;
}

void StateSlotPool::release(SlotId id) {
    DSI_CHECK(id >= 0 && id < num_slots() && taken_[id], "release of a free slot ", id);
    taken_[id] = 0;
    free_.push_back(id);
}

float* StateSlotPool::data(SlotId id) {
    DSI_DCHECK(id >= 0 && id < num_slots());
    return data_.get() + static_cast<int64_t>(id) * slot_floats_;
}

Status StateSlotPool::check_invariants() const {
    std::vector<uint8_t> seen(taken_.size(), 0);
    for (SlotId id : free_) {
        if (id < 0 || id >= num_slots() || taken_[id] || seen[id]++) {
            return internal_error("StateSlotPool invariant: bad free list entry " +
                                  std::to_string(id));
        }
    }
    int64_t taken = 0;
    for (uint8_t t : taken_) taken += t;
    if (taken + num_free() != num_slots()) return internal_error("StateSlotPool: counts differ");
    return Status::ok();
}

}  // namespace dsi::kv
