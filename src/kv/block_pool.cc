#include "kv/block_pool.h"

#include <algorithm>

#include "base/check.h"

namespace dsi::kv {

Status CacheGroupSpec::validate() const {
    if (num_layers < 1) return invalid_argument("cache group '" + name + "': num_layers < 1");
    if (floats_per_entry < 1) {
        return invalid_argument("cache group '" + name + "': floats_per_entry < 1");
    }
    if (tokens_per_entry < 1 || kBlockTokens % tokens_per_entry != 0) {
        return invalid_argument("cache group '" + name + "': tokens_per_entry must divide " +
                                std::to_string(kBlockTokens));
    }
    return Status::ok();
}

Result<std::unique_ptr<BlockPool>> BlockPool::create(std::vector<CacheGroupSpec> groups,
                                                     int64_t num_blocks) {
    if (groups.empty()) return invalid_argument("block pool needs at least one cache group");
    for (const CacheGroupSpec& g : groups) DSI_RETURN_IF_ERROR(g.validate());
    if (num_blocks < 1 || num_blocks > (int64_t{1} << 30)) {
        return invalid_argument("block pool: num_blocks must be in [1, 2^30], got " +
                                std::to_string(num_blocks));
    }
    return std::unique_ptr<BlockPool>(new BlockPool(std::move(groups), num_blocks));
}

BlockPool::BlockPool(std::vector<CacheGroupSpec> groups, int64_t num_blocks)
    : groups_(std::move(groups)),
      ref_(static_cast<size_t>(num_blocks), 0),
      keyed_(static_cast<size_t>(num_blocks), 0),
      key_(static_cast<size_t>(num_blocks)),
      lru_prev_(static_cast<size_t>(num_blocks) + 1),
      lru_next_(static_cast<size_t>(num_blocks) + 1),
      in_lru_(static_cast<size_t>(num_blocks), 0) {
    for (const CacheGroupSpec& g : groups_) {
        // Left uninitialised: a row is always written before it is read.
        data_.emplace_back(new float[static_cast<size_t>(g.block_floats() * num_blocks)]);
    }
    const int32_t sentinel = static_cast<int32_t>(num_blocks);
    lru_prev_[sentinel] = lru_next_[sentinel] = sentinel;
    // Lowest ids first out.
    free_.reserve(static_cast<size_t>(num_blocks));
    for (int64_t i = num_blocks - 1; i >= 0; --i) free_.push_back(static_cast<BlockId>(i));
    num_free_ = num_blocks;
}

int64_t BlockPool::bytes_per_block() const {
    int64_t b = 0;
    for (const CacheGroupSpec& g : groups_)
        b += g.block_floats() * static_cast<int64_t>(sizeof(float));
    return b;
}

void BlockPool::lru_push_back(BlockId id) {
    const int32_t s = static_cast<int32_t>(num_blocks());
    const int32_t last = lru_prev_[s];
    lru_next_[last] = id;
    lru_prev_[id] = last;
    lru_next_[id] = s;
    lru_prev_[s] = id;
    in_lru_[id] = 1;
}

void BlockPool::lru_remove(BlockId id) {
    DSI_CHECK(in_lru_[id]);
    lru_next_[lru_prev_[id]] = lru_next_[id];
    lru_prev_[lru_next_[id]] = lru_prev_[id];
    in_lru_[id] = 0;
}

Result<std::vector<BlockId>> BlockPool::allocate(int64_t n) {
    DSI_CHECK(n >= 0);
    if (n > num_available()) {
        return resource_exhausted("KV block pool: need " + std::to_string(n) + " blocks, " +
                                  std::to_string(num_available()) + " available of " +
                                  std::to_string(num_blocks()));
    }
    std::vector<BlockId> out;
    out.reserve(static_cast<size_t>(n));
    const int32_t s = static_cast<int32_t>(num_blocks());
    while (static_cast<int64_t>(out.size()) < n) {
        BlockId id;
        if (!free_.empty()) {
            id = free_.back();
            free_.pop_back();
            --num_free_;
        } else {
            id = lru_next_[s];  // least recently released
            DSI_CHECK(id != s);
            lru_remove(id);
            index_.erase(key_[id]);
            keyed_[id] = 0;
            --num_cached_;
            ++counters_.evictions;
        }
        DSI_CHECK_EQ(ref_[id], 0);
        ref_[id] = 1;
        out.push_back(id);
    }
    return out;
}

void BlockPool::ref(BlockId id) {
    DSI_CHECK(id >= 0 && id < num_blocks());
    if (ref_[id] == 0) {
        DSI_CHECK(keyed_[id], "ref of a free block ", id);
        lru_remove(id);
        --num_cached_;
    }
    ++ref_[id];
}

void BlockPool::release(BlockId id) {
    DSI_CHECK(id >= 0 && id < num_blocks());
    DSI_CHECK(ref_[id] > 0, "release of unreferenced block ", id);
    if (--ref_[id] > 0) return;
    if (keyed_[id]) {
        lru_push_back(id);
        ++num_cached_;
    } else {
        free_.push_back(id);
        ++num_free_;
    }
}

void BlockPool::release_all(std::span<const BlockId> ids) {
    // Reverse order: a chain's tail is evicted before its head, which keeps the
    // longest still-matchable prefix.
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) release(*it);
}

