// RemoteService: the router's GenerationService (issue 18). The router's HTTP server
// parses, encodes and renders exactly as `serve` does; instead of an engine in this
// process, each generation goes to an engine process over the engine RPC
// (server/engine_rpc.h), chosen among the engines membership lists.
//
// Routing: cluster::DecodeLb, unchanged (request count and KV length per engine, as
// the router counts them: its own generations in flight and their prompt + output
// tokens); an engine's `capacity` is its request cap (0: 128).
//
// Failover (S-DEPLOY): when an engine's stream breaks before the finishing update
// (connection refused or reset, the engine killed, a malformed line, a 5xx/429
// answer, the engine aborting a generation nobody aborted -- a drain's grace ran out
// --, or membership reports the engine restarted, or gone while its streams are
// quiet) the generation is sent again, with the same seed, to another engine as a
// continuation: the output tokens the client has travel with it
// (GenerateRequest::resume_output) and are prefilled as output there, so the new
// engine's first token is the next one. Batch-invariant kernels and the counter-based
// sampler make it the token the first engine would have sampled, so the client's
// stream continues without a seam; structured output is replayed (the grammar is
// advanced over the resumed tokens). With n > 1 the generation runs again and the
// tokens the client has are dropped instead. An engine whose stream broke is avoided
// for `broken_engine_backoff_ms`; each generation tries at most `max_attempts`
// engines. A 4xx answer (a request the engine refuses) is passed to the client as it
// is, without failover.
//
// Prefill load balancing (S-LB, cluster::PrefillLb unchanged): with prefill and decode
// engines, a new generation that needs a prefill waits in the router, in one of
// PrefillLb's buckets by prompt length (< 16K, 16-64K, 64-256K, >= 256K tokens), and
// prefill engines pull from their bucket, FIFO, while the prefill cost they hold stays
// under the bucket's quota cap; an empty engine always takes the head, and an idle one
// takes from the busiest bucket. Engines are re-apportioned over buckets by demand
// every round (1 s). The cost is the engines' prefill cost model of the prompt's miss
// (after the S-KV-4 prefix check); no prefix affinity. Held cost is released when the
// engine's stream for that generation ends (after its first token). A pump runs on
// every submit, attempt end, abort and membership change, and every 100 ms (rounds,
// engines back from back-off, deadlines of waiting generations). Failover attempts of
// a prefill go straight to a prefill engine by DecodeLb (they must avoid the engine
// that broke, which a pull cannot).
//
// Disaggregated prefill / decode (engines of role prefill and decode): a generation
// starts on a prefill engine (pulled, as above) and continues on a
// decode engine as a continuation (resume_output = the first token). The decode
// engine is chosen when the prefill starts: when it advertises a transfer address
// (its KvInbox), the generation carries Generation::handoff, the prefill engine sends
// the prompt's full blocks there while the client reads the first token
// (server/handoff_service.h), and its final update (Update::handoff) starts the
// continuation on that decode engine, which finds the blocks in its store tier and
// computes only the partial last block. A failed hand-over costs only the KV: the
// continuation goes on and the decode engine computes the rest. Without a transfer
// address the prefill stream is closed after the first token (the prefill engine
// aborts the generation) and the decode engine takes what the shared KV store holds
// (--kv-store on both). Without decode engines a prefill engine runs the whole
// generation; without prefill engines decode / both engines do.
//
// Thread model: every method is thread-safe. Each engine has its own HTTP client
// (one I/O thread); sinks are called from those threads (or the caller's, for
// refusals and aborts), one update at a time per generation.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "cluster/decode_lb.h"
#include "cluster/prefill_lb.h"
#include "membership/member.h"
#include "net/http_client.h"
#include "router/swa_directory_service.h"
#include "server/generation_service.h"

