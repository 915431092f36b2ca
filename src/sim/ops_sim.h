// OpsSim: hours of fleet operation at instance level, driving the operational policies
// of SPEC S-DEPLOY with the same classes the cluster uses:
//  - cluster::Autoscaler decides prefill / decode instance counts every decision
//    interval from the measured cache-missed token rate and running requests;
//  - scale-out takes spare machines at once and provisions the rest (ready after
//    provision_s); the autoscaler's pool refills are provisioned the same way;
//  - decode scale-in goes through cluster::DecodeDrain: the instance takes no new work,
//    keeps decoding for the grace period, then its unfinished requests move with their KV
//    to other instances in one plan (DecodeLb); unplaced ones re-route through prefill;
//  - a device failure takes its decode instance down (S-DEPLOY: one communication
//    domain); it restarts after restart_s with EP size = healthy devices
//    (cluster::plan_ep_restart), capacity in proportion; its requests re-route through
//    prefill (the prompt is a store hit, the generated tokens are recomputed).
// Time advances in fixed steps; prefill is a fluid FIFO queue of missed tokens; decode
// requests each gain decode_tokens_per_s per second. Traffic: a diurnal (sinusoidal) rate
// with deterministic request lengths per seed.
// Conservation is checked every step (arrived = waiting + running + finished) and at the
// end (each request finishes once; decoded tokens = sum of outputs; migrated KV = sum of
// the moved requests' KV). Thread model: run_ops_sim() is a pure function of its inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "cluster/autoscaler.h"
#include "cluster/decode_lb.h"
#include "cluster/drain.h"

namespace dsi::sim {

struct OpsSimSettings {
    double duration_s = 4 * 3600;
    double step_s = 1.0;
    double day_s = 4 * 3600;          // diurnal period (a compressed day)
    double mean_rate_per_s = 40;      // requests / s over a period
    double diurnal_amplitude = 0.7;   // rate = mean x (1 - amplitude x cos(2 pi t / day))
    int64_t mean_input_tokens = 8000;   // lengths uniform in [0.5, 1.5] x mean
    int64_t mean_output_tokens = 600;
    double hit_rate = 0.5;              // share of each prompt found in the KV store
    double prefill_tokens_per_s_per_instance = 50'000;  // missed tokens
    int decode_devices_per_instance = 8;                // EP size of a decode instance
    int decode_requests_per_device = 64;
    double decode_tokens_per_s = 30;                    // per running request
    double decision_interval_s = 10;
    double provision_s = 300;  // a new machine is ready after this
    double restart_s = 180;    // an EP instance restart takes minutes (S-DEPLOY)
    double fail_at_s = -1;     // < 0: no failure
    int fail_devices = 1;      // devices of one decode instance that fail at fail_at_s
    int num_logical_experts = 256;
    int redundant_experts_per_rank = 1;
    int min_ep_size = 4;
    int initial_prefill = 4;
    int initial_decode = 4;
    int initial_spare = 2;
    cluster::AutoscalerSettings autoscaler;
    cluster::DrainSettings drain;
    cluster::DecodeLbSettings decode_lb;
    uint64_t seed = 1;

    Status validate() const;
};

// One decision interval.
struct OpsPoint {
    double t_s = 0;
    double rate_per_s = 0;      // offered arrival rate
    int online_prefill = 0;
    int online_decode = 0;      // up and accepting (not draining, restarting or gone)
    int target_prefill = 0;
    int target_decode = 0;
    int spare = 0;
    int draining = 0;
    int restarting = 0;
    int64_t running = 0;        // requests decoding
    int64_t waiting = 0;        // in prefill or waiting for a decode slot
    double decode_utilisation = 0;  // running / capacity of the accepting instances
};

struct OpsResult {
    std::vector<OpsPoint> timeline;
    int64_t arrived = 0;
    int64_t finished = 0;
    int scale_out_decisions = 0;
    int scale_in_decisions = 0;
    int blocked_by_utilisation = 0;  // scale-ins refused at quota utilisation > 0.8
    int drains_started = 0;
    int drains_completed = 0;
    int64_t migrated_requests = 0;
    int64_t migrated_kv_tokens = 0;
    int64_t rerouted_requests = 0;   // unplaced at drain end, or on a failed instance
    int failures = 0;
    int restart_ep_size = 0;         // EP size the failed instance came back with
    int max_online_decode = 0;
    int min_online_decode = 0;
    double device_hours = 0;         // prefill + decode + spare machines, all held
    double wait_p99_s = 0;           // arrival to decode start
    bool conservation_ok = false;
};

Result<OpsResult> run_ops_sim(const OpsSimSettings& settings);

}  // namespace dsi::sim
