// Autoscaler: how many prefill and decode instances to run (SPEC S-DEPLOY).
//
// Policy:
//  - Demand: prefill from the rate of cache-missed prompt tokens, decode from the number
//    of running requests, each divided by one instance's capacity and multiplied by a
//    headroom factor (always more instances online than computed demand).
//  - Bounds: the result is clamped to [min, max] per role.
//  - Rate limits: at most max_step_instances per decision, scale-out at most once per
//    scale_out_interval_ns and scale-in at most once per scale_in_interval_ns per role.
//  - Scale-in is forbidden while the role's quota utilisation is above 0.8.
//  - Spare pool: scale-out takes ready machines from the spare pool first; the decision
//    asks to provision new machines to refill the pool to spare_pool_target.
// No I/O; time comes in as now_ns. Thread model: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace dsi::cluster {

struct AutoscalerSettings {
    double prefill_missed_tokens_per_s_per_instance = 50'000;
    double decode_requests_per_instance = 64 * 64;  // EP64: ~64 running per rank
    double headroom = 1.2;
    int min_prefill = 1;
    int max_prefill = 64;
    int min_decode = 1;
    int max_decode = 64;
    int max_step_instances = 2;
    int64_t scale_out_interval_ns = 30'000'000'000;
    int64_t scale_in_interval_ns = 300'000'000'000;
    double scale_in_max_utilisation = 0.8;  // S-DEPLOY
    int spare_pool_target = 2;

    Status validate() const;
};

struct AutoscalerInput {
    double missed_tokens_per_s = 0;
    int64_t running_decode_requests = 0;
    int online_prefill = 0;
    int online_decode = 0;
    double prefill_quota_utilisation = 0;  // [0, 1]: used / available compute quota
    double decode_quota_utilisation = 0;
    int spare_ready_machines = 0;
};

struct RoleDecision {
    int target = 0;     // instances wanted after this decision
    int delta = 0;      // target - online
    int from_spare = 0; // of a positive delta, how many come from the spare pool
    bool blocked_by_utilisation = false;
    bool rate_limited = false;
};

struct ScaleDecision {
    RoleDecision prefill;
    RoleDecision decode;
    int provision_spares = 0;  // new machines to start so the pool returns to target
};

class Autoscaler {
public:
    // REQUIRES: settings.validate() is OK.
    explicit Autoscaler(const AutoscalerSettings& settings);
    ScaleDecision decide(const AutoscalerInput& in, int64_t now_ns);

    // Demand before rate limits and utilisation rules (exposed for tests and sim).
    int prefill_demand(double missed_tokens_per_s) const;
    int decode_demand(int64_t running_requests) const;

private:
    struct RoleClock {
        int64_t last_out_ns = INT64_MIN / 2;
        int64_t last_in_ns = INT64_MIN / 2;
    };
    RoleDecision decide_role(int demand, int online, double utilisation, int lo, int hi,
                             RoleClock& clock, int64_t now_ns) const;

    AutoscalerSettings settings_;
    RoleClock prefill_clock_;
    RoleClock decode_clock_;
};

}  // namespace dsi::cluster
