#include "cluster/autoscaler.h"

#include <algorithm>
#include <cmath>

namespace dsi::cluster {

Status AutoscalerSettings::validate() const {
    if (!(prefill_missed_tokens_per_s_per_instance > 0) || !(decode_requests_per_instance > 0)) {
        return invalid_argument("autoscaler: per-instance capacities must be > 0");
    }
    if (!(headroom >= 1.0)) {
        return invalid_argument("autoscaler: headroom must be >= 1");
    }
    if (min_prefill < 0 || min_decode < 0 || max_prefill < min_prefill ||
        max_decode < min_decode) {
        return invalid_argument("autoscaler: need 0 <= min <= max per role");
    }
    if (max_step_instances < 1 || scale_out_interval_ns < 0 || scale_in_interval_ns < 0) {
        return invalid_argument("autoscaler: bad rate limit");
    }
    if (!(scale_in_max_utilisation > 0 && scale_in_max_utilisation <= 1)) {
        return invalid_argument("autoscaler: scale_in_max_utilisation must be in (0, 1]");
    }
    if (spare_pool_target < 0) {
        return invalid_argument("autoscaler: spare_pool_target must be >= 0");
    }
    return Status::ok();
}

Autoscaler::Autoscaler(const AutoscalerSettings& settings) : settings_(settings) {
    DSI_CHECK(settings.validate().is_ok(), settings.validate().to_string());
}

int Autoscaler::prefill_demand(double missed_tokens_per_s) const {
    // S-DEPLOY: prefill scales by cache-missed tokens.
    const double n = std::max(0.0, missed_tokens_per_s) * settings_.headroom /
                     settings_.prefill_missed_tokens_per_s_per_instance;
    return static_cast<int>(std::min(1e9, std::ceil(n)));
}

int Autoscaler::decode_demand(int64_t running_requests) const {
    // S-DEPLOY: decode scales by running requests.
    const double n = static_cast<double>(std::max<int64_t>(0, running_requests)) *
                     settings_.headroom / settings_.decode_requests_per_instance;
    return static_cast<int>(std::min(1e9, std::ceil(n)));
}

RoleDecision Autoscaler::decide_role(int demand, int online, double utilisation, int lo, int hi,
                                     RoleClock& clock, int64_t now_ns) const {
    RoleDecision d;
    const int want = std::clamp(demand, lo, hi);
    d.target = online;
    if (want > online) {
        if (now_ns - clock.last_out_ns < settings_.scale_out_interval_ns && online >= lo) {
            d.rate_limited = true;
            return d;
        }
        d.target = std::min(want, online + settings_.max_step_instances);
        if (online < lo) {
            d.target = std::max(d.target, lo);  // below the floor: restore at once
        }
        clock.last_out_ns = now_ns;
    } else if (want < online) {
        // S-DEPLOY: never scale in while quota utilisation > 0.8.
        if (utilisation > settings_.scale_in_max_utilisation && online <= hi) {
            d.blocked_by_utilisation = true;
            return d;
        }
        if (now_ns - clock.last_in_ns < settings_.scale_in_interval_ns && online <= hi) {
            d.rate_limited = true;
            return d;
        }
        d.target = std::max(want, online - settings_.max_step_instances);
        if (online > hi) {
            d.target = std::min(d.target, hi);  // above the ceiling: cut at once
        }
        clock.last_in_ns = now_ns;
    }
    d.delta = d.target - online;
    return d;
}

ScaleDecision Autoscaler::decide(const AutoscalerInput& in, int64_t now_ns) {
    ScaleDecision s;
    s.prefill = decide_role(prefill_demand(in.missed_tokens_per_s), in.online_prefill,
                            in.prefill_quota_utilisation, settings_.min_prefill,
                            settings_.max_prefill, prefill_clock_, now_ns);
    s.decode = decide_role(decode_demand(in.running_decode_requests), in.online_decode,
                           in.decode_quota_utilisation, settings_.min_decode,
                           settings_.max_decode, decode_clock_, now_ns);
    // S-DEPLOY: spare quota as idle ready machines; scale-out draws on them first.
    int spare = std::max(0, in.spare_ready_machines);
    for (RoleDecision* r : {&s.prefill, &s.decode}) {
        if (r->delta > 0) {
            r->from_spare = std::min(spare, r->delta);
            spare -= r->from_spare;
        }
    }
    const int still_needed = std::max(0, s.prefill.delta - s.prefill.from_spare) +
                             std::max(0, s.decode.delta - s.decode.from_spare);
    s.provision_spares = still_needed + std::max(0, settings_.spare_pool_target - spare);
    return s;
}

}  // namespace dsi::cluster
