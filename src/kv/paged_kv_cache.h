// PagedKvCache: the model's KvCache interface over a block table in a BlockPool.
//
// Position p of the sequence lives in block table[p / 128], entry (p % 128) /
// tokens_per_entry of each cache group; within a block the layout is
// [layer][entry][floats_per_entry]. row() reads the chosen group, entry() any group;
// state() is the sequence's state slot (StateSlotPool), when the model has one. The table is a value copied into each step's
// plan, so the thread running the forward pass never sees the scheduler grow it.
// With a LayerGate set (S-KV-6 swap-in overlap), a read of a position in the gated
// range waits until the swap-in thread has copied that layer: the forward pass may
// start before the last layer of a fetched block has arrived.
// Thread model: one user at a time (row() may be called from the forward pass's pool
// threads concurrently, as the model does); holds no references (the owner pins
// blocks). LayerGate: set_ready() from the swap-in thread, wait() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "base/mutex.h"
#include "kv/block_pool.h"
#include "kernels/kv_cache.h"

namespace dsi::kv {

// How many layers of a step's swapped-in blocks are in the pool (monotonic).
class LayerGate {
public:
    // Layers [0, n) are ready. REQUIRES: n does not decrease.
    void set_ready(int64_t n);
    int64_t ready() const { return ready_.load(std::memory_order_acquire); }
    // Waits until `layer` is ready; false at `deadline_ns` (steady clock).
    bool wait(int64_t layer, int64_t deadline_ns);
    int64_t wait_ns() const { return wait_ns_.load(std::memory_order_relaxed); }
    int64_t num_waits() const { return num_waits_.load(std::memory_order_relaxed); }

private:
    std::atomic<int64_t> ready_{0};
    std::atomic<int64_t> wait_ns_{0};
    std::atomic<int64_t> num_waits_{0};
    // ready_ is atomic (read lock-free on the fast path); mu_ orders a waiter's check
    // against set_ready's store so no wake-up is lost.
    Mutex mu_;
    CondVar cv_;
};

class PagedKvCache final : public KvCache {
public:
    PagedKvCache() = default;
    // REQUIRES: `pool` outlives this object; group < pool->groups().size().
    // `state`: the sequence's state slot (nullptr: none); REQUIRES: outlives this object.
    PagedKvCache(BlockPool* pool, size_t group, std::vector<BlockId> table,
                 float* state = nullptr);

    int64_t capacity() const override { return static_cast<int64_t>(table_.size()) * kBlockTokens; }
    float* row(int64_t layer, int64_t pos) override;
    float* entry(size_t group, int64_t layer, int64_t pos) override;
    float* state() override { return state_; }
    const std::vector<BlockId>& table() const { return table_; }
    // Reads of positions [begin_pos, end_pos) wait on `gate` for their layer (aborts if
    // a layer is not ready within 60 s: the swap-in is a local copy). REQUIRES: gate
    // outlives every row() call; nullptr clears.
    void set_gate(LayerGate* gate, int64_t begin_pos, int64_t end_pos) {
        gate_ = gate;
        gate_begin_ = begin_pos;
        gate_end_ = end_pos;
    }

private:
    BlockPool* pool_ = nullptr;
    size_t group_ = 0;
    int64_t num_layers_ = 0;
    int64_t tokens_per_entry_ = 1;
    int64_t floats_per_entry_ = 0;
    std::vector<BlockId> table_;
    float* state_ = nullptr;
    LayerGate* gate_ = nullptr;
    int64_t gate_begin_ = 0;
    int64_t gate_end_ = 0;
};

}  // namespace dsi::kv
