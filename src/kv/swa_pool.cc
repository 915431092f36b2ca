#include "kv/swa_pool.h"

#include <string>
#include <utility>

#include "base/check.h"

namespace dsi::kv {
namespace {

size_t cls_index(kvstore::TrafficClass c) { return static_cast<size_t>(c); }

int64_t entry_bytes(const SwaState& s) { return static_cast<int64_t>(s.bytes.size()); }

}  // namespace

SwaStateKey swa_state_key(std::span<const BlockKey> chain_keys, int64_t position,
                          const SwaGeometry& g) {
    const int64_t i = swa_chain_index(position, g);
    DSI_CHECK(i < static_cast<int64_t>(chain_keys.size()), "SWA state at ", position, " needs ",
              i + 1, " chain keys, have ", chain_keys.size());
    return {chain_keys[static_cast<size_t>(i)], position};
}

SwaStatePool::SwaStatePool(int64_t capacity_bytes) {
    DSI_CHECK(capacity_bytes >= 0);
    stats_.capacity_bytes = capacity_bytes;
}

void SwaStatePool::remove_locked(Lru::iterator it, bool eviction) {
    const SwaState& s = **it;
    const int64_t b = entry_bytes(s);
    stats_.bytes -= b;
    stats_.bytes_by_class[cls_index(s.traffic_class)] -= b;
    stats_.num_entries -= 1;
    if (eviction) {
        stats_.evictions += 1;
        stats_.evicted_bytes += b;
        stats_.evictions_by_class[cls_index(s.traffic_class)] += 1;
    }
    log_locked(s.key, /*added=*/false);
    index_.erase(s.key);
    lru_.erase(it);
}

void SwaStatePool::log_locked(const SwaStateKey& key, bool added) {
    log_.push_back(Change{key, added});
    ++next_seq_;
    if (log_.size() > kChangeLogLength) log_.pop_front();
}

SwaPoolChanges SwaStatePool::changes_since(uint64_t since) const {
    MutexLock l(&mu_);
    SwaPoolChanges out;
    out.next = next_seq_;
    const uint64_t first = next_seq_ - log_.size();  // the oldest change kept
    if (since == 0 || since < first || since > next_seq_) {
        out.snapshot = true;
        for (const auto& s : lru_) {
            out.added.push_back(s->key);
        }
        return out;
    }
    // The last change of each key wins (an add then an eviction is a removal).
    std::unordered_map<SwaStateKey, bool, SwaStateKeyHash> last;
    std::vector<SwaStateKey> order;
    for (uint64_t seq = since; seq < next_seq_; ++seq) {
        const Change& c = log_[static_cast<size_t>(seq - first)];
        if (last.emplace(c.key, c.added).second) {
            order.push_back(c.key);
        } else {
            last[c.key] = c.added;
        }
    }
    for (const SwaStateKey& k : order) {
        (last[k] ? out.added : out.removed).push_back(k);
    }
    return out;
}

Status SwaStatePool::put(const SwaStateKey& key, kvstore::TrafficClass traffic_class,
                         std::vector<uint8_t> bytes) {
    if (key.position <= 0 || key.position % kBlockTokens != 0) {
        return invalid_argument("SWA pool: state position " + std::to_string(key.position) +
                                " is not a positive multiple of " + std::to_string(kBlockTokens));
    }
    if (bytes.empty()) return invalid_argument("SWA pool: empty state");
    const int64_t b = static_cast<int64_t>(bytes.size());
    auto state = std::make_shared<SwaState>();
    state->key = key;
    state->traffic_class = traffic_class;
    state->bytes = std::move(bytes);
    MutexLock l(&mu_);
    if (b > stats_.capacity_bytes) {
        stats_.refused += 1;
        return resource_exhausted("SWA pool: a state of " + std::to_string(b) +
                                  " B exceeds the pool budget of " +
                                  std::to_string(stats_.capacity_bytes) + " B");
    }
    stats_.puts += 1;
    if (auto it = index_.find(key); it != index_.end()) {
        stats_.replaced += 1;
        remove_locked(it->second, /*eviction=*/false);
    }
    // S-KV-8: LRU eviction within the pool's own budget.
    while (stats_.bytes + b > stats_.capacity_bytes) {
        DSI_CHECK(!lru_.empty());
        remove_locked(std::prev(lru_.end()), /*eviction=*/true);
    }
    lru_.push_front(std::move(state));
    index_.emplace(key, lru_.begin());
    log_locked(key, /*added=*/true);
    stats_.bytes += b;
    stats_.bytes_by_class[cls_index(traffic_class)] += b;
    stats_.num_entries += 1;
    return Status::ok();
}

Result<std::shared_ptr<const SwaState>> SwaStatePool::get(const SwaStateKey& key) {
    MutexLock l(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) {
        stats_.misses += 1;
        return not_found("SWA pool: no state at position " + std::to_string(key.position));
    }
    stats_.hits += 1;
    lru_.splice(lru_.begin(), lru_, it->second);
    return *it->second;
}

bool SwaStatePool::contains(const SwaStateKey& key) const {
    MutexLock l(&mu_);
    return index_.contains(key);
}

bool SwaStatePool::erase(const SwaStateKey& key) {
    MutexLock l(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    remove_locked(it->second, /*eviction=*/false);
    return true;
}

SwaPoolStats SwaStatePool::stats() const {
    MutexLock l(&mu_);
    return stats_;
}

Status SwaStatePool::check_invariants() const {
    MutexLock l(&mu_);
    if (index_.size() != lru_.size() || static_cast<int64_t>(lru_.size()) != stats_.num_entries) {
        return internal_error("SwaStatePool: index, LRU list and entry count differ");
    }
    int64_t bytes = 0;
    std::array<int64_t, kvstore::kNumTrafficClasses> by_class{};
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
        auto found = index_.find((*it)->key);
        if (found == index_.end() || found->second != it) {
            return internal_error("SwaStatePool: LRU entry not indexed");
        }
        bytes += entry_bytes(**it);
        by_class[cls_index((*it)->traffic_class)] += entry_bytes(**it);
    }
    if (bytes != stats_.bytes || by_class != stats_.bytes_by_class) {
        return internal_error("SwaStatePool: byte counts differ from the entries");
    }
    if (bytes > stats_.capacity_bytes) return internal_error("SwaStatePool: over budget");
    return Status::ok();
}

Result<std::shared_ptr<const SwaState>> LocalSwaStateSource::pull(const SwaStateKey& key,
                                                                  int64_t /*deadline_ns*/) {
    return pool_->get(key);
}

void SwaCacheCounters::record(const SwaHitPlan& plan, kvstore::TrafficClass traffic_class) {
    SwaCacheClassCounters& c = by_class[cls_index(traffic_class)];
    c.requests += 1;
    c.block_hits += plan.block_hit_tokens > 0 ? 1 : 0;
    c.block_hit_tokens += plan.block_hit_tokens;
    c.hit_tokens += plan.hit_tokens;
    c.swa_hits += plan.swa_hit() ? 1 : 0;
    c.swa_exact_hits += plan.kind == SwaHitKind::kExact ? 1 : 0;
    if (plan.kind == SwaHitKind::kCatchUp) c.catch_up_tokens += plan.rerun_tokens();
    if (plan.kind == SwaHitKind::kReplay) {
        c.replays += 1;
        c.replay_tokens += plan.rerun_tokens();
    }
}

void SwaCacheCounters::set_pool(const SwaPoolStats& pool) {
    for (size_t i = 0; i < by_class.size(); ++i) {
        by_class[i].pool_bytes = pool.bytes_by_class[i];
        by_class[i].pool_evictions = pool.evictions_by_class[i];
    }
}

SwaCacheClassCounters SwaCacheCounters::total() const {
    SwaCacheClassCounters t;
    for (const SwaCacheClassCounters& c : by_class) {
        t.requests += c.requests;
        t.block_hits += c.block_hits;
        t.block_hit_tokens += c.block_hit_tokens;
        t.hit_tokens += c.hit_tokens;
        t.swa_hits += c.swa_hits;
        t.swa_exact_hits += c.swa_exact_hits;
        t.catch_up_tokens += c.catch_up_tokens;
        t.replays += c.replays;
        t.replay_tokens += c.replay_tokens;
        t.pool_bytes += c.pool_bytes;
        t.pool_evictions += c.pool_evictions;
    }
    return t;
}

}  // namespace dsi::kv
