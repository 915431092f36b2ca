// Operations inside the request-level simulation (SPEC S-DEPLOY): drains with KV
// migration, device failures with EP failover and re-routing, autoscaling. The policies
// are cluster::DecodeDrain, cluster::plan_ep_restart and cluster::Autoscaler; this file
// only applies their decisions to the simulated engines. See OperationsSettings.
#include <algorithm>

#include "cluster/ep_failover.h"
#include "sim/internal/sim_core.h"

namespace dsi::sim::internal {


void Sim::init_operations() {
    const OperationsSettings& op = c_.operations;
    drain_ = cluster::DecodeDrain({static_cast<int64_t>(op.drain_grace_s * 1e9)});
    auto at = [&](double s) { return t0_ns_ + static_cast<int64_t>(s * 1e9); };
    for (size_t k = 0; k < op.drains.size(); ++k) {
        push(at(op.drains[k].at_s), Ev::kDrainStart, static_cast<uint32_t>(k));
    }
    for (size_t k = 0; k < op.failures.size(); ++k) {
        push(at(op.failures[k].at_s), Ev::kFailure, static_cast<uint32_t>(k));
    }
    if (op.initial_prefill > 0) {
        for (int e = op.initial_prefill; e < c_.num_prefill; ++e) {
            prefill_[e].online = false;
            if (prefill_lb_) {
                prefill_lb_->set_engine_available(e, false);
            }
        }
    }
    if (op.initial_decode_instances > 0) {
        for (size_t i = op.initial_decode_instances; i < instances_.size(); ++i) {
            instances_[i].state = InstState::kOff;
            set_instance_accepting(static_cast<int>(i));
        }
    }
    spare_ = op.initial_spare;
    if (op.autoscale) {
        cluster::AutoscalerSettings a = op.autoscaler;
        a.max_prefill = std::min(a.max_prefill, c_.num_prefill);
        a.max_decode = std::min(a.max_decode, static_cast<int>(instances_.size()));
        a.min_prefill = std::min(a.min_prefill, a.max_prefill);
        a.min_decode = std::min(a.min_decode, a.max_decode);
        autoscaler_ = std::make_unique<cluster::Autoscaler>(a);
        last_tick_ns_ = t0_ns_;
        push(at(op.decision_interval_s), Ev::kScaleTick, 0);
    }
    device_ns_at_ = t0_ns_;
    note_online();
}

void Sim::on_operation(const Event& ev) {
    switch (ev.type) {
        case Ev::kDrainStart:
            start_drain(c_.operations.drains[ev.id].instance);
            break;
        case Ev::kDrainDue:
            on_drain_due(static_cast<int>(ev.id));
            break;
        case Ev::kFailure:
            on_failure(c_.operations.failures[ev.id]);
            break;
        case Ev::kRestart:
            on_restart(static_cast<int>(ev.id));
            break;
        case Ev::kMigrateArrive:
            on_migrate_arrive(ev.id);
            break;
        case Ev::kScaleTick:
            on_scale_tick();
            break;
        default:
            DSI_CHECK(false, "unknown simulator event");
    }
}

void Sim::set_instance_accepting(int instance) {
    const DecodeInstance& in = instances_[instance];
    for (int k = 0; k < decode_ep_; ++k) {
        ranks_[instance * decode_ep_ + k].accepting = in.state == InstState::kUp && k < in.ep;
    }
}

// Takes every request off rank d (running and joining), remembering how many tokens each
// still has to decode; the rank's counts go to zero.
std::vector<uint32_t> Sim::take_requests(int d) {
    DecodeEngine& de = decode_[d];
    std::vector<uint32_t> out;
    while (!de.finishing.empty()) {
        const auto [fin, r] = de.finishing.top();
        de.finishing.pop();
        reqs_[r].decode_left = fin - de.step;
        out.push_back(r);
    }
    out.insert(out.end(), de.planned.begin(), de.planned.end());
    out.insert(out.end(), de.joining.begin(), de.joining.end());
    std::sort(out.begin(), out.end());  // a deterministic order, independent of the heap
    de.planned.clear();
    de.joining.clear();
    de.running = 0;
    de.evacuate_after_step = false;
    ++de.epoch;
    ranks_[d].num_requests = 0;
    ranks_[d].kv_tokens = 0;
    return out;
}

// S-DEPLOY: request-level re-routing. The request prefills again with its prompt (a
// store hit where the store still has it) plus the tokens it generated (recomputed).
void Sim::reroute(uint32_t r) {
    Req& q = reqs_[r];
    q.context_tokens = kv_of(r);
    q.done_tokens = 0;
    q.decode_engine = -1;
    ++res_.rerouted_requests;
    route_prefill(r, /*reroute=*/true);
}

void Sim::start_drain(int instance) {
    DecodeInstance& in = instances_[instance];
    if (in.state != InstState::kUp) {
        return;  // already draining, down or off
    }
    account_devices();
    in.state = InstState::kDraining;
    for (int k = 0; k < in.ep; ++k) {
        (void)drain_.start(instance * decode_ep_ + k, now_);
    }
    set_instance_accepting(instance);
    push(now_ + static_cast<int64_t>(c_.operations.drain_grace_s * 1e9), Ev::kDrainDue,
         static_cast<uint32_t>(instance));
    note_online();
}

void Sim::on_drain_due(int instance) {
    DecodeInstance& in = instances_[instance];
    if (in.state != InstState::kDraining) {
        return;  // failed during the grace period; the failure ended the drain
    }
    account_devices();
    in.state = InstState::kOff;
    ++res_.drains_completed;
    for (int k = 0; k < in.ep; ++k) {
        const int d = instance * decode_ep_ + k;
        if (decode_[d].busy) {
            decode_[d].evacuate_after_step = true;  // moves after the step in flight
        } else {
            evacuate_for_drain(d);
        }
    }
    note_online();
}

// S-DEPLOY: after the grace period the rank's unfinished requests move, with their KV,
// to other decode ranks in one plan (cluster::DecodeDrain); unplaced ones re-route.
void Sim::evacuate_for_drain(int d) {
    const std::vector<uint32_t> reqs = take_requests(d);
    std::vector<cluster::DecodeRequestView> views;
    views.reserve(reqs.size());
    for (uint32_t r : reqs) {
        views.push_back({r, kv_of(r)});
    }
    const cluster::DrainPlan plan = drain_.plan(d, views, ranks_, decode_lb_);
    for (const cluster::Migration& m : plan.moves) {
        const uint32_t r = static_cast<uint32_t>(m.request_id);
        ranks_[m.to].num_requests += 1;
        ranks_[m.to].kv_tokens += m.kv_tokens;
        reqs_[r].decode_engine = m.to;
        reqs_[r].migrate_epoch = decode_[m.to].epoch;
        ++res_.migrated_requests;
        res_.migrated_kv_tokens += m.kv_tokens;
        const double transfer_ns =
            static_cast<double>(m.kv_tokens) * c_.kv_bytes_per_token / c_.p2d_bytes_per_s * 1e9;
        push(now_ + static_cast<int64_t>(transfer_ns), Ev::kMigrateArrive, r);
    }
    for (uint64_t id : plan.unplaced) {
        reroute(static_cast<uint32_t>(id));
    }
}

void Sim::on_migrate_arrive(uint32_t r) {
    const int d = reqs_[r].decode_engine;
    if (decode_[d].epoch != reqs_[r].migrate_epoch) {
        // The target lost its requests (failed or drained) while the KV was in transit:
        // its counts were reset, so the request waits for a slot like any other.
        decode_pending_.push_back(r);
        place_pending();
        return;
    }
    decode_[d].joining.push_back(r);
    if (!decode_[d].busy) {
        start_decode(d);
    }
}

// S-DEPLOY: one instance is one communication domain; a failed device takes it down.
void Sim::on_failure(const DeviceFailureAt& f) {
    DecodeInstance& in = instances_[f.instance];
    if (in.state == InstState::kDown || in.state == InstState::kOff) {
        return;  // nothing running there
    }
    account_devices();
    ++res_.failures;
    for (int k = 0; k < in.ep; ++k) {
        const int d = f.instance * decode_ep_ + k;
        if (drain_.is_draining(d)) {
            (void)drain_.plan(d, {}, ranks_, decode_lb_);  // ends the drain
        }
        DecodeEngine& de = decode_[d];
        if (de.busy) {
            de.stale_step = true;
            res_.lost_step_tokens += de.running;
        }
        for (uint32_t r : take_requests(d)) {
            reroute(r);
        }
    }
    std::vector<bool> healthy(in.ep, true);
    for (int k = 0; k < f.devices && k < in.ep; ++k) {
        healthy[k] = false;
    }
    auto plan = cluster::plan_ep_restart(healthy, c_.operations.num_logical_experts,
                                         c_.operations.redundant_experts_per_rank,
                                         c_.operations.min_ep_size);
    if (plan.is_ok()) {
        in.state = InstState::kDown;
        in.ep = plan->ep_size;  // S-DEPLOY: EP size = healthy devices
        push(now_ + static_cast<int64_t>(c_.operations.restart_s * 1e9), Ev::kRestart,
             static_cast<uint32_t>(f.instance));
    } else {
        in.state = InstState::kOff;  // too small to hold the experts: stays down
    }
    set_instance_accepting(f.instance);
    note_online();
}

void Sim::on_restart(int instance) {
    DecodeInstance& in = instances_[instance];
    if (in.state != InstState::kDown) {
        return;
    }
    account_devices();
    in.state = InstState::kUp;
    res_.restart_ep_sizes.push_back(in.ep);
    set_instance_accepting(instance);
    note_online();
    place_pending();
}

// Every device held costs: prefill engines (also while finishing their queue), decode
// ranks of instances that are up, draining or restarting, spare and provisioning machines
// (one machine = one decode instance's devices; an assumption).
int Sim::devices_held() const {
    int n = 0;
    for (const PrefillEngine& e : prefill_) {
        n += e.online || e.stopping ? 1 : 0;
    }
    for (const DecodeInstance& in : instances_) {
        n += in.state != InstState::kOff ? in.ep : 0;
    }
    return n + (spare_ + static_cast<int>(provisioning_.size())) * decode_ep_;
}

void Sim::account_devices() {
    device_ns_ += static_cast<double>(devices_held()) * static_cast<double>(now_ - device_ns_at_);
    device_ns_at_ = now_;
}

void Sim::note_online() {
    int prefill = 0;
    for (const PrefillEngine& e : prefill_) {
        prefill += e.online ? 1 : 0;
    }
    int decode = 0;
    for (const DecodeInstance& in : instances_) {
        decode += in.state == InstState::kUp ? 1 : 0;
    }
    const bool first = !online_noted_;
    online_noted_ = true;
    res_.min_online_prefill = first ? prefill : std::min(res_.min_online_prefill, prefill);
    res_.max_online_prefill = std::max(res_.max_online_prefill, prefill);
    res_.min_online_decode_instances =
        first ? decode : std::min(res_.min_online_decode_instances, decode);
    res_.max_online_decode_instances = std::max(res_.max_online_decode_instances, decode);
}

// S-DEPLOY autoscaling: prefill by cache-missed tokens, decode by running requests.
void Sim::on_scale_tick() {
    const OperationsSettings& op = c_.operations;
    account_devices();
    while (!provisioning_.empty() && provisioning_.front() <= now_) {
        provisioning_.pop_front();
        ++spare_;
    }
    const double interval_s = std::max(1e-9, static_cast<double>(now_ - last_tick_ns_) / 1e9);
    int online_prefill = 0;
    double prefill_busy_ns = 0;
    for (const PrefillEngine& e : prefill_) {
        online_prefill += e.online ? 1 : 0;
        prefill_busy_ns += e.busy_ns;
    }
    int up = 0;
    int restarting = 0;
    int64_t running = static_cast<int64_t>(decode_pending_.size());
    int64_t capacity = 0;
    for (size_t i = 0; i < instances_.size(); ++i) {
        const DecodeInstance& in = instances_[i];
        up += in.state == InstState::kUp ? 1 : 0;
        restarting += in.state == InstState::kDown ? 1 : 0;
        for (int k = 0; k < in.ep; ++k) {
            const int d = static_cast<int>(i) * decode_ep_ + k;
            running += ranks_[d].num_requests;
            capacity += in.state == InstState::kUp ? ranks_[d].max_requests : 0;
        }
    }
    cluster::AutoscalerInput in;
    in.missed_tokens_per_s = static_cast<double>(missed_tokens_since_tick_) / interval_s;
    in.running_decode_requests = running;
    in.online_prefill = online_prefill;
    in.online_decode = up + restarting;
    in.prefill_quota_utilisation =
        online_prefill > 0 ? std::min(1.0, (prefill_busy_ns - prefill_busy_at_tick_ns_) /
                                               (online_prefill * interval_s * 1e9))
                           : 1.0;
    in.decode_quota_utilisation =
        capacity > 0 ? std::min(1.0, static_cast<double>(running) / capacity) : 1.0;
    in.spare_ready_machines = spare_;
    const cluster::ScaleDecision dec = autoscaler_->decide(in, now_);
    missed_tokens_since_tick_ = 0;
    prefill_busy_at_tick_ns_ = prefill_busy_ns;
    last_tick_ns_ = now_;
    res_.scale_in_blocked_by_utilisation += (dec.prefill.blocked_by_utilisation ? 1 : 0) +
                                            (dec.decode.blocked_by_utilisation ? 1 : 0);
    res_.scale_out_decisions += dec.prefill.delta > 0 || dec.decode.delta > 0 ? 1 : 0;
    res_.scale_in_decisions += dec.prefill.delta < 0 || dec.decode.delta < 0 ? 1 : 0;
    // Scale-out takes ready machines only (the spare pool); the rest is provisioned.
    for (int k = 0, e = 0; k < dec.prefill.from_spare && e < c_.num_prefill; ++e) {
        PrefillEngine& pe = prefill_[e];
        if (!pe.online) {
            spare_ -= pe.stopping ? 0 : 1;  // a stopping engine is still here: keep it
            pe.online = true;
            pe.stopping = false;
            if (prefill_lb_) {
                prefill_lb_->set_engine_available(e, true);
            }
            ++k;
        }
    }
    for (int k = 0, i = 0; k < dec.decode.from_spare && i < static_cast<int>(instances_.size());
         ++i) {
        if (instances_[i].state == InstState::kOff) {
            instances_[i] = {InstState::kUp, decode_ep_};  // a new machine, full EP size
            set_instance_accepting(i);
            --spare_;
            ++k;
        }
    }
    // Prefill scale-in: the engine stops taking work and goes once its queue is done.
    for (int k = 0, e = c_.num_prefill - 1; k < -dec.prefill.delta && e >= 0; --e) {
        PrefillEngine& pe = prefill_[e];
        if (pe.online && online_prefill - k > 1) {
            pe.online = false;
            pe.stopping = pe.busy || !pe.queue.empty();
            if (prefill_lb_) {
                prefill_lb_->set_engine_available(e, false);
            }
            ++k;
        }
    }
    // S-DEPLOY decode scale-in: drain the up instance with the fewest requests.
    for (int k = 0; k < -dec.decode.delta && up - k > 1; ++k) {
        int pick = -1;
        int64_t fewest = 0;
        for (size_t i = 0; i < instances_.size(); ++i) {
            if (instances_[i].state != InstState::kUp) {
                continue;
            }
            int64_t n = 0;
            for (int j = 0; j < instances_[i].ep; ++j) {
                n += ranks_[static_cast<int>(i) * decode_ep_ + j].num_requests;
            }
            if (pick < 0 || n < fewest) {
                pick = static_cast<int>(i);
                fewest = n;
            }
        }
        if (pick < 0) {
            break;
        }
        start_drain(pick);
    }
    const int to_provision = dec.provision_spares - static_cast<int>(provisioning_.size());
    for (int k = 0; k < to_provision; ++k) {
        provisioning_.push_back(now_ + static_cast<int64_t>(op.provision_s * 1e9));
    }
    note_online();
    place_pending();
    for (size_t e = 0; e < prefill_.size(); ++e) {
        if (prefill_[e].online && !prefill_[e].busy) {
            try_start_prefill(static_cast<int>(e));
        }
    }
    // Ticks go on while requests are unfinished, but not forever when nothing else can
    // happen (e.g. no decode instance can ever come back): then the run ends unfinished
    // and the conservation check reports it.
    idle_ticks_ = events_.empty() ? idle_ticks_ + 1 : 0;
    const double idle_limit = 10 + (op.provision_s + op.restart_s) / op.decision_interval_s;
    if (num_finished_ < static_cast<int64_t>(reqs_.size()) && idle_ticks_ <= idle_limit) {
        push(now_ + static_cast<int64_t>(op.decision_interval_s * 1e9), Ev::kScaleTick, 0);
    }
}

}  // namespace dsi::sim::internal