namespace dsi::router {

struct RemoteServiceOptions {
    std::string engine_api_key;  // sent to engines as a Bearer token ("" = none)
    // S-KV-4: the request's prefix-cache hit in the shared KV store, in tokens, known
    // before routing (metadata only: the hash chain matched against the store). Null:
    // unknown. Called on the caller's thread of start(), before any lock.
    std::function<int64_t(const engine::GenerateRequest&)> prefix_hit;
    // V4 / V4.1 (S-KV-8..10): the prompt's full-block chain keys as the engines key them.
    // Non-null turns on the router's part of the SWA-state directory
    // (swa_directory_service.h, options in swa_directory): with a known prefix hit, the
    // hit becomes S-KV-10's (L1 when some engine holds a state in [L1 - 128, L1], else
    // L1 - 128), and a generation sent to an engine that does not hold that state
    // carries where to pull it (Generation::swa_pull).
    std::function<std::vector<kv::BlockKey>(const engine::GenerateRequest&)> swa_chain_keys;
    SwaDirectoryServiceOptions swa_directory;
    // Disaggregated: a request whose miss (prompt - hit) is at most this many tokens
    // skips the prefill engines and goes straight to a decode engine (its prefill is
    // no bigger than a decode step's speculation; S-LB prices prefill by what it misses).
    int64_t direct_decode_max_miss_tokens = 128;
    int max_attempts = 3;  // engines tried per generation
    int64_t broken_engine_backoff_ms = 5000;
    cluster::DecodeLbSettings lb;
    // S-LB prefill: the buckets, quota caps and round.
    cluster::PrefillLbSettings prefill_lb;
    // The prefill cost, in ns of the engines' cost model, of computing `miss_tokens`
    // after a cached prefix of `hit_tokens`. Null: 150 us per missed token.
    std::function<double(int64_t miss_tokens, int64_t hit_tokens)> prefill_cost_ns;
    int64_t pump_interval_ms = 100;
    // A generation that finds no engine to go to (none listed, or all tried) waits this
    // long for one to join before it fails (bounded by its deadline): membership has
    // short gaps -- every lease expires at once when etcd comes back after a stop, and
    // the engines publish again within a second; a router starts before its engines.
    int64_t no_engine_wait_ms = 5000;
};

struct RouterStats {
    int64_t num_routed = 0;       // generations started on an engine (first attempts)
    int64_t num_failovers = 0;    // re-sent to another engine after a broken stream
    int64_t num_handovers = 0;    // prefill engine -> decode engine after the first token
    int64_t num_kv_handoffs = 0;  // of which with the prompt's KV stored on the decode engine
    int64_t num_kv_handoffs_failed = 0;  // a KV hand-over was tried and failed (recomputed)
    int64_t kv_handoff_blocks = 0;
    int64_t kv_handoff_bytes = 0;
    int64_t num_prefix_checks = 0;   // requests matched against the store before routing
    int64_t num_swa_pull_hints = 0;  // generations told to pull an SWA state (swa_pull)
    int64_t prefix_hit_tokens = 0;   // their hits, summed
    int64_t num_direct_decode = 0;   // disaggregated requests that skipped prefill (hit)
    int64_t num_prefill_queued = 0;  // generations that waited in the router for a prefill pull
    int64_t prefill_waiting = 0;     // waiting now
    int64_t num_prefill_reassignments = 0;  // PrefillLb rounds that moved engines
    int64_t num_engine_waits = 0;           // times a generation waited for an engine to join
    int64_t engine_waiting = 0;             // waiting now
    int64_t num_failed = 0;                 // ended with an error after every attempt
    int64_t num_engines = 0;                // engines it may route to now
    std::map<std::string, int64_t> requests_on_engine;  // the router's count, by engine id
    int64_t num_in_flight = 0;
};

class RemoteService final : public server::GenerationService {
public:
    explicit RemoteService(RemoteServiceOptions options = {});
    ~RemoteService() override;  // aborts what is in flight
    RemoteService(const RemoteService&) = delete;
    RemoteService& operator=(const RemoteService&) = delete;

    // Membership: the whole engine set (a watch's snapshot), then each change. Routers
    // and prefill-only processes are not routed to.
    void set_engines(const std::vector<membership::Member>& members);
    void apply(const membership::MemberChange& change);

    void start(server::Ticket ticket, server::Generation generation, server::Sink sink) override;
    void abort(server::Ticket ticket) override;
    void abort_all() override;
    server::ServiceStats stats_snapshot() const override;
    RouterStats router_stats() const;
    // Null unless options.swa_chain_keys is set.
    SwaDirectoryService* swa_directory() const { return swa_.get(); }

    struct Call;  // one generation (remote_service.cc)

private:
    struct Engine {
        membership::Member member;
        std::shared_ptr<net::HttpClient> client;
        int num_requests = 0;
        int64_t kv_tokens = 0;
        int64_t avoid_until_ns = 0;  // after a broken stream
        int64_t last_bytes_ns = 0;   // the last stream bytes from it
        double prefill_held_ns = 0;  // prefill cost of its generations still on it
        int64_t prefill_held_calls = 0;  // how many generations that cost is of
    };
    // Calls that must be told they failed, after mu_ is released.
    using Failures = std::vector<std::pair<std::shared_ptr<Call>, Status>>;

