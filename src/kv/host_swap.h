// HostSwapSpace: the bounded host buffer that holds the KV blocks of sequences preempted
// by swapping (issue 5, docs/engine.md "Preemption"). Memory is block-sized slots,
// allocated on first use and kept; at most capacity_bytes / block_bytes slots exist.
//
// Policy (engine side): a victim whose computed rows fit in the free slots is swapped
// out (its blocks are copied here by the worker at the start of the next step, before
// anything can overwrite them) and copied back into fresh pool blocks when it is
// admitted again; a victim that does not fit is preempted by recompute.
//
// Slot reuse is ordered by steps like pool blocks: a slot released while a plan that
// still reads it may be pending (restore) becomes reusable only after end_plan(), i.e.
// from the next submitted plan on; the worker runs a plan's saves before its restores.
// Thread model: owned by the engine's scheduling thread; the worker only reads and
// writes slot memory at the times the plans order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"

namespace dsi::kv {

class HostSwapSpace {
public:
    // capacity_bytes / (block_floats * 4) slots; 0 slots disables swapping.
    HostSwapSpace(int64_t capacity_bytes, int64_t block_floats);

    int64_t num_slots() const { return static_cast<int64_t>(mem_.size()); }
    int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
    // Slots held (allocated and not released).
    int64_t num_held() const { return num_slots() - num_free() - static_cast<int64_t>(pending_.size()); }
    int64_t block_floats() const { return block_floats_; }

    // n slots, all or nothing; nullopt if fewer are free.
    std::optional<std::vector<int32_t>> allocate(int64_t n);
    // Gives slots back; they become allocatable after the next end_plan().
    void release(std::span<const int32_t> slots);
    // Call after submitting a plan: releases before it become free.
    void end_plan();
    // Memory of a held slot: block_floats() floats, stable for the space's lifetime.
    float* slot(int32_t s) { return mem_[static_cast<size_t>(s)].get(); }

    // Every slot is exactly one of: free, pending release, or held once in `held`.
    Status check_invariants(std::span<const int32_t> held) const;

private:
    int64_t block_floats_;
    std::vector<std::unique_ptr<float[]>> mem_;  // null until first allocated
    std::vector<int32_t> free_;
    std::vector<int32_t> pending_;
};

}  // namespace dsi::kv
