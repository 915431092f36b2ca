#include "kv/paged_kv_cache.h"

#include "base/check.h"

namespace dsi::kv {

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
    const int64_t entries = kBlockTokens / tokens_per_entry_;
    const int64_t entry = (pos % kBlockTokens) / tokens_per_entry_;
    float* block = pool_->data(group_, table_[static_cast<size_t>(pos / kBlockTokens)]);
    return block + (layer * entries + entry) * floats_per_entry_;
}

}  // namespace dsi::kv
