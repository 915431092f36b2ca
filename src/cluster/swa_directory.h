// SwaDirectory: where stored SWA states are (SPEC S-KV-8, issue 18). SWA state never
// goes to the KV store: it stays in the SwaStatePool of the engine that produced it. The
// entrypoints keep this directory -- logically one, physically partitioned by key over
// the routers (swa_owner) -- so a router can tell the engine it picks where the state of
// a prompt's prefix is, and that engine pulls it instead of replaying (S-KV-10, S-SWA).
//
// An entry maps one state (chain key of the block that ends at `position`, position) to
// the engines holding it: engine id + incarnation (docs/cluster.md, the incarnation
// rule) and when it was last announced. Engines announce what their pool holds: changes
// (added / removed keys) or a snapshot that replaces the engine's whole set (the first
// announcement to a router, one after the engine's change log wrapped, or after a router
// restart: re-announcement rebuilds the directory).
//
// Policies:
//   - Incarnations: an announcement with a lower incarnation than the one known for the
//     engine is stale (ignored, counted); a higher one drops everything the older
//     incarnation held, then applies. set_engines() drops the entries of engines that
//     left membership or whose record has another incarnation.
//   - Bounds: at most max_entries (state, holder) pairs and max_holders_per_state
//     holders per state. Beyond them the least recently announced pair goes (counted).
//     An announcement is refused whole (INVALID_ARGUMENT, nothing applied) when it is
//     malformed: empty engine id, more than max_announcement_states keys, a position
//     that is not a positive multiple of the unit.
//   - An engine's entries age out after entry_ttl_ns without an announcement from it
//     (expire(); an empty change list counts): an engine that stopped announcing (its
//     poll fails) is not believed forever. 0: no ageing.
// No I/O; time comes in as now_ns. A directory entry is a hint: the engine pulling the
// state may find it gone (evicted since), which costs the replay S-KV-10 prices anyway.
// Thread model: not thread-safe; one owner (the router serialises calls).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace dsi::cluster {

// One stored state: the chain key (lo, hi) of the block ending at `position` (a
// positive multiple of the unit) and the position. Mirrors kv::SwaStateKey without
// depending on kv/.
struct SwaStateId {
    uint64_t chain_lo = 0;
    uint64_t chain_hi = 0;
    int64_t position = 0;
    bool operator==(const SwaStateId&) const = default;
};

struct SwaStateIdHash {
    size_t operator()(const SwaStateId& id) const;
};

struct SwaHolder {
    std::string engine;
    uint64_t incarnation = 0;
    int64_t seen_ns = 0;  // the last announcement that listed it
};

struct SwaAnnouncement {
    std::string engine;
    uint64_t incarnation = 0;
    // true: `added` is the engine's whole set (removed is ignored).
    bool snapshot = false;
    std::vector<SwaStateId> added;
    std::vector<SwaStateId> removed;
};

struct SwaDirectorySettings {
    int64_t unit_tokens = 128;
    int64_t max_entries = int64_t{1} << 20;  // (state, holder) pairs
    int max_holders_per_state = 4;
    int64_t max_announcement_states = 1 << 16;
    int64_t entry_ttl_ns = 0;  // 0: entries never age out
};

struct SwaDirectoryStats {
    int64_t num_states = 0;
    int64_t num_entries = 0;  // (state, holder) pairs
    int64_t announcements = 0;
    int64_t snapshots = 0;
    int64_t stale_announcements = 0;  // lower incarnation: ignored
    int64_t malformed_announcements = 0;
    int64_t added = 0;
    int64_t removed = 0;
    int64_t evicted = 0;  // by the bounds
    int64_t expired = 0;  // engine left, restarted, or aged out
};

class SwaDirectory {
public:
    // REQUIRES: unit_tokens >= 1, max_entries >= 1, max_holders_per_state >= 1.
    explicit SwaDirectory(SwaDirectorySettings settings = {});

    // Applies one engine's announcement (Policies). INVALID_ARGUMENT when malformed
    // (nothing applied); FAILED_PRECONDITION when stale (nothing applied).
    Status announce(const SwaAnnouncement& a, int64_t now_ns);
    // Membership: the live engines and their incarnations. Entries of others, and of
    // other incarnations, are dropped.
    void set_engines(const std::map<std::string, uint64_t>& live);
    // Drops the entries of engines not heard from for entry_ttl_ns (no-op when it is 0);
    // returns those engines (their next announcement should be a snapshot).
    std::vector<std::string> expire(int64_t now_ns);

    // The holders of `id`, most recently announced first (empty: none known).
    std::vector<SwaHolder> holders(const SwaStateId& id) const;
    bool contains(const SwaStateId& id) const { return index_.count(id) > 0; }

    SwaDirectoryStats stats() const;
    // INTERNAL on a broken invariant (index vs list vs per-engine counts).
    Status check_invariants() const;

private:
    struct Entry {
        SwaStateId id;
        std::string engine;
        uint64_t incarnation = 0;
        int64_t seen_ns = 0;
    };
    using List = std::list<Entry>;  // front: most recently announced
    Status validate(const SwaAnnouncement& a) const;
    void put(const SwaStateId& id, const std::string& engine, uint64_t incarnation, int64_t now_ns);
    void erase(List::iterator it);
    void erase_engine(const std::string& engine);

    SwaDirectorySettings settings_;
    List list_;
    // Per state, its holders' list entries (newest first).
    std::unordered_map<SwaStateId, std::vector<List::iterator>, SwaStateIdHash> index_;
    std::map<std::string, uint64_t> incarnation_;  // the newest known per engine
    std::map<std::string, int64_t> num_by_engine_;
    std::map<std::string, int64_t> last_announce_ns_;
    SwaDirectoryStats stats_;
};

// The router that owns `id` among `routers` (ids, sorted and unique): rendezvous
// hashing, so adding or removing a router moves only the keys it gains or held, and
// every router computes the same owner from the same set. Returns an index into
// `routers`; -1 when it is empty.
int swa_owner(const SwaStateId& id, std::span<const std::string> routers);

}  // namespace dsi::cluster
