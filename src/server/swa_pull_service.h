// SwaPullService: remote SWA-state pulls before a prefill (issue 18, SPEC S-KV-8). A
// GenerationService in front of a cluster engine's (V4 / V4.1): a generation whose
// Generation::swa_pull names a state this engine's pool does not hold (the router's
// SWA-state directory found it on another engine) waits while one worker thread pulls
// it from the holder (serving::fetch_swa_state, bounded by `timeout`) into the pool;
// then it goes on to the inner service, whose admission finds the state (an exact or
// catch-up hit instead of the S-KV-10 replay). A pull that fails -- holder gone,
// evicted there, damaged frame or seal, timeout, a full queue -- is counted and the
// generation goes on without it (the engine's own hit rule): never an error.
// Thread model: thread-safe; one worker thread, joined by the destructor, which first
// hands the generations still waiting to the inner service unpulled.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <thread>

#include "base/mutex.h"
#include "server/generation_service.h"
#include "serving/swa_fetch.h"

namespace dsi::server {

struct SwaPullServiceOptions {
    kv::SwaStatePool* pool = nullptr;  // REQUIRES: non-null, outlives the service
    serving::SwaFetchOptions fetch;    // state size, incarnation, timeout
    size_t max_queued = 64;            // more waiting pulls: the generation goes on unpulled
};

struct SwaPullStats {
    int64_t num_pulls = 0;    // states pulled into the pool
    int64_t num_failed = 0;   // pulls that failed (the generation went on without)
    int64_t num_held = 0;     // asked for a state the pool already held
    int64_t num_skipped = 0;  // queue full
    int64_t bytes = 0;        // pulled state bytes
    int64_t micros = 0;       // time of the successful pulls (connect to pool put), summed
};

class SwaPullService final : public GenerationService {
public:
    // REQUIRES: `inner` outlives this service. `transport` null: TCP.
    SwaPullService(GenerationService* inner, SwaPullServiceOptions options,
                   std::unique_ptr<transfer::Transport> transport = nullptr);
    ~SwaPullService() override;

    void start(Ticket ticket, Generation generation, Sink sink) override;
    void abort(Ticket ticket) override;
    void abort_all() override;
    // The inner service's, plus swa_state_pulls_total and the rest of SwaPullStats.
    ServiceStats stats_snapshot() const override;
    SwaPullStats pull_stats() const DSI_EXCLUDES(mu_);

private:
    struct Job {
        Ticket ticket = 0;
        Generation generation;
        Sink sink;
    };
    void loop();
    // Starts the job on the inner service; aborts it there when it was aborted here.
    void hand_on(Job job);

    GenerationService* inner_;
    const SwaPullServiceOptions options_;
    std::unique_ptr<transfer::Transport> transport_;
    mutable Mutex mu_;
    CondVar cv_;
    bool stopping_ DSI_GUARDED_BY(mu_) = false;
    std::deque<Job> queue_ DSI_GUARDED_BY(mu_);
    std::set<Ticket> waiting_ DSI_GUARDED_BY(mu_);  // queued or being pulled
    std::set<Ticket> aborted_ DSI_GUARDED_BY(mu_);  // of those, aborted meanwhile
    SwaPullStats stats_ DSI_GUARDED_BY(mu_);
    std::thread thread_;
};

}  // namespace dsi::server
