// Discrete-event simulator of a disaggregated cluster: entrypoint, prefill engines,
// decode engines and the shared KV store, replaying a request trace (SPEC S-LB,
// S-DEPLOY, S-KV; ARCHITECTURE "Policy and mechanism").
//
// The routing decisions are made by the SAME policy classes the cluster uses
// (cluster::PrefillLb, cluster::DecodeLb, the cost model); the simulator only supplies
// simulated time and cost models:
//  - prefill step: step overhead + sum of PrefillCostModel::cost_ns(q, c) of its chunks;
//    chunk sizes come from the cost-model solver under the bucket's time budget;
//  - decode step: base + per_request x batch + per_kv_token x total KV of the batch;
//  - KV transfer prefill -> decode: prompt KV bytes / link bandwidth;
//  - store read: hit KV bytes / store bandwidth, overlapped with queueing (the request's
//    first token is not before arrival + read time);
//  - prefix hits: BlockStore match at arrival (shared) or on the routed engine (local).
// Baselines in the same code path: round robin, least loaded (queued tokens / running
// requests) and a prefix-affinity router with a load term (per-engine caches, the way
// public KV-aware routers work).
//
// Deterministic: no wall clock or randomness in the event order (ties break by
// sequence number). Thread model: simulate() is a pure function of its inputs.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "cluster/decode_lb.h"
#include "engine/prefill_cost_model.h"
#include "cluster/prefill_lb.h"
#include "sim/trace.h"

namespace dsi::sim {

// The hardware and store. Defaults describe an H800-class device (a setting, not a law).
struct ClusterDescription {
    std::string device = "H800-class (coefficients fitted to DeepSeek's published rates)";
    int num_prefill = 64;
    int num_decode = 64;
    engine::PrefillCostModel prefill_cost;
    double prefill_step_overhead_ns = 1e6;
    double decode_base_ns = 15e6;
    double decode_per_request_ns = 100e3;
    double decode_per_kv_token_ns = 10;  // ~35 KB of KV per token at ~3.3 TB/s
    int decode_max_batch = 128;
    int64_t decode_kv_capacity_tokens = 1'500'000;
    double kv_bytes_per_token = 35'136;  // MLA latent 576 x 61 layers, e4m3 (S-ENG-9)
    double p2d_bytes_per_s = 50e9;
    double store_read_bytes_per_s = 5e9;
    int64_t store_capacity_tokens = 0;  // 0 = unlimited
    int64_t store_ttl_ns = 0;           // 0 = no TTL
    double price_per_device_hour = 2.0;  // USD; an assumption, set per deployment

    Status validate() const;
};

// JSON object with any of the fields above (same names; "prefill_cost" is an object with
// base_ns, per_q_ns, per_c_ns, per_qc_ns, per_qq_ns). Unknown keys are an error.
Result<ClusterDescription> parse_cluster_description(std::string_view json);

enum class PrefillRouting { kDeepSeek, kRoundRobin, kLeastLoaded, kPrefixAffinity };
enum class DecodeRouting { kDeepSeek, kRoundRobin, kLeastLoaded };
enum class StoreKind { kShared, kPerEngine };

Result<PrefillRouting> parse_prefill_routing(std::string_view name);
Result<DecodeRouting> parse_decode_routing(std::string_view name);
std::string_view prefill_routing_name(PrefillRouting r);
std::string_view decode_routing_name(DecodeRouting r);

struct SimOptions {
    PrefillRouting prefill_routing = PrefillRouting::kDeepSeek;
    DecodeRouting decode_routing = DecodeRouting::kDeepSeek;
    StoreKind store = StoreKind::kShared;
    cluster::PrefillLbSettings prefill_lb;
    cluster::DecodeLbSettings decode_lb;
    double affinity_load_weight = 1.0;  // prefix-affinity: tokens of queue per missed token
    // Arrival times are multiplied by time_scale; if target_load > 0 the scale is chosen so
    // that the offered load of the busier stage is target_load of its ideal capacity.
    double time_scale = 1.0;
    double target_load = 0;
    // > 0: SimResult::timeline gets one point per bin of this many simulated ns.
    int64_t timeline_bin_ns = 0;
};

// One bin of the timeline: mean share of busy engines of each stage, and the requests
// waiting for prefill (in the LB and engine queues) at the bin's end.
struct TimelinePoint {
    double t_s = 0;  // bin start, from the first arrival
    double prefill_busy = 0;
    double decode_busy = 0;
    int64_t prefill_waiting = 0;
};

struct Distribution {
    double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

struct SimResult {
    int64_t num_requests = 0;
    int64_t num_finished = 0;
    double time_scale = 1.0;
    double makespan_s = 0;
    Distribution ttft_ms;
    Distribution tpot_ms;
    double input_tokens_per_s = 0;
    double output_tokens_per_s = 0;
    double hit_rate = 0;  // hit tokens / input tokens
    std::vector<double> prefill_utilisation;
    std::vector<double> decode_utilisation;
    double prefill_lb_efficiency = 0;
    double decode_lb_efficiency = 0;
    double lb_efficiency = 0;  // end to end: ideal makespan / achieved
    double cost_per_million_tokens = 0;
    std::array<int64_t, cluster::kNumPrefillBuckets> bucket_requests{};
    std::array<Distribution, cluster::kNumPrefillBuckets> bucket_ttft_ms;  // by S-LB bucket
    int64_t prefill_reassignments = 0;
    // Conservation: tokens in = tokens out of each stage; every request finishes once.
    int64_t input_tokens = 0;
    int64_t hit_tokens = 0;
    int64_t computed_tokens = 0;    // prefill: hit + computed == input
    int64_t expected_decode_tokens = 0;  // sum of (output - 1)
    int64_t decoded_tokens = 0;
    int64_t kv_moved_tokens = 0;    // prefill -> decode
    bool conservation_ok = false;
    int64_t events = 0;
    std::vector<TimelinePoint> timeline;  // empty unless SimOptions::timeline_bin_ns > 0
};

Result<SimResult> simulate(const Trace& trace, const ClusterDescription& cluster,
                           const SimOptions& options);

}  // namespace dsi::sim