std::vector<BlockId> BlockPool::match_and_pin(std::span<const BlockKey> keys) {
    std::vector<BlockId> hit;
    for (const BlockKey& k : keys) {
        auto it = index_.find(k);
        if (it == index_.end()) break;
        ref(it->second);
        hit.push_back(it->second);
    }
    counters_.hit_blocks += static_cast<int64_t>(hit.size());
    counters_.miss_blocks += static_cast<int64_t>(keys.size() - hit.size());
    return hit;
}

PrefixPeek BlockPool::peek(std::span<const BlockKey> keys) const {
    PrefixPeek p;
    for (const BlockKey& k : keys) {
        auto it = index_.find(k);
        if (it == index_.end()) break;
        ++p.num_hit_blocks;
        if (ref_[it->second] == 0) ++p.num_unreferenced;
    }
    return p;
}

bool BlockPool::publish(BlockId id, const BlockKey& key) {
    DSI_CHECK(id >= 0 && id < num_blocks() && ref_[id] > 0);
    if (keyed_[id]) return false;
    if (!index_.emplace(key, id).second) return false;
    keyed_[id] = 1;
    key_[id] = key;
    ++counters_.published;
    return true;
}

float* BlockPool::data(size_t group, BlockId id) {
    DSI_DCHECK(group < groups_.size() && id >= 0 && id < num_blocks());
    return data_[group].get() + static_cast<int64_t>(id) * groups_[group].block_floats();
}

Status BlockPool::check_invariants(std::span<const int32_t> expected_refs) const {
    const int64_t n = num_blocks();
    auto bad = [](const std::string& what) {
        return internal_error("BlockPool invariant: " + what);
    };
    if (!expected_refs.empty() && static_cast<int64_t>(expected_refs.size()) != n) {
        return bad("expected_refs has the wrong size");
    }
    std::vector<uint8_t> on_free(static_cast<size_t>(n), 0);
    for (BlockId id : free_) {
        if (id < 0 || id >= n) return bad("free list holds an invalid id");
        if (on_free[id]++) return bad("block " + std::to_string(id) + " twice on the free list");
    }
    // Walk the LRU both ways.
    int64_t lru_count = 0;
    const int32_t s = static_cast<int32_t>(n);
    for (int32_t id = lru_next_[s], prev = s; id != s; prev = id, id = lru_next_[id]) {
        if (id < 0 || id >= n) return bad("LRU list holds an invalid id");
        if (!in_lru_[id]) return bad("block " + std::to_string(id) + " linked but not marked LRU");
        if (lru_prev_[id] != prev) return bad("LRU back link broken at " + std::to_string(id));
        if (++lru_count > n) return bad("LRU list has a cycle");
    }
    int64_t used = 0, cached = 0, free = 0, keyed = 0;
    for (BlockId id = 0; id < n; ++id) {
        const std::string b = "block " + std::to_string(id);
        if (ref_[id] < 0) return bad(b + " has a negative refcount");
        if (!expected_refs.empty() && expected_refs[id] != ref_[id]) {
            return bad(b + " refcount " + std::to_string(ref_[id]) + ", owners hold " +
                       std::to_string(expected_refs[id]));
        }
        if (keyed_[id]) {
            ++keyed;
            auto it = index_.find(key_[id]);
            if (it == index_.end() || it->second != id) return bad(b + " keyed but not indexed");
        }
        if (ref_[id] > 0) {
            ++used;
            if (on_free[id] || in_lru_[id]) return bad(b + " used but on a free/LRU list");
        } else if (keyed_[id]) {
            ++cached;
            if (!in_lru_[id] || on_free[id]) return bad(b + " cached but not (only) on the LRU");
        } else {
            ++free;
            if (!on_free[id] || in_lru_[id])
                return bad(b + " free but not (only) on the free list");
        }
    }
    if (static_cast<int64_t>(index_.size()) != keyed) return bad("index size != keyed blocks");
    if (cached != lru_count || cached != num_cached_) return bad("cached count mismatch");
    if (free != static_cast<int64_t>(free_.size()) || free != num_free_) {
        return bad("free count mismatch");
    }
    if (used + cached + free != n) return bad("states do not partition the pool");
    return Status::ok();
}

BlockPoolStats BlockPool::stats() const {
    BlockPoolStats s = counters_;
    s.num_blocks = num_blocks();
    s.num_free = num_free_;
    s.num_cached = num_cached_;
    s.num_used = num_used();
    return s;
}

}  // namespace dsi::kv
