// PagedKvCache: the model's KvCache interface over a block table in a BlockPool.
//
// Position p of the sequence lives in block table[p / 128], entry (p % 128) /
// tokens_per_entry of the chosen cache group; within a block the layout is
// [layer][entry][floats_per_entry]. The table is a value copied into each step's
// plan, so the thread running the forward pass never sees the scheduler grow it.
// Thread model: one user at a time; holds no references (the owner pins blocks).
#pragma once

#include <cstdint>
#include <vector>

#include "kv/block_pool.h"
#include "model/kv_cache.h"

namespace dsi::kv {

class PagedKvCache final : public KvCache {
public:
    PagedKvCache() = default;
    // REQUIRES: `pool` outlives this object; group < pool->groups().size().
    PagedKvCache(BlockPool* pool, size_t group, std::vector<BlockId> table);

    int64_t capacity() const override { return static_cast<int64_t>(table_.size()) * kBlockTokens; }
    float* row(int64_t layer, int64_t pos) override;
    const std::vector<BlockId>& table() const { return table_; }

private:
    BlockPool* pool_ = nullptr;
    size_t group_ = 0;
    int64_t num_layers_ = 0;
    int64_t tokens_per_entry_ = 1;
    int64_t floats_per_entry_ = 0;
    std::vector<BlockId> table_;
};

}  // namespace dsi::kv
