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
//  - prefix hits: BlockIdCache match at arrival (shared) or on the routed engine (local).
// Baselines in the same code path: round robin, least loaded (queued tokens / running
// requests) and a prefix-affinity router with a load term (per-engine caches, the way
// public KV-aware routers work).
//
// Deterministic: no wall clock or randomness in the event order (ties break by
// sequence number). Thread model: simulate() is a pure function of its inputs.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "cluster/autoscaler.h"
#include "cluster/decode_lb.h"
#include "cluster/prefill_lb.h"
#include "engine/prefill_cost_model.h"
#include "workload/trace.h"

namespace dsi::sim {

// Operational events and policies of SPEC S-DEPLOY, run inside the request-level
// simulation (the cluster file's "operations" section). Times are simulated seconds
// from the first arrival (after --load / time_scale scaling).
//  - Decode engines form EP instances of decode_ep_size ranks (0: all decode engines
//    form one instance, EP = num_decode). A drain stops an instance: no new requests,
//    decoding continues for the grace period, then cluster::DecodeDrain moves every
//    unfinished request with its KV to other ranks in one plan (transfer time = KV bytes
//    / p2d bandwidth); unplaced ones re-route through prefill.
//  - A device failure takes its whole instance down (one communication domain): the
//    step in flight is lost, its requests re-route through prefill (the prompt is a store
//    hit, the generated tokens are recomputed), and the instance restarts after
//    restart_s with EP size = healthy devices (cluster::plan_ep_restart); below
//    min_ep_size it stays down.
//  - autoscale: every decision_interval_s cluster::Autoscaler decides prefill engines
//    (from the cache-missed token rate) and decode instances (from running requests);
//    scale-out takes machines from the spare pool (a provisioned machine joins it after
//    provision_s), decode scale-in drains the instance with the fewest requests, a
//    prefill engine told to stop finishes its queue first. The cluster's num_prefill
//    and num_decode / decode_ep_size are the most that can be online.
struct DecodeDrainAt {
    double at_s = 0;
    int instance = 0;
};
struct DeviceFailureAt {
    double at_s = 0;
    int instance = 0;
    int devices = 1;  // devices of the instance that fail
};
struct OperationsSettings {
    int decode_ep_size = 0;  // decode ranks per EP instance; 0 = one instance of all
    double drain_grace_s = 60;   // S-DEPLOY: 1 minute
    double restart_s = 180;      // S-DEPLOY: restarts take minutes
    int min_ep_size = 1;
    int num_logical_experts = 256;      // for the restart's expert layout (S-EPLB)
    int redundant_experts_per_rank = 1;
    std::vector<DecodeDrainAt> drains;
    std::vector<DeviceFailureAt> failures;
    bool autoscale = false;
    double decision_interval_s = 10;
    double provision_s = 300;
    int initial_prefill = 0;           // 0 = num_prefill
    int initial_decode_instances = 0;  // 0 = all
    int initial_spare = 0;             // ready machines in the pool at the start
    // Instance counts; max_prefill / max_decode are clamped to what the cluster has.
    cluster::AutoscalerSettings autoscaler;

    bool enabled() const { return autoscale || !drains.empty() || !failures.empty(); }
    Status validate(int num_prefill, int num_decode) const;
};

// The hardware and store. Defaults describe an H800-class device (a setting, not a law).
struct ClusterDescription {
    std::string device = "H800-class (coefficients fitted to DeepSeek's published rates)";
    int num_prefill = 64;
    int num_decode = 64;
    engine::PrefillCostModel prefill_cost;
    // A prefill step's chunks are sized by prefill_cost (as the engines size them, by
    // their calibration) and take prefill_time_cost's time when set (a fit to the live
    // engines' step records, sim/step_fit.h), else prefill_cost's.
    std::optional<engine::PrefillCostModel> prefill_time_cost;
    double prefill_step_overhead_ns = 1e6;
    double decode_base_ns = 15e6;
    double decode_per_request_ns = 100e3;
    double decode_per_kv_token_ns = 10;  // ~35 KB of KV per token at ~3.3 TB/s
    int decode_max_batch = 128;
    // 0: a request joins decode with its whole prompt's KV (DeepSeek's hand-over). B > 0:
    // the hand-over carries full blocks of B tokens only (the transfer time is theirs),
    // so the joining step also computes the prompt's last L mod B tokens (prefill_cost at
    // c = the rest), as dsinfer's live hand-over does (serving/kv_handoff.h, B = 128).
    int64_t decode_join_recompute_block = 0;
    // The live system's hops and admission (bench/sim_vs_live.sh fits them to a live
    // cluster's records; all 0 / unset / false: the idealised cluster of the figures).
    //  - prefill_lb_cost: what the entrypoint prices a request with for the prefill quota
    //    pull (S-LB); unset: prefill_cost. dsinfer's router has no measured fit and prices
    //    with the conservative CPU estimate of the checkpoint, so on a CPU its quota
    //    admits one or two prompts an engine at a time.
    //  - prefill_dispatch_ns: from the pull (or the arrival, with room in the quota) to
    //    the request at its prefill engine: the router's hop.
    //  - prefill_release_ns: from the end of a request's KV transfer (its last prefill
    //    step + the transfer time below) to the release of its quota (the router releases
    //    it when the prefill engine's part ends: after the KV hand-over's Ack).
    //  - p2d_latency_ns: from the last prefill step to the request at the decode
    //    engine's scheduler, beyond kv_bytes_per_token x prompt / p2d_bytes_per_s (the
    //    hand-over's Ack, the router's continuation hop, the decode engine's fetch of
    //    the handed-over blocks from its store tier).
    //  - decode_async_join: the decode engine plans step N+1 while step N runs (S-ASYNC),
    //    so a request that arrives during a step joins the step after the next one (an
    //    idle engine takes it at once).
    std::optional<engine::PrefillCostModel> prefill_lb_cost;
    double prefill_dispatch_ns = 0;
    double prefill_release_ns = 0;
    double p2d_latency_ns = 0;
    bool decode_async_join = false;
    int64_t decode_kv_capacity_tokens = 1'500'000;
    double kv_bytes_per_token = 35'136;  // MLA latent 576 x 61 layers, e4m3 (S-ENG-9)
    double p2d_bytes_per_s = 50e9;
    double store_read_bytes_per_s = 5e9;
    int64_t store_capacity_tokens = 0;  // 0 = unlimited
    int64_t store_ttl_ns = 0;           // 0 = no TTL
    double price_per_device_hour = 2.0;  // USD; an assumption, set per deployment
    OperationsSettings operations;

