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
// read or write). SwaFetchServer runs one thread that accepts and answers connections
// one at a time (each answer is one pool lookup and one write, bounded by io_timeout);
// its destructor stops and joins it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "base/mutex.h"
#include "base/status.h"
#include "kv/swa_pool.h"
#include "transfer/transport.h"

namespace dsi::serving {

inline constexpr std::string_view kSwaFetchSection = "swa_fetch";

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
};

struct SwaFetchServerStats {
    int64_t num_served = 0;     // states sent
    int64_t num_not_found = 0;  // asked for a state the pool does not hold
    int64_t num_failed = 0;     // malformed or damaged requests, broken connections
};

class SwaFetchServer {
public:
    // `transport` null: TCP.
    static Result<std::unique_ptr<SwaFetchServer>> start(
        SwaFetchServerOptions options, std::unique_ptr<transfer::Transport> transport = nullptr);
    ~SwaFetchServer();
    SwaFetchServer(const SwaFetchServer&) = delete;
    SwaFetchServer& operator=(const SwaFetchServer&) = delete;

    uint16_t port() const { return port_; }
    SwaFetchServerStats stats() const DSI_EXCLUDES(mu_);

private:
    SwaFetchServer() = default;
    void loop();
    Status serve_one(transfer::Connection& conn);

    SwaFetchServerOptions options_;
    std::unique_ptr<transfer::Transport> transport_;
    std::unique_ptr<transfer::Listener> listener_;
    uint16_t port_ = 0;
    std::atomic<bool> stopping_{false};
    mutable Mutex mu_;
    SwaFetchServerStats stats_ DSI_GUARDED_BY(mu_);
    std::thread thread_;
};

}  // namespace dsi::serving
