// BlockIdCache: the simulator's model of a KV block store's contents: prefix blocks by id
// (SPEC S-KV-1, S-KV-3, S-KV-4).
//
// Policy: a capacity in blocks (0 = unlimited) with LRU eviction (the GC worker keeping
// disk under a watermark), and a TTL (0 = none) counted from a block's last use; an
// expired block is a miss and is dropped. match() is the Entrypoint's metadata-only
// hash-chain prefix match: the number of leading blocks present. Matched and inserted
// blocks become most recently used. Thread model: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace dsi::sim {

class BlockIdCache {
public:
    BlockIdCache(int64_t capacity_blocks, int64_t ttl_ns);

    // Leading blocks of `chain` present and unexpired at now_ns; they are touched.
    int64_t match(std::span<const uint64_t> chain, int64_t now_ns);
    // Like match() but changes nothing (for routers that score several stores).
    int64_t peek(std::span<const uint64_t> chain, int64_t now_ns) const;
    // Inserts (or touches) every block of `chain`, evicting LRU blocks over capacity.
    void insert(std::span<const uint64_t> chain, int64_t now_ns);

    int64_t size() const { return static_cast<int64_t>(index_.size()); }
    int64_t evictions() const { return evictions_; }
    int64_t expirations() const { return expirations_; }

private:
    struct Node {
        uint64_t key = 0;
        int64_t last_ns = 0;
        uint32_t prev = kNil;
        uint32_t next = kNil;
    };
    static constexpr uint32_t kNil = 0xffffffffu;

    void unlink(uint32_t n);
    void push_front(uint32_t n);
    void erase(uint32_t n);

    int64_t capacity_blocks_;
    int64_t ttl_ns_;
    std::unordered_map<uint64_t, uint32_t> index_;
    std::vector<Node> nodes_;
    std::vector<uint32_t> free_;
    uint32_t head_ = kNil;  // most recent
    uint32_t tail_ = kNil;  // least recent
    int64_t evictions_ = 0;
    int64_t expirations_ = 0;
};

}  // namespace dsi::sim
