#include "kv/paged_kv_cache.h"

#include <chrono>

#include "base/check.h"

namespace dsi::kv {
namespace {

int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

void LayerGate::set_ready(int64_t n) {
    {
        std::lock_guard<std::mutex> l(mu_);
        ready_.store(n, std::memory_order_release);
    }
    cv_.notify_all();
}

bool LayerGate::wait(int64_t layer, int64_t deadline_ns) {
    if (layer < ready()) return true;
    const int64_t start = steady_ns();
    std::unique_lock<std::mutex> l(mu_);
    const bool ok = cv_.wait_until(
        l,
        std::chrono::steady_clock::time_point(std::chrono::nanoseconds(deadline_ns)),
        [&] { return layer < ready_.load(std::memory_order_acquire); });
    wait_ns_.fetch_add(steady_ns() - start, std::memory_order_relaxed);
    num_waits_.fetch_add(1, std::memory_order_relaxed);
    return ok;
}

PagedKvCache::PagedKvCache(BlockPool* pool, size_t group, std::vector<BlockId> table)
    : pool_(pool), group_(group), table_(std::move(table)) {
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
        DSI_CHECK(gate_->wait(layer, steady_ns() + int64_t{60'000'000'000}));
    }
    const int64_t entries = kBlockTokens / tokens_per_entry_;
    const int64_t entry = (pos % kBlockTokens) / tokens_per_entry_;
    float* block = pool_->data(group_, table_[static_cast<size_t>(pos / kBlockTokens)]);
    return block + (layer * entries + entry) * floats_per_entry_;
}

}  // namespace dsi::kv