    int decode_ep() const {
        return operations.decode_ep_size > 0 ? operations.decode_ep_size : num_decode;
    }
    Status validate() const;
};

// JSON object with any of the fields above (same names; "prefill_cost" and
// "prefill_time_cost" are objects with base_ns, per_q_ns, per_c_ns, per_qc_ns, per_qq_ns;
// "operations" an object with the fields of OperationsSettings, "drains": [{"at_s", "instance"}],
// "failures": [{"at_s", "instance", "devices"}], "autoscaler": {the AutoscalerSettings fields,
// intervals as scale_out_interval_s / scale_in_interval_s}). Unknown keys are an error.
Result<ClusterDescription> parse_cluster_description(std::string_view json);
// The same keys applied over `base` (the keys absent keep base's values): an overlay such
// as a step fit (sim/step_fit.h) on a calibrated description.
Result<ClusterDescription> apply_cluster_description(std::string_view json,
                                                     ClusterDescription base);

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
    // Service-level objective of SimResult::slo_attainment / goodput_requests_per_s: a
    // request meets it when its TTFT <= slo_ttft_ms and its TPOT <= slo_tpot_ms (one-token
    // requests: TTFT only).
    double slo_ttft_ms = 2000;
    double slo_tpot_ms = 50;
    // SimResult::requests and SimResult::decode_steps: one record per request and per
    // decode step, to set beside a live run's `bench serve --records-out` and the decode
    // engine's `serve --step-log` (bench/sim_vs_live.sh).
    bool keep_records = false;
};

// One bin of the timeline: mean share of busy engines of each stage, and the requests
// waiting for prefill (in the LB and engine queues) at the bin's end.
struct TimelinePoint {
    double t_s = 0;  // bin start, from the first arrival
    double prefill_busy = 0;
    double decode_busy = 0;
    int64_t prefill_waiting = 0;
};

// One request of a simulation (SimOptions::keep_records); times in simulated ns from the
// first arrival, -1 where the request never got there.
struct SimRequestRecord {
    int64_t index = 0;  // in the trace
    int64_t prompt_tokens = 0;
    int64_t output_tokens = 0;
    int64_t hit_tokens = 0;
    int64_t arrival_ns = 0;
    int64_t first_token_ns = -1;   // out of prefill
    int64_t decode_arrive_ns = -1; // at the decode engine (after transfer and hops)
    int64_t second_token_ns = -1;  // the end of its first decode step (the join)
    int64_t finish_ns = -1;
    int32_t prefill_engine = -1;
    int32_t decode_engine = -1;
};

// One decode step (SimOptions::keep_records).
struct SimDecodeStep {
    int32_t engine = 0;
    int64_t start_ns = 0;  // from the first arrival
    int64_t end_ns = 0;
    int64_t running = 0;   // requests in the step, joiners included
    int64_t joining = 0;   // requests whose first decode step this is
    int64_t kv_tokens = 0;
    double join_ns = 0;    // the joiners' recomputed partial blocks, inside the step
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
    double slo_attainment = 0;          // share of requests meeting SimOptions' SLO
    double goodput_requests_per_s = 0;  // those requests / makespan
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
    // Operations (all zero unless ClusterDescription::operations is enabled).
    int64_t rerouted_requests = 0;        // re-prefilled after a failure or unplaced drain
    int64_t rerouted_context_tokens = 0;  // their context (prompt + generated) re-prefilled
    int64_t rerouted_hit_tokens = 0;      // of which found in the store
    int64_t migrated_requests = 0;        // moved with their KV by a drain
    int64_t migrated_kv_tokens = 0;
    int64_t lost_step_tokens = 0;         // tokens of decode steps in flight at a failure
    int drains_completed = 0;
    int failures = 0;
    std::vector<int> restart_ep_sizes;    // EP size each failed instance came back with
    int scale_out_decisions = 0;
    int scale_in_decisions = 0;
    int scale_in_blocked_by_utilisation = 0;
    int min_online_decode_instances = 0;
    int max_online_decode_instances = 0;
    int min_online_prefill = 0;
    int max_online_prefill = 0;
    double device_hours = 0;              // devices held (online, draining, restarting, spare)
    std::vector<TimelinePoint> timeline;  // empty unless SimOptions::timeline_bin_ns > 0
    std::vector<SimRequestRecord> requests;  // empty unless SimOptions::keep_records
    std::vector<SimDecodeStep> decode_steps;  // empty unless SimOptions::keep_records
};

Result<SimResult> simulate(const workload::Trace& trace, const ClusterDescription& cluster,
                           const SimOptions& options);

}  // namespace dsi::sim
