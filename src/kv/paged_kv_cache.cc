#include "kv/paged_kv_cache.h"

#include <chrono>

#include "base/check.h"
#include "base/clock.h"

namespace dsi::kv {

void LayerGate::set_ready(int64_t n) {
    {
        MutexLock l(&mu_);
        ready_.store(n, std::memory_order_release);
    }
    cv_.notify_all();
}

bool LayerGate::wait(int64_t layer, int64_t deadline_ns) {
    if (layer < ready()) return true;
    const int64_t start = steady_clock_ns();
    const std::chrono::steady_clock::time_point deadline{std::chrono::nanoseconds(deadline_ns)};
    bool ok = true;
    {
        MutexLock l(&mu_);
        while (ok && layer >= ready_.load(std::memory_order_acquire)) {
            ok = cv_.wait_until(&mu_, deadline) ||
                 layer < ready_.load(std::memory_order_acquire);
        }
    }
    wait_ns_.fetch_add(steady_clock_ns() - start, std::memory_order_relaxed);
    num_waits_.fetch_add(1, std::memory_order_relaxed);
    return ok;
}

PagedKvCache::PagedKvCache(BlockPool* pool, size_t group, std::vector<BlockId> table,
                           float* state)
    : pool_(pool), group_(group), table_(std::move(table)), state_(state) {
    DSI_CHECK(pool_ != nullptr && group_ < pool_->groups().size());
    const CacheGroupSpec& g = pool_->groups()[group_];
    num_layers_ = g.num_layers;
    tokens_per_entry_ = g.tokens_per_entry;
    floats_per_entry_ = g.floats_per_entry;
}

float* PagedKvCache::row(int64_t layer, int64_t pos) {
    DSI_DCHECK(layer >= 0 && layer < num_layers_ && pos >= 0 && pos < capacity());
    // S-KV-6: a swapped-in row is read only once its layer has been copied.
    if (gate_ != nullptr && pos >= gate_begin_ && pos < gate_end_ && layer >= gate_->ready()) {
        DSI_CHECK(gate_->wait(layer, steady_clock_ns() + int64_t{60'000'000'000}));
    }
    const int64_t entries = kBlockTokens / tokens_per_entry_;
    const int64_t entry = (pos % kBlockTokens) / tokens_per_entry_;
    float* block = pool_->data(group_, table_[static_cast<size_t>(pos / kBlockTokens)]);
    return block + (layer * entries + entry) * floats_per_entry_;
}

float* PagedKvCache::entry(size_t group, int64_t layer, int64_t pos) {
    if (group == group_) return row(layer, pos);
    DSI_DCHECK(group < pool_->groups().size());
    const CacheGroupSpec& g = pool_->groups()[group];
    DSI_DCHECK(layer >= 0 && layer < g.num_layers && pos >= 0 && pos < capacity());
    const int64_t e = (pos % kBlockTokens) / g.tokens_per_entry;
    float* block = pool_->data(group, table_[static_cast<size_t>(pos / kBlockTokens)]);
    return block + (layer * g.entries_per_block() + e) * g.floats_per_entry;
}

}  // namespace dsi::kv
