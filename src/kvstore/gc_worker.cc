#include "kvstore/gc_worker.h"

#include <chrono>

#include "base/mutex.h"
#include "base/logging.h"

namespace dsi::kvstore {

GcWorker::GcWorker(GcTarget* target, GcPolicy policy) : target_(target), policy_(policy) {}

GcWorker::~GcWorker() { stop(); }

Result<GcRunStats> GcWorker::run_once() {
    DSI_ASSIGN_OR_RETURN(std::vector<GcEntry> blocks, target_->list_blocks());
    DSI_ASSIGN_OR_RETURN(int64_t capacity, target_->capacity_bytes());
    GcPlan plan = policy_.plan(blocks, capacity);
    GcRunStats stats;
    stats.num_blocks = static_cast<int64_t>(blocks.size());
    stats.capacity_bytes = capacity;
    stats.used_bytes_before = plan.used_bytes_before;
    stats.used_bytes_after = plan.used_bytes_after;
    StoreMetrics& m = target_->metrics();
    for (const StoreKey& key : plan.expired) {
        if (target_->remove(key).is_ok()) {
            ++stats.expired;
        } else {
            ++stats.remove_errors;
        }
    }
    for (const StoreKey& key : plan.evicted) {
        if (target_->remove(key).is_ok()) {
            ++stats.evicted;
        } else {
            ++stats.remove_errors;
        }
    }
    m.gc_runs.fetch_add(1, std::memory_order_relaxed);
    m.ttl_expiries.fetch_add(stats.expired, std::memory_order_relaxed);
    m.gc_evictions.fetch_add(stats.evicted, std::memory_order_relaxed);
    m.gc_evicted_bytes.fetch_add(plan.expired_bytes + plan.evicted_bytes,
                                 std::memory_order_relaxed);
    MutexLock lock(&mu_);
    last_ = stats;
    return stats;
}

void GcWorker::start(int64_t interval_ns) {
    DSI_CHECK(!thread_.joinable(), "GcWorker started twice");
    {
        MutexLock lock(&mu_);
        stopping_ = false;
    }
    thread_ = std::thread([this, interval_ns] {
        while (true) {
            {
                MutexLock lock(&mu_);
                if (stopping_) return;
            }
            auto r = run_once();
            if (!r.is_ok()) {
                DSI_LOG(kWarning) << "kvstore gc: " << r.status().to_string();
            }
            MutexLock lock(&mu_);
            const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(interval_ns);
            while (!stopping_ && cv_.wait_until(&mu_, until)) {
            }
            if (stopping_) return;
        }
    });
}

void GcWorker::stop() {
    {
        MutexLock lock(&mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
}

GcRunStats GcWorker::last_stats() const {
    MutexLock lock(&mu_);
    return last_;
}

}  // namespace dsi::kvstore
