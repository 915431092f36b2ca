// BlockPool: fixed-size KV blocks shared by sequences, reference counted, with a
// hash-chain prefix index and an LRU of unreferenced cached blocks.
//
// A block covers kBlockTokens (128) consecutive token positions of one sequence. The
// pool is built for more than one kind of cache: a block id names one slice in every
// cache group of the pool, and each group stores that slice in its own layout
// (CacheGroupSpec: layers x entries x floats, one entry per 1, 4 or 128 tokens). MLA
// latent rows are one group (one entry per token); a V4-class model adds groups with
// compressed entries (ratio 4 or 128). Sharing, refcounts, the prefix index and
// eviction act on block ids, so all groups of a block live and die together. Fixed
// per-sequence state (SWA rings, compressor partial state) is not paged: see
// StateSlotPool in state_slots.h.
//
// Block states (checked by check_invariants):
//   used    ref > 0 (held by >= 1 sequence; may also be in the index)
//   cached  ref == 0, in the prefix index, on the LRU list (contents kept, evictable)
//   free    ref == 0, not in the index, on the free list
// Policies:
//   - allocate() takes free blocks first, then evicts cached blocks least recently
//     released first (LRU); it is all-or-nothing.
//   - A block enters the index only through publish(), after all its rows are
//     computed (full block); a block with the key already present stays private.
//   - match_and_pin() walks the key chain from the start and stops at the first miss
//     (longest-prefix match on metadata only, S-KV-4); it pins the hit blocks.
// Thread model: not thread-safe; owned by the engine's scheduling thread. Block data
// (data()) is written by whoever runs the forward pass; the engine orders those
// writes by step (see engine.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/block_key.h"

namespace dsi::kv {

using BlockId = int32_t;

struct CacheGroupSpec {
    std::string name;  // e.g. "mla"
    int64_t num_layers = 0;
    int64_t tokens_per_entry = 1;  // 1, 4, ..., 128; divides kBlockTokens
    int64_t floats_per_entry = 0;

    int64_t entries_per_block() const { return kBlockTokens / tokens_per_entry; }
    int64_t block_floats() const { return num_layers * entries_per_block() * floats_per_entry; }
    Status validate() const;
};

struct BlockPoolStats {
    int64_t num_blocks = 0;
    int64_t num_used = 0;
    int64_t num_cached = 0;  // unreferenced, in the index
    int64_t num_free = 0;
    int64_t hit_blocks = 0;   // match_and_pin: blocks found
    int64_t miss_blocks = 0;  // match_and_pin: blocks asked for and not found
    int64_t evictions = 0;
    int64_t published = 0;
};

struct PrefixPeek {
    int64_t num_hit_blocks = 0;
    int64_t num_unreferenced = 0;  // hit blocks that pinning would take out of the LRU
};

class BlockPool {
public:
    // INVALID_ARGUMENT on a bad spec or num_blocks < 1.
    static Result<std::unique_ptr<BlockPool>> create(std::vector<CacheGroupSpec> groups,
                                                     int64_t num_blocks);

    int64_t num_blocks() const { return static_cast<int64_t>(ref_.size()); }
    // Blocks allocate() can hand out now: free plus cached (evictable).
    int64_t num_available() const { return num_free_ + num_cached_; }
    int64_t num_used() const { return num_blocks() - num_available(); }
    const std::vector<CacheGroupSpec>& groups() const { return groups_; }
    int64_t bytes_per_block() const;

    // n new blocks with ref 1, or RESOURCE_EXHAUSTED (nothing taken).
    Result<std::vector<BlockId>> allocate(int64_t n);
    // REQUIRES: ref(id) > 0 for release; any valid id for ref.
    void ref(BlockId id);
    void release(BlockId id);
    void release_all(std::span<const BlockId> ids);
    int32_t ref_count(BlockId id) const { return ref_[static_cast<size_t>(id)]; }

    // Longest prefix of `keys` in the index; refs each hit block and returns them.
    std::vector<BlockId> match_and_pin(std::span<const BlockKey> keys);
    PrefixPeek peek(std::span<const BlockKey> keys) const;
    // Puts a fully computed block under `key`. Returns false (and changes nothing) if
    // the block already has a key or the key is taken. REQUIRES: ref(id) > 0.
    bool publish(BlockId id, const BlockKey& key);

    // The block's slice of group g: block_floats() floats. Lives as long as the pool.
    float* data(size_t group, BlockId id);

    // Verifies the state machine above, the LRU and free lists, and the index. With
    // `expected_refs` (one count per block, what the owners believe they hold), also
    // that every refcount matches. INTERNAL with a description on the first breach.
    Status check_invariants(std::span<const int32_t> expected_refs = {}) const;
    BlockPoolStats stats() const;

private:
    BlockPool(std::vector<CacheGroupSpec> groups, int64_t num_blocks);
    void lru_push_back(BlockId id);
    void lru_remove(BlockId id);

    std::vector<CacheGroupSpec> groups_;
    std::vector<std::unique_ptr<float[]>> data_;  // per group, num_blocks * block_floats
    std::vector<int32_t> ref_;
    std::vector<uint8_t> keyed_;
    std::vector<BlockKey> key_;
    // Intrusive LRU list of cached blocks; index num_blocks is the sentinel.
    std::vector<int32_t> lru_prev_, lru_next_;
    std::vector<uint8_t> in_lru_;
    std::vector<BlockId> free_;
    std::unordered_map<BlockKey, BlockId, BlockKeyHash> index_;
    int64_t num_free_ = 0;
    int64_t num_cached_ = 0;
    BlockPoolStats counters_;
};

}  // namespace dsi::kv
