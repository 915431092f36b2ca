#include "sim/ops_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <numbers>

#include "base/env.h"
#include "cluster/ep_failover.h"

namespace dsi::sim {
namespace {

enum class InstState : uint8_t { kUp, kDraining, kRestarting, kGone };

struct OpsReq {
    double arrival_s = 0;
    int64_t input = 0;
    int64_t output = 0;
    int64_t decoded = 0;
    int64_t missed = 0;  // tokens prefill still has to compute
    int32_t instance = -1;
    int32_t finishes = 0;
    bool waited = false;
};

struct DecodeInstance {
    InstState state = InstState::kUp;
    int ep_size = 0;
    double ready_s = 0;  // restarting: when it is back
    std::vector<uint32_t> requests;
};

double percentile(std::vector<double> v, double p) {
    if (v.empty()) {
        return 0;
    }
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

Status OpsSimSettings::validate() const {
    DSI_RETURN_IF_ERROR(autoscaler.validate());
    DSI_RETURN_IF_ERROR(decode_lb.validate());
    if (!(duration_s > 0) || !(step_s > 0) || !(day_s > 0) || !(decision_interval_s >= step_s) ||
        duration_s / step_s > 1e8) {
        return invalid_argument("ops sim: durations must be > 0, decision interval >= step");
    }
    if (mean_rate_per_s < 0 || diurnal_amplitude < 0 || diurnal_amplitude > 1 || hit_rate < 0 ||
        hit_rate > 1 || mean_input_tokens < 1 || mean_output_tokens < 1) {
        return invalid_argument("ops sim: bad traffic settings");
    }
    if (!(prefill_tokens_per_s_per_instance > 0) || decode_devices_per_instance < 1 ||
        decode_requests_per_device < 1 || !(decode_tokens_per_s > 0) || provision_s < 0 ||
        restart_s < 0 || fail_devices < 0 || fail_devices > decode_devices_per_instance ||
        initial_prefill < 1 || initial_decode < 1 || initial_spare < 0) {
        return invalid_argument("ops sim: bad capacity or fleet settings");
    }
    return Status::ok();
}

Result<OpsResult> run_ops_sim(const OpsSimSettings& s) {
    DSI_RETURN_IF_ERROR(s.validate());
    OpsResult res;
    SplitMix64 rng(s.seed);
    cluster::Autoscaler autoscaler(s.autoscaler);
    cluster::DecodeDrain drain(s.drain);
    cluster::DecodeLb decode_lb(s.decode_lb);

    std::vector<OpsReq> reqs;
    std::deque<uint32_t> prefill_queue;  // FIFO of requests with missed tokens left
    std::deque<uint32_t> decode_pending;  // prefilled, waiting for a decode slot
    std::vector<DecodeInstance> inst(s.initial_decode);
    for (auto& d : inst) {
        d.ep_size = s.decode_devices_per_instance;
    }
    int online_prefill = s.initial_prefill;
    int spare = s.initial_spare;
    std::deque<double> provisioning;  // ready times of machines being provisioned
    int target_prefill = online_prefill;
    int target_decode = s.initial_decode;
    double arrivals_due = 0;
    double prefill_carry = 0;
    double missed_in_interval = 0;
    double prefill_done_in_interval = 0;
    double next_decision_s = 0;
    bool failed = false;
    bool conserved = true;
    int64_t running = 0;
    int64_t decoded_tokens = 0;
    int64_t moved_kv_check = 0;
    std::vector<double> waits;

    auto capacity = [&](const DecodeInstance& d) {
        return d.ep_size * s.decode_requests_per_device;
    };
    auto rank_states = [&]() {
        std::vector<cluster::DecodeRankState> ranks(inst.size());
        for (size_t i = 0; i < inst.size(); ++i) {
            ranks[i].max_requests = capacity(inst[i]);
            ranks[i].kv_capacity_tokens = INT64_MAX / 4;
            ranks[i].accepting = inst[i].state == InstState::kUp;
            ranks[i].num_requests = static_cast<int>(inst[i].requests.size());
            for (uint32_t r : inst[i].requests) {
                ranks[i].kv_tokens += reqs[r].input + reqs[r].decoded;
            }
        }
        return ranks;
    };
    // Re-route through prefill: the prompt is a store hit, the generated tokens are not.
    auto reroute = [&](uint32_t r) {
        reqs[r].instance = -1;
        reqs[r].missed = reqs[r].decoded;
        --running;
        ++res.rerouted_requests;
        prefill_queue.push_back(r);
    };

    const int64_t steps = static_cast<int64_t>(std::ceil(s.duration_s / s.step_s));
    for (int64_t step = 0; step < steps || running > 0 || !prefill_queue.empty() ||
                           !decode_pending.empty();
         ++step) {
        const double now = static_cast<double>(step) * s.step_s;
        if (step > steps + static_cast<int64_t>(1e6)) {
            return internal_error("ops sim: work did not drain");
        }
        const bool open = step < steps;
        const double rate =
            open ? s.mean_rate_per_s *
                       (1 - s.diurnal_amplitude * std::cos(2 * std::numbers::pi * now / s.day_s))
                 : 0.0;
        // Arrivals (deterministic lengths per seed).
        arrivals_due += rate * s.step_s;
        while (arrivals_due >= 1) {
            arrivals_due -= 1;
            OpsReq q;
            q.arrival_s = now;
            q.input = std::max<int64_t>(1, static_cast<int64_t>(s.mean_input_tokens *
                                                                (0.5 + rng.next_double())));
            q.output = std::max<int64_t>(1, static_cast<int64_t>(s.mean_output_tokens *
                                                                 (0.5 + rng.next_double())));
            q.missed = static_cast<int64_t>(static_cast<double>(q.input) * (1 - s.hit_rate));
            missed_in_interval += static_cast<double>(q.missed);
            reqs.push_back(q);
            prefill_queue.push_back(static_cast<uint32_t>(reqs.size() - 1));
            ++res.arrived;
        }
        // Machines being provisioned join the spare pool when ready.
        while (!provisioning.empty() && provisioning.front() <= now) {
            provisioning.pop_front();
            ++spare;
        }
        // S-DEPLOY: a failed device takes its whole EP instance down; it restarts with
        // EP size = healthy devices.
        if (!failed && s.fail_at_s >= 0 && now >= s.fail_at_s) {
            failed = true;
            for (size_t i = 0; i < inst.size(); ++i) {
                if (inst[i].state != InstState::kUp) {
                    continue;
                }
                std::vector<bool> healthy(inst[i].ep_size, true);
                for (int k = 0; k < s.fail_devices && k < inst[i].ep_size; ++k) {
                    healthy[k] = false;
                }
                ++res.failures;
                for (uint32_t r : inst[i].requests) {
                    reroute(r);
                }
                inst[i].requests.clear();
                auto plan = cluster::plan_ep_restart(healthy, s.num_logical_experts,
                                                     s.redundant_experts_per_rank, s.min_ep_size);
                if (plan.is_ok()) {
                    inst[i].state = InstState::kRestarting;
                    inst[i].ep_size = plan->ep_size;
                    inst[i].ready_s = now + s.restart_s;
                    res.restart_ep_size = plan->ep_size;
                } else {
                    inst[i].state = InstState::kGone;  // too small: quota redundancy carries it
                }
                break;
            }
        }
        for (auto& d : inst) {
            if (d.state == InstState::kRestarting && d.ready_s <= now) {
                d.state = InstState::kUp;
            }
        }
        // Drains whose grace period ended: one plan moves every request with its KV.
        for (int e : drain.due(static_cast<int64_t>(now * 1e9))) {
            std::vector<cluster::DecodeRequestView> views;
            for (uint32_t r : inst[e].requests) {
                views.push_back({r, reqs[r].input + reqs[r].decoded});
            }
            const cluster::DrainPlan plan = drain.plan(e, views, rank_states(), decode_lb);
            for (const cluster::Migration& m : plan.moves) {
                const uint32_t r = static_cast<uint32_t>(m.request_id);
                reqs[r].instance = m.to;
                inst[m.to].requests.push_back(r);
                ++res.migrated_requests;
                res.migrated_kv_tokens += m.kv_tokens;
                moved_kv_check += reqs[r].input + reqs[r].decoded;
            }
            for (uint64_t id : plan.unplaced) {
                reroute(static_cast<uint32_t>(id));
            }
            inst[e].requests.clear();
            inst[e].state = InstState::kGone;
            ++res.drains_completed;
        }
        // Prefill: a fluid FIFO queue of missed tokens over the online instances.
        double budget = prefill_carry + online_prefill * s.prefill_tokens_per_s_per_instance * s.step_s;
        const double offered = budget;
        while (!prefill_queue.empty() && static_cast<double>(reqs[prefill_queue.front()].missed) <= budget) {
            const uint32_t r = prefill_queue.front();
            prefill_queue.pop_front();
            budget -= static_cast<double>(reqs[r].missed);
            reqs[r].missed = 0;
            decode_pending.push_back(r);
        }
        if (!prefill_queue.empty()) {
            reqs[prefill_queue.front()].missed -= static_cast<int64_t>(budget);
            budget -= std::floor(budget);
        }
        prefill_done_in_interval += offered - budget;
        prefill_carry = prefill_queue.empty() ? 0.0 : budget;
        // Decode placement through DecodeLb.
        if (!decode_pending.empty()) {
            auto ranks = rank_states();
            while (!decode_pending.empty()) {
                const uint32_t r = decode_pending.front();
                auto d = decode_lb.choose(ranks, reqs[r].input + reqs[r].decoded,
                                          reqs[r].input + reqs[r].output);
                if (!d.is_ok()) {
                    break;
                }
                decode_pending.pop_front();
                ranks[*d].num_requests += 1;
                ranks[*d].kv_tokens += reqs[r].input + reqs[r].decoded;
                reqs[r].instance = *d;
                inst[*d].requests.push_back(r);
                ++running;
                if (!reqs[r].waited) {
                    reqs[r].waited = true;
                    waits.push_back(now - reqs[r].arrival_s);
                }
            }
        }
        // Decode progress.
        const int64_t per_step = std::max<int64_t>(1, std::llround(s.decode_tokens_per_s * s.step_s));
        for (auto& d : inst) {
            if (d.state != InstState::kUp && d.state != InstState::kDraining) {
                continue;
            }
            size_t keep = 0;
            for (uint32_t r : d.requests) {
                OpsReq& q = reqs[r];
                const int64_t n = std::min(per_step, q.output - q.decoded);
                q.decoded += n;
                decoded_tokens += n;
                if (q.decoded >= q.output) {
                    ++q.finishes;
                    ++res.finished;
                    --running;
                } else {
                    d.requests[keep++] = r;
                }
            }
            d.requests.resize(keep);
        }
        // Conservation every step: arrived = waiting + running + finished.
        int64_t held = 0;
        for (const auto& d : inst) {
            held += static_cast<int64_t>(d.requests.size());
        }
        conserved = conserved && held == running &&
                    res.arrived == static_cast<int64_t>(prefill_queue.size() + decode_pending.size()) +
                                       running + res.finished;
        // Scale decisions.
        if (now + 1e-9 >= next_decision_s) {
            next_decision_s += s.decision_interval_s;
            int up = 0;
            int restarting = 0;
            int draining = 0;
            int64_t cap = 0;
            for (const auto& d : inst) {
                up += d.state == InstState::kUp ? 1 : 0;
                restarting += d.state == InstState::kRestarting ? 1 : 0;
                draining += d.state == InstState::kDraining ? 1 : 0;
                cap += d.state == InstState::kUp ? capacity(d) : 0;
            }
            cluster::AutoscalerInput in;
            in.missed_tokens_per_s = missed_in_interval / s.decision_interval_s;
            in.running_decode_requests = running + static_cast<int64_t>(decode_pending.size());
            in.online_prefill = online_prefill;
            in.online_decode = up + restarting;
            const double prefill_cap =
                online_prefill * s.prefill_tokens_per_s_per_instance * s.decision_interval_s;
            in.prefill_quota_utilisation =
                prefill_cap > 0 ? std::min(1.0, prefill_done_in_interval / prefill_cap) : 1.0;
            in.decode_quota_utilisation = cap > 0 ? std::min(1.0, static_cast<double>(running) / cap)
                                                  : 1.0;
            in.spare_ready_machines = spare;
            const cluster::ScaleDecision dec = autoscaler.decide(in, static_cast<int64_t>(now * 1e9));
            missed_in_interval = 0;
            prefill_done_in_interval = 0;
            res.blocked_by_utilisation += (dec.prefill.blocked_by_utilisation ? 1 : 0) +
                                          (dec.decode.blocked_by_utilisation ? 1 : 0);
            target_prefill = dec.prefill.target;
            target_decode = dec.decode.target;
            // Scale-out only with ready machines (the spare pool); the rest is provisioned.
            if (dec.prefill.delta > 0 || dec.decode.delta > 0) {
                ++res.scale_out_decisions;
            }
            online_prefill += dec.prefill.from_spare;
            spare -= dec.prefill.from_spare;
            for (int k = 0; k < dec.decode.from_spare; ++k) {
                DecodeInstance d;
                d.ep_size = s.decode_devices_per_instance;
                inst.push_back(d);
                --spare;
            }
            if (dec.prefill.delta < 0 || dec.decode.delta < 0) {
                ++res.scale_in_decisions;
            }
            if (dec.prefill.delta < 0) {
                // Prefill holds no long-lived state: an instance stops after its step.
                online_prefill = std::max(1, online_prefill + dec.prefill.delta);
            }
            for (int k = 0; k < -dec.decode.delta; ++k) {
                // S-DEPLOY scale-in: drain the up instance with the fewest requests.
                int pick = -1;
                for (size_t i = 0; i < inst.size(); ++i) {
                    if (inst[i].state == InstState::kUp &&
                        (pick < 0 || inst[i].requests.size() < inst[pick].requests.size())) {
                        pick = static_cast<int>(i);
                    }
                }
                if (pick < 0 || up - k <= 1) {
                    break;
                }
                if (drain.start(pick, static_cast<int64_t>(now * 1e9)).is_ok()) {
                    inst[pick].state = InstState::kDraining;
                    ++res.drains_started;
                }
            }
            const int to_provision =
                dec.provision_spares - static_cast<int>(provisioning.size());
            for (int k = 0; k < to_provision; ++k) {
                provisioning.push_back(now + s.provision_s);
            }
            OpsPoint p;
            p.t_s = now;
            p.rate_per_s = rate;
            p.online_prefill = online_prefill;
            p.online_decode = up;
            p.target_prefill = target_prefill;
            p.target_decode = target_decode;
            p.spare = spare;
            p.draining = draining;
            p.restarting = restarting;
            p.running = running;
            p.waiting = static_cast<int64_t>(prefill_queue.size() + decode_pending.size());
            p.decode_utilisation = cap > 0 ? static_cast<double>(running) / cap : 0.0;
            res.timeline.push_back(p);
            if (open) {
                res.max_online_decode = std::max(res.max_online_decode, up);
                res.min_online_decode =
                    res.timeline.size() == 1 ? up : std::min(res.min_online_decode, up);
            }
        }
        // Every machine held costs: prefill, decode (any state but gone), spare, provisioning.
        int decode_machines = 0;
        for (const auto& d : inst) {
            decode_machines += d.state != InstState::kGone ? 1 : 0;
        }
        res.device_hours += static_cast<double>(online_prefill + decode_machines + spare +
                                                static_cast<int>(provisioning.size())) *
                            s.decode_devices_per_instance * s.step_s / 3600.0;
    }
    bool once = true;
    int64_t expected_tokens = 0;
    for (const OpsReq& q : reqs) {
        once = once && q.finishes == 1;
        expected_tokens += q.output;
    }
    res.wait_p99_s = percentile(std::move(waits), 0.99);
    res.conservation_ok = conserved && once && res.finished == res.arrived &&
                          decoded_tokens == expected_tokens &&
                          moved_kv_check == res.migrated_kv_tokens;
    return res;
}

}  // namespace dsi::sim