    // Picks a prefill (or a decode / both) engine not in `tried` (DecodeLb), or "".
    std::string choose_engine_locked(const Call& call, bool prefill) DSI_REQUIRES(mu_);
    bool has_role_locked(bool prefill) const DSI_REQUIRES(mu_);
    // Sends `call` to its next engine; false when there is none (the caller ends it).
    bool dispatch_locked(const std::shared_ptr<Call>& call) DSI_REQUIRES(mu_);
    void on_body(const std::shared_ptr<Call>& call, uint64_t attempt, std::string_view bytes);
    void on_done(const std::shared_ptr<Call>& call, uint64_t attempt, Status status);
    // dispatch_locked, or, when it found no engine at all (attempts left), the call
    // waits for one (no_engine_wait_ms); false: the caller ends it.
    bool dispatch_or_wait_locked(const std::shared_ptr<Call>& call) DSI_REQUIRES(mu_);
    // Sends the calls waiting for an engine that one can take now; ends those whose
    // wait is over.
    void retry_waiting_locked(Failures& failed) DSI_REQUIRES(mu_);
    // For error messages: the call's attempts, the engines it tried, those there are.
    std::string dispatch_state_locked(const Call& call) const DSI_REQUIRES(mu_);
    // Ends the current attempt's engine accounting.
    void release_engine_locked(Call& call) DSI_REQUIRES(mu_);
    // Generation::swa_pull for `call` going to `engine`.
    void set_swa_pull_locked(Call& call, const std::string& engine) DSI_REQUIRES(mu_);
    // Stops routing to `id`. cut_streams: its streams are cut now (they fail over);
    // otherwise only when nothing came from it for kStalledStreamNs (a draining
    // engine finishes its generations; a dead or frozen one has gone quiet).
    void remove_engine_locked(const std::string& id, bool cut_streams) DSI_REQUIRES(mu_);
    void add_engine_locked(const membership::Member& m) DSI_REQUIRES(mu_);
    void apply_locked(const membership::MemberChange& change) DSI_REQUIRES(mu_);
    // S-LB prefill queue. enqueue: the call waits for a pull. pump: rebuilds the LB when
    // the prefill engines changed, runs its round, fails waiting calls past their
    // deadline, and lets every available prefill engine pull (each pulled call is sent).
    void enqueue_prefill_locked(const std::shared_ptr<Call>& call) DSI_REQUIRES(mu_);
    double prefill_cost_locked(const Call& call) const DSI_REQUIRES(mu_);
    void pump_prefill_locked(Failures& failed) DSI_REQUIRES(mu_);
    void sync_prefill_engines_locked(Failures& failed) DSI_REQUIRES(mu_);
    void deliver_failures(Failures& failed);
    void pump_loop();

    const RemoteServiceOptions options_;
    const cluster::DecodeLb lb_;
    // The SWA-state directory (options_.swa_chain_keys); null without. Own lock.
    std::unique_ptr<SwaDirectoryService> swa_;
    mutable Mutex mu_;
    // PrefillLb over the prefill engines, index i = prefill_ids_[i] (sorted ids); rebuilt
    // with the waiting work submitted again, in arrival order, when that set changes.
    std::optional<cluster::PrefillLb> prefill_lb_ DSI_GUARDED_BY(mu_);
    std::vector<std::string> prefill_ids_ DSI_GUARDED_BY(mu_);
    std::vector<bool> prefill_available_ DSI_GUARDED_BY(mu_);
    // Waiting work by id (ids grow with arrival, so the map is in arrival order).
    std::map<uint64_t, std::pair<cluster::PrefillWork, std::shared_ptr<Call>>> prefill_waiting_
        DSI_GUARDED_BY(mu_);
    uint64_t next_prefill_work_ DSI_GUARDED_BY(mu_) = 1;
    int64_t lb_reassignments_seen_ DSI_GUARDED_BY(mu_) = 0;
    bool stopping_ DSI_GUARDED_BY(mu_) = false;
    CondVar pump_cv_;
    std::thread pump_thread_;
    std::map<std::string, Engine> engines_ DSI_GUARDED_BY(mu_);
    // Calls waiting for an engine (dispatch_or_wait_locked), in arrival order.
    std::vector<std::shared_ptr<Call>> engine_waiting_ DSI_GUARDED_BY(mu_);
    // Clients of engines that left, kept until the service ends: their calls' callbacks
    // may still run.
    std::vector<std::shared_ptr<net::HttpClient>> retired_ DSI_GUARDED_BY(mu_);
    std::map<server::Ticket, std::shared_ptr<Call>> calls_ DSI_GUARDED_BY(mu_);
    RouterStats stats_ DSI_GUARDED_BY(mu_);
};

}  // namespace dsi::router
