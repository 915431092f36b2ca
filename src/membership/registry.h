// Registry: the cluster's membership directory (issue 18, ARCHITECTURE "membership/").
// Each engine and router joins with its Member record; routers list and watch.
//
// Backends (open_registry):
//   etcd://host:port[/prefix]  etcd v3 through its JSON gateway (Debian's etcd-server).
//       join() grants a lease of `lease_ttl_s` and puts `<prefix><id>` under it; a
//       background thread keeps the lease alive every `keepalive_interval_ms`. When etcd
//       is unreachable the record is kept trying; when the lease is gone (etcd was away
//       longer than the TTL, or restarted) the thread grants a new one and puts the
//       record again (same incarnation: the process did not restart). A process that
//       dies stops keeping its lease, and its record disappears TTL seconds later --
//       that is how a router learns of a dead engine. leave() revokes the lease.
//       watch() lists the prefix, then follows etcd's watch stream from the listed
//       revision; a broken stream (etcd down, compaction) is followed by a relist whose
//       differences are reported as changes, so no change is lost, only delayed.
//   file:///path/members.json  a static JSON array of member records, for one host
//       without etcd. join() adds or replaces the own record (atomic rewrite under an
//       flock), leave() removes it; watch() polls the file. No leases: a process that
//       dies stays listed until removed (the router's health checks handle it).
//
// Thread model: every method may be called from any thread. Watch callbacks run on the
// registry's own thread, one at a time, and must not block long or call back into the
// registry. The destructor stops the threads and leaves (revokes the lease).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "membership/member.h"

namespace dsi::membership {

struct RegistryOptions {
    int64_t lease_ttl_s = 10;           // etcd lease; >= 2 (etcd's minimum)
    int64_t keepalive_interval_ms = 0;  // 0: a third of the TTL
    int64_t request_timeout_ms = 2000;  // each unary etcd call
    int64_t retry_interval_ms = 500;    // after a failed call / broken watch
    int64_t file_poll_interval_ms = 500;
};

struct RegistryHealth {
    bool joined = false;
    bool lease_ok = false;  // the last keep-alive (or the join) succeeded
    int64_t num_keepalive_failures = 0;
    int64_t num_rejoins = 0;          // records put again under a new lease
    int64_t num_watch_restarts = 0;   // relists after a broken watch
    int64_t num_bad_records = 0;      // records in the directory that failed to parse
    std::string last_error;
};

class Registry {
public:
    using WatchFn = std::function<void(const MemberChange&)>;

    virtual ~Registry() = default;

    // Publishes `self` (validated) and keeps it published until leave(). A second
    // join() replaces the record (e.g. capacity changed). UNAVAILABLE when the
    // directory cannot be reached now (nothing is published then).
    [[nodiscard]] virtual Status join(const Member& self) = 0;
    // Withdraws the own record. OK when not joined.
    [[nodiscard]] virtual Status leave() = 0;
    // The current members, in id order. Records that fail to parse are skipped and
    // counted (RegistryHealth::num_bad_records), never returned.
    virtual Result<std::vector<Member>> list() = 0;
    // Reports the current members to `fn` as joins (before watch() returns), then every
    // change after them until the registry is destroyed, so a watcher can keep its view
    // from `fn` alone. Returns the current members. At most one watch per registry
    // (FAILED_PRECONDITION for a second).
    virtual Result<std::vector<Member>> watch(WatchFn fn) = 0;
    virtual RegistryHealth health() const = 0;
    // "etcd://127.0.0.1:2379/dsinfer/members/" or "file:///path" (for logs).
    virtual std::string describe() const = 0;
};

// INVALID_ARGUMENT for an unknown scheme or a malformed URI. `env` (default: the real
// one) gives the clock of the file backend's polls. Opening connects to nothing.
Result<std::unique_ptr<Registry>> open_registry(std::string_view uri,
                                                const RegistryOptions& options = {},
                                                Env* env = nullptr);

}  // namespace dsi::membership
