// SwaStatePool: the host-memory pool of stored SWA states (SPEC S-KV-8), and the
// counters of the SWA cache (block hits, SWA hits, replays, pool bytes, evictions per
// traffic class).
//
// An entry is one sequence's stored region (kv/swa_rules.h: the ring of every stored
// layer) at one state position, keyed by (chain key at that position, position): the
// chain key of block swa_chain_index(position) names the prefix, the position guards
// against a key naming another length. SWA state is never written to the KV store: it
// lives in the memory of the process that produced it, and another machine reaches it
// through a SwaStateSource (the cluster's directory on the entrypoints locates it and
// pulls it over the network; LocalSwaStateSource serves this process's pool).
//
// Policies:
//   - The pool has its own byte budget (entry bytes only). put() replaces an entry
//     with the same key, then evicts least recently used entries (get() and put()
//     count as use; contains() does not) until the new entry fits; each eviction is
//     counted, per traffic class. An entry larger than the whole budget is refused
//     (RESOURCE_EXHAUSTED), nothing evicted.
//   - get() pins: it returns shared ownership of the entry (the reason for shared_ptr:
//     a fetch thread may still copy an entry that the scheduling thread's put() has
//     just evicted). Evicted bytes stop counting against the budget when evicted, and
//     are freed when the last holder lets go.
//   - Change log: every add (put) and removal (eviction, replacement, erase) gets a
//     sequence number; the last kChangeLogLength are kept, so a reader (the engine's
//     announcements to the cluster's SWA directory) asks for what changed since its
//     cursor, or gets a snapshot of every key when the log no longer reaches back.
// Thread model: thread-safe (one mutex); the engine's scheduling thread (lookups for
// the hit rule, puts at request end) and a fetch thread (gets for remote pulls) may
// call it at once. Returned entries are immutable.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "kv/block_key.h"
#include "kv/swa_rules.h"
#include "kvstore/store_key.h"

namespace dsi::kv {

struct SwaStateKey {
    BlockKey chain;        // the chain key of the block that ends at `position`
    int64_t position = 0;  // a positive multiple of the unit
    bool operator==(const SwaStateKey&) const = default;
};

struct SwaStateKeyHash {
    size_t operator()(const SwaStateKey& k) const {
        return BlockKeyHash{}(k.chain) ^ static_cast<size_t>(k.position * 0x9e3779b97f4a7c15ULL);
    }
};

// The key of the state at `position` of a sequence whose chain keys are `chain_keys`.
// REQUIRES: position a positive multiple of the unit within the keys.
SwaStateKey swa_state_key(std::span<const BlockKey> chain_keys, int64_t position,
                          const SwaGeometry& g = {});

struct SwaState {
    SwaStateKey key;
    kvstore::TrafficClass traffic_class = kvstore::TrafficClass::kChatbot;
    std::vector<uint8_t> bytes;  // the stored region
};

struct SwaPoolStats {
    int64_t capacity_bytes = 0;
    int64_t bytes = 0;
    int64_t num_entries = 0;
    int64_t puts = 0;
    int64_t replaced = 0;  // puts over an existing key
    int64_t refused = 0;   // puts larger than the budget
    int64_t hits = 0;      // get() found
    int64_t misses = 0;    // get() not found
    int64_t evictions = 0;
    int64_t evicted_bytes = 0;
    std::array<int64_t, kvstore::kNumTrafficClasses> bytes_by_class{};
    std::array<int64_t, kvstore::kNumTrafficClasses> evictions_by_class{};
};

// What changed in a pool since a cursor (SwaStatePool::changes_since).
struct SwaPoolChanges {
    uint64_t next = 0;      // the cursor for the next call
    bool snapshot = false;  // `added` is every key the pool holds; `removed` is empty
    // Net changes, each key at most once: held now (added since) or not (removed since).
    std::vector<SwaStateKey> added;
    std::vector<SwaStateKey> removed;
};

class SwaStatePool {
public:
    static constexpr size_t kChangeLogLength = 4096;

    // REQUIRES: capacity_bytes >= 0 (0: every put is refused).
    explicit SwaStatePool(int64_t capacity_bytes);

