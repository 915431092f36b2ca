// KvLanding: where a KV hand-over lands in the decode engine's own pool (issue 18,
// docs/cluster.md "KV hand-over"). The receiver (serving::KvInbox, on its threads) asks
// at Begin for pool blocks for the transfer's rows, writes each arriving layer straight
// into them (one copy: wire -> pool), and at End lands them (published to the prefix
// index under their chain keys, held for the continuation: kv::TieredCache "hand-over
// landings") or, for a failed or aborted transfer, drops them. The engine that owns the
// pool serves those asks on its own thread between steps (Engine::step, idle_check):
// the receiver never touches the cache, the engine never waits for the receiver.
//
// Lifetimes: a granted reservation's memory is the receiver's to write until it calls
// land() or drop(); a landed one is held until its continuation is admitted or `ttl`
// passes; a reservation whose receiver stopped waiting (reserve/land past its wait) is
// dropped by the engine. A reservation is granted only once every step the engine had
// submitted when it took the blocks has completed (a block just freed may still be
// written by such a step). When the engine has no room (or no engine is attached, or its
// layout has no landings: V4 / V4.1), reserve fails and the receiver takes the
// store-tier path.
//
// Thread model: every method is thread-safe. reserve() and land() wait for the engine
// thread, at most `wait`; drop() never waits. attach / serve / grant_ready / detach are
// the engine's (its scheduling thread). REQUIRES: the receiver stops writing before the
// engine goes (detach waits, bounded, for the outstanding reservations).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "kv/block_key.h"

namespace dsi::kv {
class TieredCache;
}

namespace dsi::engine {

struct KvLandingStats {
    int64_t reserved = 0;    // reservations granted
    int64_t landed = 0;      // landed (published and held for the continuation)
    int64_t attached = 0;    // continuations admitted onto a landing
    int64_t expired = 0;     // landed, never claimed within the TTL
    int64_t dropped = 0;     // released by a failed / aborted transfer or a late receiver
    int64_t refused = 0;     // asks the engine could not serve (no room, no engine)
    int64_t tail_tokens = 0;  // tail rows attached (prompt tokens not recomputed)
    int64_t blocks_held = 0;  // pool blocks held by reservations and landings now
};

class KvLanding {
public:
    // A granted reservation: per store layer (kv::num_store_layers), per block, that
    // block's slice of that layer (layer_block_bytes bytes; the tail block's first rows
    // are the tail's).
    struct Grant {
        int64_t handle = 0;
        std::vector<std::vector<uint8_t*>> layers;
    };

    explicit KvLanding(std::chrono::milliseconds ttl = std::chrono::seconds(10)) : ttl_(ttl) {}
    KvLanding(const KvLanding&) = delete;
    KvLanding& operator=(const KvLanding&) = delete;

    // --- the receiver ---
    // Blocks for num_tokens rows. UNAVAILABLE without an engine, RESOURCE_EXHAUSTED
    // when its pool has no room, FAILED_PRECONDITION for a layout without landings,
    // DEADLINE_EXCEEDED past `wait` (the engine drops what it took later).
    Result<Grant> reserve(int64_t num_tokens, std::chrono::milliseconds wait);
    // The rows are written: publish the full blocks under `keys` and hold every block
    // for the continuation (tail: kv::tail_key of the tail's tokens). An error drops them.
    Status land(int64_t handle, std::vector<kv::BlockKey> keys, kv::BlockKey tail,
                std::chrono::milliseconds wait);
    // Releases a granted reservation (a failed transfer); never waits.
    void drop(int64_t handle);
    KvLandingStats stats() const;
    // Called (outside any lock of this class) when an ask is queued, so an idle engine
    // loop wakes at once (server::EngineService::wake).
    void set_waker(std::function<void()> waker);

    // --- the engine (its scheduling thread) ---
    // False when another engine is attached.
    bool attach();
    bool has_asks() const;
    // Serves the queued asks on `cache`; reservations taken now are granted once
    // `completed_steps` reaches `submitted_steps` (grant_ready). `reserve_ok`: false while
    // blocks just released still await a step's copy (preemption saves): reserves wait.
    void serve(kv::TieredCache& cache, int64_t now_ns, int64_t submitted_steps,
               int64_t completed_steps, bool reserve_ok);
    // Grants the reservations whose steps have completed (or drops those abandoned).
    void grant_ready(kv::TieredCache& cache, int64_t completed_steps);
    // Drops the landings past their TTL.
    void expire(kv::TieredCache& cache, int64_t now_ns);
    // The engine goes: every ask fails, and this waits (at most 30 s) until no granted
    // reservation is being written.
    void detach();

private:
    // Shared by the asking thread (which waits on it, or abandons it at its deadline)
    // and the engine thread (which answers it); fields under mu_.
    struct Ask {
        enum class Kind { kReserve, kLand, kDrop } kind = Kind::kReserve;
        int64_t num_tokens = 0;
        int64_t handle = 0;
        std::vector<kv::BlockKey> keys;
        kv::BlockKey tail;
        int64_t ready_after = 0;  // kReserve, taken: granted once that many steps completed
        bool done = false;
        bool abandoned = false;  // the receiver stopped waiting
        Status status;
        Grant grant;
    };
    std::shared_ptr<Ask> push(std::shared_ptr<Ask> a);
    // Waits for `a` until `wait`; marks it abandoned on a timeout.
    Status await(Ask& a, std::chrono::milliseconds wait);
    void grant_locked(kv::TieredCache& cache, int64_t completed_steps) DSI_REQUIRES(mu_);
    void publish_stats(const kv::TieredCache& cache) DSI_REQUIRES(mu_);
    void finish(Ask& a, Status s) DSI_REQUIRES(mu_);

    const std::chrono::milliseconds ttl_;
    mutable Mutex mu_;
    CondVar cv_;
    bool attached_ DSI_GUARDED_BY(mu_) = false;
    std::deque<std::shared_ptr<Ask>> queue_ DSI_GUARDED_BY(mu_);
    std::vector<std::shared_ptr<Ask>> granting_ DSI_GUARDED_BY(mu_);
    int64_t outstanding_ DSI_GUARDED_BY(mu_) = 0;  // granted, neither landed nor dropped
    KvLandingStats stats_ DSI_GUARDED_BY(mu_);
    std::function<void()> waker_ DSI_GUARDED_BY(mu_);
};

}  // namespace dsi::engine
