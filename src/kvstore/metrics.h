// StoreMetrics: counters of one store (or tier), updated lock-free by any thread.
//
// Hits/misses count blocks; a corrupt or mismatched block counts as a miss *and* as
// `corrupt`. A write the store could not take (full disk, server down, limits) is
// `puts_dropped`; `errors` counts I/O and server failures of any operation.
// Latencies are sums + counts (+ max) in nanoseconds, so a scraper derives means.
// Thread model: all members are relaxed atomics; snapshot() is a consistent-enough
// copy for reporting (fields read one by one).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace dsi::kvstore {

struct LatencyCounter {
    std::atomic<int64_t> count{0};
    std::atomic<int64_t> sum_ns{0};
    std::atomic<int64_t> max_ns{0};
    void record(int64_t ns);
};

struct MetricsSnapshot {
    int64_t hits = 0, misses = 0, corrupt = 0;
    int64_t puts = 0, puts_dropped = 0, removes = 0, errors = 0;
    int64_t bytes_read = 0, bytes_written = 0;
    int64_t get_count = 0, get_sum_ns = 0, get_max_ns = 0;
    int64_t put_count = 0, put_sum_ns = 0, put_max_ns = 0;
    int64_t gc_runs = 0, gc_evictions = 0, gc_evicted_bytes = 0, ttl_expiries = 0;
    int64_t degraded_reads = 0;  // erasure-coded reads that needed parity
    // One JSON object, keys as the field names.
    std::string to_json() const;
};

struct StoreMetrics {
    std::atomic<int64_t> hits{0}, misses{0}, corrupt{0};
    std::atomic<int64_t> puts{0}, puts_dropped{0}, removes{0}, errors{0};
    std::atomic<int64_t> bytes_read{0}, bytes_written{0};
    LatencyCounter get_latency, put_latency;
    std::atomic<int64_t> gc_runs{0}, gc_evictions{0}, gc_evicted_bytes{0}, ttl_expiries{0};
    std::atomic<int64_t> degraded_reads{0};

    MetricsSnapshot snapshot() const;
};

}  // namespace dsi::kvstore
