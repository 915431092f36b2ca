#include "kvstore/metrics.h"

#include <nlohmann/json.hpp>

namespace dsi::kvstore {

void LatencyCounter::record(int64_t ns) {
    count.fetch_add(1, std::memory_order_relaxed);
    sum_ns.fetch_add(ns, std::memory_order_relaxed);
    int64_t prev = max_ns.load(std::memory_order_relaxed);
    while (ns > prev && !max_ns.compare_exchange_weak(prev, ns, std::memory_order_relaxed)) {
    }
}

MetricsSnapshot StoreMetrics::snapshot() const {
    auto ld = [](const std::atomic<int64_t>& a) { return a.load(std::memory_order_relaxed); };
    MetricsSnapshot s;
    s.hits = ld(hits);
    s.misses = ld(misses);
    s.corrupt = ld(corrupt);
    s.puts = ld(puts);
    s.puts_dropped = ld(puts_dropped);
    s.removes = ld(removes);
    s.errors = ld(errors);
    s.bytes_read = ld(bytes_read);
    s.bytes_written = ld(bytes_written);
    s.get_count = ld(get_latency.count);
    s.get_sum_ns = ld(get_latency.sum_ns);
    s.get_max_ns = ld(get_latency.max_ns);
    s.put_count = ld(put_latency.count);
    s.put_sum_ns = ld(put_latency.sum_ns);
    s.put_max_ns = ld(put_latency.max_ns);
    s.gc_runs = ld(gc_runs);
    s.gc_evictions = ld(gc_evictions);
    s.gc_evicted_bytes = ld(gc_evicted_bytes);
    s.ttl_expiries = ld(ttl_expiries);
    s.degraded_reads = ld(degraded_reads);
    return s;
}

std::string MetricsSnapshot::to_json() const {
    nlohmann::json j = {{"hits", hits},
                        {"misses", misses},
                        {"corrupt", corrupt},
                        {"puts", puts},
                        {"puts_dropped", puts_dropped},
                        {"removes", removes},
                        {"errors", errors},
                        {"bytes_read", bytes_read},
                        {"bytes_written", bytes_written},
                        {"get_count", get_count},
                        {"get_sum_ns", get_sum_ns},
                        {"get_max_ns", get_max_ns},
                        {"put_count", put_count},
                        {"put_sum_ns", put_sum_ns},
                        {"put_max_ns", put_max_ns},
                        {"gc_runs", gc_runs},
                        {"gc_evictions", gc_evictions},
                        {"gc_evicted_bytes", gc_evicted_bytes},
                        {"ttl_expiries", ttl_expiries},
                        {"degraded_reads", degraded_reads}};
    return j.dump();
}

}  // namespace dsi::kvstore
