// SwaDirectoryService: the router's part of the cluster's SWA-state directory (issue 18,
// SPEC S-KV-8..10; the policy is cluster::SwaDirectory).
//
// Announcements: every poll_interval_ms the router asks each engine what its SWA state
// pool changed since the last answer (GET /internal/v1/swa_states?since=N,
// server/swa_announce.h) and applies the answer to its directory under the engine's id
// and membership incarnation. Pull, not push: engines need not know the routers, a
// router that restarts starts from cursor 0 and gets every engine's snapshot (the
// re-announcement), a router set that changes resets every cursor (keys move between
// routers), and an engine that restarts (new incarnation) starts over too; an answer
// of another incarnation than the record is dropped. An engine that answers 404 keeps
// no states (a V2/V3 model) and is not asked again until it restarts.
//
// Partition: with several routers in membership, each keeps only the keys it owns
// (cluster::swa_owner over the sorted router ids; this router's id is self_id). A
// lookup of a key another router owns asks that router (GET /internal/v1/swa_lookup,
// answer_lookup there; at most lookup_timeout_ms, on the caller's thread); an owner that
// does not answer counts as no state: the request takes the S-KV-10 replay price and the
// engine its own pool's hit -- never an error.
//
// Lookup (plan): S-KV-10 at the router: L1 = min(block hit, the largest multiple of 128
// <= L - 134); a state on some engine at L1 -> hit L1 (kExact), else at L1 - 128 (or the
// empty state at 0) -> hit L1 (kCatchUp), else L1 - 128 (kReplay). The plan names the
// state's key and holders, so the router can tell the chosen engine where to pull it.
//
// Thread model: every method is thread-safe (one mutex). Polls run on the HTTP clients'
// I/O threads, started by one poll thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "cluster/swa_directory.h"
#include "kv/block_key.h"
#include "kv/swa_pool.h"
#include "kv/swa_rules.h"
#include "membership/member.h"
#include "net/http_client.h"

namespace dsi::router {

struct SwaDirectoryServiceOptions {
    std::string self_id;  // this router's membership id (or set_self_id); "" keeps every key
    std::string engine_api_key;
    int64_t poll_interval_ms = 200;
    int64_t poll_timeout_ms = 2000;
    std::string router_api_key;      // sent to other routers' lookups ("" = none)
    int64_t lookup_timeout_ms = 50;  // one lookup at another router
    cluster::SwaDirectorySettings directory{.entry_ttl_ns = int64_t{30} * 1000000000};
};

// The router's S-KV-10 plan for one request.
struct SwaRoutePlan {
    kv::SwaHitPlan plan;
    // The state the plan starts from when one is held by an engine (kExact: at L1,
    // kCatchUp: at L1 - 128 > 0); position 0: none to pull.
    kv::SwaStateKey key;
    std::vector<cluster::SwaHolder> holders;  // most recently announced first
};

struct SwaDirectoryServiceStats {
    cluster::SwaDirectoryStats directory;
    int64_t num_polls = 0;
    int64_t num_answers = 0;        // polls that ended (answered, failed or cancelled)
    int64_t num_poll_failures = 0;  // unreachable, non-200, malformed, stale
    int64_t num_lookups = 0;
    int64_t num_state_hits = 0;              // a state found in [L1 - 128, L1] (kExact, kCatchUp)
    int64_t num_replays = 0;                 // none found: hit L1 - 128
    int64_t block_hit_tokens = 0;            // sum of L1
    int64_t hit_tokens = 0;                  // sum of S-KV-10 hits
    int64_t num_routers = 0;                 // routers the keys are split over (>= 1)
    int64_t num_remote_lookups = 0;          // lookups sent to the owning router
    int64_t num_remote_lookup_failures = 0;  // unanswered (counted as no state)
};

class SwaDirectoryService {
public:
    explicit SwaDirectoryService(SwaDirectoryServiceOptions options);
    ~SwaDirectoryService();
    SwaDirectoryService(const SwaDirectoryService&) = delete;
    SwaDirectoryService& operator=(const SwaDirectoryService&) = delete;

    // Membership: the whole set, then each change (engines and routers).
    void set_members(const std::vector<membership::Member>& members);
    void apply(const membership::MemberChange& change);

    // This router's membership id (known once it listens); its part of the keys.
    void set_self_id(std::string id);

    // S-KV-10 with the directory (its own part, and the owners' for the rest). Blocks up
    // to lookup_timeout_ms per other router asked. REQUIRES: chain holds the prompt's
    // full-block keys, 0 <= block_hit_tokens <= input_tokens, a multiple of 128.
    SwaRoutePlan plan(std::span<const kv::BlockKey> chain, int64_t input_tokens,
                      int64_t block_hit_tokens);
    // The body of GET /internal/v1/swa_lookup at this router (its part only).
    std::string answer_lookup(std::string_view target) const;
    // The engines the directory says hold `key` (no counters change).
    std::vector<cluster::SwaHolder> holders(const kv::SwaStateKey& key) const;
    // Where the engine serves pulls of its states (its last announcement; "" if unknown).
    std::string fetch_address(const std::string& engine) const;

    SwaDirectoryServiceStats stats() const;
    // Polls every engine now (tests), without waiting for the answers.
    void poll_now();

private:
    struct Peer {
        membership::Member member;
        std::shared_ptr<net::HttpClient> client;
        uint64_t cursor = 0;
        bool in_flight = false;
        bool no_states = false;  // answered 404
        std::string fetch_address;
    };
    void add_locked(const membership::Member& m) DSI_REQUIRES(mu_);
    void remove_locked(const std::string& id) DSI_REQUIRES(mu_);
    void sync_locked() DSI_REQUIRES(mu_);  // after membership changed
    void poll_locked() DSI_REQUIRES(mu_);
    void on_answer(const std::string& id, uint64_t incarnation, int http, const std::string& body,
                   Status status);
    bool owned_locked(const cluster::SwaStateId& id) const DSI_REQUIRES(mu_);
    void loop();

    const SwaDirectoryServiceOptions options_;
    std::string self_id_ DSI_GUARDED_BY(mu_);
    mutable Mutex mu_;
    CondVar cv_;
    bool stopping_ DSI_GUARDED_BY(mu_) = false;
    cluster::SwaDirectory directory_ DSI_GUARDED_BY(mu_);
    std::map<std::string, Peer> peers_ DSI_GUARDED_BY(mu_);
    std::vector<std::string> routers_ DSI_GUARDED_BY(mu_);  // sorted ids
    std::map<std::string, std::shared_ptr<net::HttpClient>> router_clients_ DSI_GUARDED_BY(mu_);
    // Clients of engines that left, kept until the service ends (their callbacks may run).
    std::vector<std::shared_ptr<net::HttpClient>> retired_ DSI_GUARDED_BY(mu_);
    SwaDirectoryServiceStats stats_ DSI_GUARDED_BY(mu_);
    std::thread thread_;
};

cluster::SwaStateId to_state_id(const kv::SwaStateKey& key);

}  // namespace dsi::router