    // Stores `bytes` under `key` (see Policies). INVALID_ARGUMENT for empty bytes or a
    // position that is not a positive multiple of the unit; RESOURCE_EXHAUSTED when
    // larger than the budget.
    Status put(const SwaStateKey& key, kvstore::TrafficClass traffic_class,
               std::vector<uint8_t> bytes) DSI_EXCLUDES(mu_);
    // The entry, pinned, now most recently used; NOT_FOUND otherwise.
    Result<std::shared_ptr<const SwaState>> get(const SwaStateKey& key) DSI_EXCLUDES(mu_);
    // Whether the entry is there; changes no order or counter (the hit rule's lookup).
    bool contains(const SwaStateKey& key) const DSI_EXCLUDES(mu_);
    // Removes the entry (not counted as an eviction); false if absent.
    bool erase(const SwaStateKey& key) DSI_EXCLUDES(mu_);

    // The changes after cursor `since` (from a previous call's `next`); since = 0, or a
    // cursor the log no longer reaches back to, gives a snapshot.
    SwaPoolChanges changes_since(uint64_t since) const DSI_EXCLUDES(mu_);

    SwaPoolStats stats() const DSI_EXCLUDES(mu_);
    // INTERNAL on a broken invariant (index vs LRU list vs byte counts).
    Status check_invariants() const DSI_EXCLUDES(mu_);

private:
    using Lru = std::list<std::shared_ptr<const SwaState>>;  // front: most recent
    void remove_locked(Lru::iterator it, bool eviction) DSI_REQUIRES(mu_);
    void log_locked(const SwaStateKey& key, bool added) DSI_REQUIRES(mu_);

    struct Change {
        SwaStateKey key;
        bool added = false;
    };

    mutable Mutex mu_;
    Lru lru_ DSI_GUARDED_BY(mu_);
    std::unordered_map<SwaStateKey, Lru::iterator, SwaStateKeyHash> index_ DSI_GUARDED_BY(mu_);
    SwaPoolStats stats_ DSI_GUARDED_BY(mu_);
    std::deque<Change> log_ DSI_GUARDED_BY(mu_);  // changes next_seq_ - size .. next_seq_ - 1
    uint64_t next_seq_ DSI_GUARDED_BY(mu_) = 1;
};

// Where a hit's SWA state is pulled from: this process's pool, or (the cluster issue)
// another machine's, located through the entrypoints' directory.
// Thread model: implementations are thread-safe; pull() may block until deadline_ns
// (on the Env clock the caller uses), so the engine calls it from a fetch thread.
class SwaStateSource {
public:
    virtual ~SwaStateSource() = default;
    // The state, or NOT_FOUND (gone: the hit falls back by S-KV-10),
    // DEADLINE_EXCEEDED, UNAVAILABLE (the holder is unreachable).
    virtual Result<std::shared_ptr<const SwaState>> pull(const SwaStateKey& key,
                                                         int64_t deadline_ns) = 0;
};

// Serves this process's pool (never blocks; the deadline is not needed).
class LocalSwaStateSource final : public SwaStateSource {
public:
    // REQUIRES: pool outlives this source.
    explicit LocalSwaStateSource(SwaStatePool* pool) : pool_(pool) {}
    Result<std::shared_ptr<const SwaState>> pull(const SwaStateKey& key,
                                                 int64_t deadline_ns) override;

private:
    SwaStatePool* pool_;
};

// The SWA cache's counters (deliverable 7, the countable part), per traffic class, for
// the metrics layer to export. A plain value: the owner serialises updates.
struct SwaCacheClassCounters {
    int64_t requests = 0;          // hit plans recorded
    int64_t block_hits = 0;        // requests with block KV reused (L1 > 0)
    int64_t block_hit_tokens = 0;  // sum of L1
    int64_t hit_tokens = 0;        // sum of S-KV-10 hit lengths
    int64_t swa_hits = 0;          // kExact + kCatchUp
    int64_t swa_exact_hits = 0;    // kExact
    int64_t catch_up_tokens = 0;   // tokens re-run exactly from an older state
    int64_t replays = 0;           // kReplay
    int64_t replay_tokens = 0;     // tokens re-run with truncated attention
    int64_t pool_bytes = 0;        // from the pool (set_pool)
    int64_t pool_evictions = 0;    // from the pool (set_pool)
};

struct SwaCacheCounters {
    std::array<SwaCacheClassCounters, kvstore::kNumTrafficClasses> by_class{};

    void record(const SwaHitPlan& plan, kvstore::TrafficClass traffic_class);
    // Copies the pool's bytes and evictions per class.
    void set_pool(const SwaPoolStats& pool);
    SwaCacheClassCounters total() const;
};

}  // namespace dsi::kv
