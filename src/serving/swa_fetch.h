// Remote SWA-state pulls (issue 18, SPEC S-KV-8): an SWA state stays in the memory of
// the engine that produced it; another engine that is about to prefill a prompt whose
// state that engine holds (the router's SWA-state directory says so,
// router/swa_directory_service.h) pulls it over transfer/ into its own pool first, so
// its admission finds an exact hit instead of the S-KV-10 replay.
//
// On the wire (one request, one answer, one connection; every frame digest-checked by
// transfer/'s frame codec):
//   puller -> holder   State frame "swa_fetch": u32 version (1), u32 0, u64 chain key
//                      lo, u64 hi, u64 position
//   holder -> puller   State frame "swa_state": the hand-over's swa_state section
//                      (u32 version, u32 traffic class, u64 lo, u64 hi, u64 position,
//                      then the stored state), or a Failure frame (NOT_FOUND: not held)
// The puller checks the key, position, size (the model's state bytes) and the state's
// seal before anything goes into its pool.
//
// Thread model: fetch_swa_state blocks the caller's thread (bounded by `timeout` per
// read or write). SwaFetchServer runs one accept thread and `max_connections` workers
// that answer connections concurrently (each answer is one request read, one pool
// lookup and one write, each bounded by io_timeout), so a slow or silent puller holds
// one worker, not every puller. Accepted connections wait for a free worker; with
// max_connections + max_waiting in flight (answered or waiting) a new one is refused
// at once with a Failure frame (RESOURCE_EXHAUSTED) and counted. The destructor stops
// accepting, closes the waiting connections unanswered, and joins every thread: a
// worker leaves a request read within 100 ms, a write within io_timeout.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "kv/swa_pool.h"
#include "serving/swa_fetch_wire.h"
#include "transfer/transport.h"

namespace dsi::serving {

// Where to pull one state from: the holder's fetch address ("host:port") and the key.
struct SwaPullTarget {
    std::string address;
    kv::SwaStateKey key;
};

struct SwaFetchOptions {
    uint64_t incarnation = 0;          // this process's (frame headers)
    uint64_t state_bytes = 0;          // the model's stored state, seal included (> 8)
    transfer::Timeout timeout{1'000};  // connect, and each read or write
};

// The state, checked. NOT_FOUND when the holder does not hold it; DATA_LOSS for a frame
// that fails its digest or a state that fails its seal; INVALID_ARGUMENT for an answer
// of another key, position or size; UNAVAILABLE / DEADLINE_EXCEEDED from the transport.
Result<kv::SwaState> fetch_swa_state(transfer::Transport& transport, const SwaPullTarget& target,
                                     const SwaFetchOptions& options);

struct SwaFetchServerOptions {
    std::string host = "0.0.0.0";
    uint16_t port = 0;  // 0: the system picks one (port())
    uint64_t incarnation = 0;
    kv::SwaStatePool* pool = nullptr;  // REQUIRES: non-null, outlives the server
    transfer::Timeout io_timeout{2'000};
    int max_connections = 4;  // answered at once (worker threads; >= 1)
    int max_waiting = 16;     // accepted beyond the workers, waiting; more are refused
};

// Every accepted connection ends in exactly one of the four counts.
struct SwaFetchServerStats {
    int64_t num_served = 0;     // states sent
    int64_t num_not_found = 0;  // asked for a state the pool does not hold
    int64_t num_failed = 0;     // malformed or damaged requests, broken connections, and
                                // connections still waiting at shutdown
    int64_t num_refused = 0;    // turned away at the bound (RESOURCE_EXHAUSTED)
    int64_t num_active = 0;     // now: connections a worker is answering
    int64_t num_waiting = 0;    // now: accepted, waiting for a worker
};

class SwaFetchServer {
public:
    // `transport` null: TCP. INVALID_ARGUMENT for max_connections < 1 or max_waiting < 0.
    static Result<std::unique_ptr<SwaFetchServer>> start(
        SwaFetchServerOptions options, std::unique_ptr<transfer::Transport> transport = nullptr);
    ~SwaFetchServer();
    SwaFetchServer(const SwaFetchServer&) = delete;
    SwaFetchServer& operator=(const SwaFetchServer&) = delete;

    uint16_t port() const { return port_; }
    SwaFetchServerStats stats() const DSI_EXCLUDES(mu_);

private:
    SwaFetchServer() = default;
    void accept_loop() DSI_EXCLUDES(mu_);
    void worker_loop() DSI_EXCLUDES(mu_);
    // Answers a connection over the bound with a Failure frame, then closes it.
    void refuse(transfer::Connection& conn);
    Status serve_one(transfer::Connection& conn);
    void count(const Status& s) DSI_REQUIRES(mu_);

    SwaFetchServerOptions options_;
    std::unique_ptr<transfer::Transport> transport_;
    std::unique_ptr<transfer::Listener> listener_;
    uint16_t port_ = 0;
    std::atomic<bool> stopping_{false};
    mutable Mutex mu_;
    CondVar work_cv_;  // a connection queued, or stopping
    std::deque<std::unique_ptr<transfer::Connection>> waiting_ DSI_GUARDED_BY(mu_);
    SwaFetchServerStats stats_ DSI_GUARDED_BY(mu_);
    std::thread accept_thread_;
    std::vector<std::thread> workers_;
};

}  // namespace dsi::serving
