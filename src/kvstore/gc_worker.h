// GcWorker: one per store node (S-KV-3). Periodically lists the node's blocks, asks
// GcPolicy for a plan and removes what it names; counts TTL expiries and evictions in
// the target's metrics. The mechanism only: every decision is GcPolicy's.
// Thread model: run_once() may be called from any one thread at a time; start() runs it
// on an own thread every `interval_ns` until stop() (or the destructor), which wakes the
// thread and joins it (the wait is bounded by one run_once).
#pragma once

#include <cstdint>
#include <mutex>
#include <thread>

#include "base/mutex.h"
#include "kvstore/gc_policy.h"

namespace dsi::kvstore {

struct GcRunStats {
    int64_t num_blocks = 0;
    int64_t used_bytes_before = 0;
    int64_t used_bytes_after = 0;
    int64_t capacity_bytes = 0;
    int64_t expired = 0;
    int64_t evicted = 0;
    int64_t remove_errors = 0;
};

class GcWorker {
public:
    // REQUIRES: target outlives the worker.
    GcWorker(GcTarget* target, GcPolicy policy);
    ~GcWorker();
    GcWorker(const GcWorker&) = delete;
    GcWorker& operator=(const GcWorker&) = delete;

    Result<GcRunStats> run_once();
    void start(int64_t interval_ns);
    void stop();
    // The last run's stats (zero before the first run).
    GcRunStats last_stats() const;

private:
    GcTarget* target_;
    GcPolicy policy_;
    mutable Mutex mu_;
    CondVar cv_;
    bool stopping_ DSI_GUARDED_BY(mu_) = false;
    GcRunStats last_ DSI_GUARDED_BY(mu_);
    std::thread thread_;
};

}  // namespace dsi::kvstore
