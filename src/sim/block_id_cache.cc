#include "sim/block_id_cache.h"

namespace dsi::sim {

BlockIdCache::BlockIdCache(int64_t capacity_blocks, int64_t ttl_ns)
    : capacity_blocks_(capacity_blocks), ttl_ns_(ttl_ns) {}

void BlockIdCache::unlink(uint32_t n) {
    Node& x = nodes_[n];
    if (x.prev != kNil) {
        nodes_[x.prev].next = x.next;
    } else {
        head_ = x.next;
    }
    if (x.next != kNil) {
        nodes_[x.next].prev = x.prev;
    } else {
        tail_ = x.prev;
    }
    x.prev = x.next = kNil;
}

void BlockIdCache::push_front(uint32_t n) {
    Node& x = nodes_[n];
    x.prev = kNil;
    x.next = head_;
    if (head_ != kNil) {
        nodes_[head_].prev = n;
    }
    head_ = n;
    if (tail_ == kNil) {
        tail_ = n;
    }
}

void BlockIdCache::erase(uint32_t n) {
    unlink(n);
    index_.erase(nodes_[n].key);
    free_.push_back(n);
}

int64_t BlockIdCache::match(std::span<const uint64_t> chain, int64_t now_ns) {
    int64_t hit = 0;
    for (uint64_t key : chain) {
        auto it = index_.find(key);
        if (it == index_.end()) {
            break;
        }
        const uint32_t n = it->second;
        // S-KV-3: retention is a TTL from last use; an expired block is gone.
        if (ttl_ns_ > 0 && now_ns - nodes_[n].last_ns > ttl_ns_) {
            erase(n);
            ++expirations_;
            break;
        }
        nodes_[n].last_ns = now_ns;
        unlink(n);
        push_front(n);
        ++hit;
    }
    return hit;
}

int64_t BlockIdCache::peek(std::span<const uint64_t> chain, int64_t now_ns) const {
    int64_t hit = 0;
    for (uint64_t key : chain) {
        auto it = index_.find(key);
        if (it == index_.end() || (ttl_ns_ > 0 && now_ns - nodes_[it->second].last_ns > ttl_ns_)) {
            break;
        }
        ++hit;
    }
    return hit;
}

void BlockIdCache::insert(std::span<const uint64_t> chain, int64_t now_ns) {
    for (uint64_t key : chain) {
        auto [it, fresh] = index_.try_emplace(key, kNil);
        if (!fresh) {
            const uint32_t n = it->second;
            nodes_[n].last_ns = now_ns;
            unlink(n);
            push_front(n);
            continue;
        }
        uint32_t n;
        if (!free_.empty()) {
            n = free_.back();
            free_.pop_back();
        } else {
            n = static_cast<uint32_t>(nodes_.size());
            nodes_.emplace_back();
        }
        nodes_[n].key = key;
        nodes_[n].last_ns = now_ns;
        it->second = n;
        push_front(n);
    }
    // S-KV-3: GC evicts LRU to stay under the watermark (capacity).
    while (capacity_blocks_ > 0 && static_cast<int64_t>(index_.size()) > capacity_blocks_) {
        erase(tail_);
        ++evictions_;
    }
}

}  // namespace dsi::sim
