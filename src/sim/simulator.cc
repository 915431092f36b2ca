#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <queue>

#include "sim/block_id_cache.h"
#include "sim/internal/sim_core.h"

namespace dsi::sim {
namespace {

// S-KV-10: the hit never exceeds L - 134 and is a multiple of 128 tokens.
constexpr int64_t kSwaReserveTokens = 134;
constexpr int64_t kKvBlockTokens = 128;

// Ideal per-request work on a perfectly balanced, fully batched cluster.
double ideal_prefill_ns(const ClusterDescription& c, const cluster::PrefillLbSettings& lb,
                        int64_t input, int64_t hit) {
    const double w = c.prefill_time_cost.value_or(c.prefill_cost).cost_ns(input - hit, hit);
    int b = cluster::kNumPrefillBuckets - 1;
    for (int i = 0; i < cluster::kNumPrefillBuckets - 1; ++i) {
        if (input < lb.bucket_upper_tokens[i]) {
            b = i;
            break;
        }
    }
    // The step overhead, amortised over full steps.
    return w * (1.0 + c.prefill_step_overhead_ns / lb.bucket_quota_ns[b]);
}

double ideal_decode_ns(const ClusterDescription& c, int64_t input, int64_t output) {
    const double n = static_cast<double>(std::max<int64_t>(0, output - 1));
    return n * (c.decode_base_ns / c.decode_max_batch + c.decode_per_request_ns +
                c.decode_per_kv_token_ns * input) +
           c.decode_per_kv_token_ns * n * (n - 1) / 2;
}

// The shortest time one request can spend in decode: batch of one.
double min_decode_latency_ns(const ClusterDescription& c, int64_t input, int64_t output) {
    const double n = static_cast<double>(std::max<int64_t>(0, output - 1));
    return n * (c.decode_base_ns + c.decode_per_request_ns + c.decode_per_kv_token_ns * input) +
           c.decode_per_kv_token_ns * n * (n - 1) / 2;
}


Distribution distribution(std::vector<double> v) {
    Distribution d;
    if (v.empty()) {
        return d;
    }
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (double x : v) {
        sum += x;
    }
    auto pct = [&](double p) {
        return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
    };
    d.mean = sum / v.size();
    d.p50 = pct(0.5);
    d.p90 = pct(0.9);
    d.p99 = pct(0.99);
    d.max = v.back();
    return d;
}


}  // namespace

namespace internal {


int64_t Sim::hit_tokens_for(const workload::TraceRequest& tr, int64_t matched_blocks) const {
    // S-KV-10: hit <= L - 134, rounded down to whole 128-token blocks.
    int64_t hit = std::min<int64_t>(matched_blocks * trace_.block_tokens,
                                    tr.input_tokens - kSwaReserveTokens);
    hit = hit / kKvBlockTokens * kKvBlockTokens;
    return std::max<int64_t>(0, hit);
}

void Sim::on_arrival(uint32_t r) {
    const workload::TraceRequest& tr = trace_.requests[r];
    Req& q = reqs_[r];
    q.arrival_ns = now_;
    q.context_tokens = tr.input_tokens;
    q.decode_left = std::max<int64_t>(0, tr.output_tokens - 1);
    res_.bucket_requests[bucket_of(tr.input_tokens)]++;
    route_prefill(r, /*reroute=*/false);
}

void Sim::route_prefill(uint32_t r, bool reroute) {
    const workload::TraceRequest& tr = trace_.requests[r];
    Req& q = reqs_[r];
    const auto chain = trace_.blocks_of(tr);
    int engine = -1;
    // S-KV-4: the hit length is known before routing (metadata-only match).
    if (o_.store == StoreKind::kShared) {
        q.hit_tokens = hit_tokens_for(tr, shared_store_->match(chain, now_));
    }
    switch (o_.prefill_routing) {
        case PrefillRouting::kDeepSeek:
            break;
        case PrefillRouting::kRoundRobin:
            do {
                engine = static_cast<int>(rr_prefill_++ % prefill_.size());
            } while (!prefill_[engine].online);
            break;
        case PrefillRouting::kLeastLoaded:
            for (int e = 0; e < c_.num_prefill; ++e) {
                if (prefill_[e].online &&
                    (engine < 0 || prefill_[e].queued_tokens < prefill_[engine].queued_tokens)) {
                    engine = e;
                }
            }
            break;
        case PrefillRouting::kPrefixAffinity: {
            // Public KV-aware routers: cost = tokens to compute here + w x queued tokens.
            double best = 0;
            for (int e = 0; e < c_.num_prefill; ++e) {
                if (!prefill_[e].online) {
                    continue;
                }
                const int64_t hit =
                    o_.store == StoreKind::kShared
                        ? q.hit_tokens
                        : hit_tokens_for(tr, prefill_[e].store->peek(chain, now_));
                const double score = static_cast<double>(q.context_tokens - hit) +
                                     o_.affinity_load_weight * prefill_[e].queued_tokens;
                if (engine < 0 || score < best) {
                    engine = e;
                    best = score;
                }
            }
            break;
        }
    }
    // Operations keep at least one prefill engine online (autoscaler floor >= 1).
    DSI_CHECK(engine >= 0 || o_.prefill_routing == PrefillRouting::kDeepSeek, "no prefill engine");
    if (o_.store == StoreKind::kPerEngine) {
        q.hit_tokens = hit_tokens_for(tr, prefill_[engine].store->match(chain, now_));
    }
    const int64_t miss = q.context_tokens - q.hit_tokens;
    missed_tokens_since_tick_ += miss;
    if (reroute) {
        res_.rerouted_context_tokens += q.context_tokens;
        res_.rerouted_hit_tokens += q.hit_tokens;
    } else {
        q.first_hit_tokens = q.hit_tokens;
        res_.hit_tokens += q.hit_tokens;
    }
    q.cost_ns = c_.prefill_lb_cost.value_or(c_.prefill_cost).cost_ns(miss, q.hit_tokens);
    q.ready_ns = now_ + static_cast<int64_t>(q.hit_tokens * c_.kv_bytes_per_token /
                                             c_.store_read_bytes_per_s * 1e9);
    if (prefill_lb_) {
        prefill_lb_->tick(now_);
        prefill_lb_->submit({r, q.context_tokens, q.cost_ns, now_});
        // Idle engines pull; start from a rotating engine so no engine is favoured.
        for (size_t k = 0; k < prefill_.size() && prefill_lb_->num_pending() > 0; ++k) {
            const int e = static_cast<int>((wake_from_ + k) % prefill_.size());
            if (!prefill_[e].busy) {
                try_start_prefill(e);
            }
        }
        ++wake_from_;
        return;
    }
    PrefillEngine& pe = prefill_[engine];
    q.prefill_engine = engine;
    q.at_engine_ns = now_ + static_cast<int64_t>(c_.prefill_dispatch_ns);
    pe.queue.push_back(r);
    pe.held_cost_ns += q.cost_ns;
    pe.queued_tokens += miss;
    if (!pe.busy) {
        try_start_prefill(engine);
    }
}

void Sim::try_start_prefill(int e) {
    PrefillEngine& pe = prefill_[e];
    if (pe.busy) {
        return;
    }
    if (prefill_lb_) {
        // S-LB: the engine pulls by its remaining compute quota.
        for (const cluster::PrefillWork& w : prefill_lb_->pull(e, pe.held_cost_ns)) {
            const uint32_t r = static_cast<uint32_t>(w.id);
            reqs_[r].prefill_engine = e;
            reqs_[r].at_engine_ns = now_ + static_cast<int64_t>(c_.prefill_dispatch_ns);
            pe.queue.push_back(r);
            pe.held_cost_ns += w.cost_ns;
            pe.queued_tokens += reqs_[r].context_tokens - reqs_[r].hit_tokens;
        }
    }
    if (pe.queue.empty()) {
        return;
    }
    if (const int64_t at = reqs_[pe.queue.front()].at_engine_ns; at > now_) {
        // The router's hop (prefill_dispatch_ns): the engine waits for the request.
        if (!pe.wake_pending) {
            pe.wake_pending = true;
            push(at, Ev::kPrefillWake, static_cast<uint32_t>(e));
        }
        return;
    }
    // S-LB: the step's time budget is the bucket's quota; each chunk is the largest the
    // cost model fits into what is left of it, FIFO.
    const double budget =
        o_.prefill_lb.bucket_quota_ns[bucket_of(reqs_[pe.queue.front()].context_tokens)];
    double left = budget;
    double total = 0;
    pe.step.clear();
    for (uint32_t r : pe.queue) {
        const Req& q = reqs_[r];
        if (q.at_engine_ns > now_) {
            break;  // not at the engine yet: the next step takes it (FIFO)
        }
        const int64_t c = q.hit_tokens + q.done_tokens;
        const int64_t remaining = q.context_tokens - c;
        int64_t n = c_.prefill_cost.max_chunk_tokens(left, c, remaining);
        if (n == 0) {
            if (!pe.step.empty()) {
                break;
            }
            n = std::min<int64_t>(remaining, kKvBlockTokens);  // always make progress
        }
        const double cost = c_.prefill_cost.cost_ns(n, c);
        pe.step.push_back({r, n});
        left -= cost;
        total += c_.prefill_time_cost ? c_.prefill_time_cost->cost_ns(n, c) : cost;
        if (n < remaining || left <= 0) {
            break;
        }
    }
    // The chunks are sized by prefill_cost (as the engines size them) and take
    // prefill_time_cost's time when there is one (a fit to live steps, sim/step_fit.h).
    const double duration = c_.prefill_step_overhead_ns + total;
    pe.busy = true;
    pe.busy_ns += duration;
    if (o_.timeline_bin_ns > 0) {
        add_busy(prefill_busy_bins_, now_, duration);
    }
    push(now_ + static_cast<int64_t>(std::ceil(duration)), Ev::kPrefillDone, e);
}

void Sim::on_prefill_done(int e) {
    PrefillEngine& pe = prefill_[e];
    pe.busy = false;
    for (const Chunk& ch : pe.step) {
        Req& q = reqs_[ch.req];
        const workload::TraceRequest& tr = trace_.requests[ch.req];
        q.done_tokens += ch.q;
        res_.computed_tokens += ch.q;
        pe.queued_tokens -= ch.q;
        if (q.hit_tokens + q.done_tokens < q.context_tokens) {
            continue;
        }
        DSI_CHECK(pe.queue.front() == ch.req, "prefill FIFO order broken");
        pe.queue.pop_front();
        // The KV hand-over: the prompt's KV at p2d_bytes_per_s; with
        // decode_join_recompute_block B, its full blocks only (the join recomputes the rest).
        const int64_t b = c_.decode_join_recompute_block;
        const int64_t sent_tokens =
            b > 0 ? q.context_tokens - q.context_tokens % b : q.context_tokens;
        const double transfer_ns =
            static_cast<double>(sent_tokens) * c_.kv_bytes_per_token / c_.p2d_bytes_per_s * 1e9;
        if (c_.prefill_release_ns > 0) {
            // The router releases the quota when the engine's part ends: after the
            // hand-over's Ack.
            ++pe.pending_releases;
            releases_.emplace_back(e, q.cost_ns);
            push(now_ + static_cast<int64_t>(transfer_ns + c_.prefill_release_ns),
                 Ev::kPrefillRelease, static_cast<uint32_t>(releases_.size() - 1));
        } else {
            pe.held_cost_ns =
                pe.queue.empty() && pe.pending_releases == 0 ? 0.0 : pe.held_cost_ns - q.cost_ns;
        }
        q.prefill_done_ns = now_;
        // The first token comes out of prefill; the store read overlapped the queueing. A
        // re-routed request's first token came out long ago.
        const int64_t out_ns = std::max(now_, q.ready_ns);
        if (q.first_token_ns < 0) {
            q.first_token_ns = out_ns;
        }
        // S-KV-7 analogue: the prompt's blocks are written to the store.
        BlockIdCache* store = shared_store_ ? shared_store_.get() : pe.store.get();
        store->insert(trace_.blocks_of(tr), now_);
        res_.kv_moved_tokens += q.context_tokens;
        push(out_ns + static_cast<int64_t>(transfer_ns + c_.p2d_latency_ns), Ev::kDecodeArrive,
             ch.req);
    }
    pe.step.clear();
    if (pe.stopping && pe.queue.empty()) {
        account_devices();
        pe.stopping = false;  // scaled in: its queue is done, the machine goes
    }
    if (prefill_lb_) {
        prefill_lb_->tick(now_);
    }
    try_start_prefill(e);
}

void Sim::on_prefill_release(uint32_t release) {
    const auto [e, cost_ns] = releases_[release];
    PrefillEngine& pe = prefill_[e];
    --pe.pending_releases;
    pe.held_cost_ns =
        pe.queue.empty() && pe.pending_releases == 0 ? 0.0 : pe.held_cost_ns - cost_ns;
    if (prefill_lb_) {
        prefill_lb_->tick(now_);
    }
    try_start_prefill(e);
}

bool Sim::place_decode(uint32_t r) {
    const workload::TraceRequest& tr = trace_.requests[r];
    const int64_t reserve = static_cast<int64_t>(tr.input_tokens) + tr.output_tokens;
    const int64_t kv = kv_of(r);
    Result<int> d = resource_exhausted("");
    switch (o_.decode_routing) {
        case DecodeRouting::kDeepSeek:
            d = decode_lb_.choose(ranks_, kv, reserve);
            break;
        case DecodeRouting::kRoundRobin:
            d = decode_rr_.choose(ranks_, reserve);
            break;
        case DecodeRouting::kLeastLoaded:
            d = cluster::decode_choose_least_loaded(ranks_, reserve);
            break;
    }
    if (!d.is_ok()) {
        return false;
    }
    reqs_[r].decode_engine = *d;
    ranks_[*d].num_requests += 1;
    ranks_[*d].kv_tokens += kv;
    decode_[*d].joining.push_back(r);
    if (!decode_[*d].busy) {
        start_decode(*d);
    }
    return true;
}

void Sim::on_decode_arrive(uint32_t r) {
    if (reqs_[r].decode_arrive_ns < 0) {
        reqs_[r].decode_arrive_ns = now_;
    }
    if (trace_.requests[r].output_tokens <= 1) {
        finish(r);  // prefill produced the only token
        return;
    }
    if (!decode_pending_.empty() || !place_decode(r)) {
        decode_pending_.push_back(r);
    }
}

void Sim::start_decode(int d, bool after_step) {
    DecodeEngine& de = decode_[d];
    // Who joins this step: every arrival, or with decode_async_join after a step those in
    // its plan (arrived before the step that just ended began); the rest join the next.
    std::vector<uint32_t> join;
    if (c_.decode_async_join && after_step && (!de.planned.empty() || de.running > 0)) {
        join.swap(de.planned);
        de.planned.swap(de.joining);
    } else {
        join.swap(de.planned);
        join.insert(join.end(), de.joining.begin(), de.joining.end());
    }
    de.joining.clear();
    double join_ns = 0;  // the joining requests' partial last blocks (decode_join_recompute_block)
    de.step_joined.clear();
    for (uint32_t r : join) {
        if (reqs_[r].second_token_ns < 0) de.step_joined.push_back(r);
        de.finishing.push({de.step + reqs_[r].decode_left, r});
        ++de.running;
        if (const int64_t b = c_.decode_join_recompute_block; b > 0) {
            const int64_t input = trace_.requests[r].input_tokens;
            const int64_t q = input % b;
            if (q > 0) join_ns += c_.prefill_cost.cost_ns(q, input - q);
        }
    }
    if (de.running == 0) {
        return;
    }
    const double duration = c_.decode_base_ns + c_.decode_per_request_ns * de.running +
                            c_.decode_per_kv_token_ns * ranks_[d].kv_tokens + join_ns;
    de.busy = true;
    de.busy_ns += duration;
    de.step_start_ns = now_;
    de.step_join_ns = join_ns;
    de.step_kv_tokens = ranks_[d].kv_tokens;
    if (o_.timeline_bin_ns > 0) {
        add_busy(decode_busy_bins_, now_, duration);
    }
    push(now_ + static_cast<int64_t>(std::ceil(duration)), Ev::kDecodeDone, d);
}

void Sim::on_decode_done(int d) {
    DecodeEngine& de = decode_[d];
    de.busy = false;
    if (de.stale_step) {
        // The step was in flight when the instance failed: nothing came out of it.
        de.stale_step = false;
        if (rank_active(d)) {
            start_decode(d);
        }
        return;
    }
    if (o_.keep_records) {
        res_.decode_steps.push_back({d, de.step_start_ns - t0_ns_, now_ - t0_ns_, de.running,
                                     static_cast<int64_t>(de.step_joined.size()),
                                     de.step_kv_tokens, de.step_join_ns});
    }
    for (uint32_t r : de.step_joined) {
        if (reqs_[r].second_token_ns < 0) reqs_[r].second_token_ns = now_;
    }
    de.step_joined.clear();
    ++de.step;
    ranks_[d].kv_tokens += de.running;  // every running request gained one token
    res_.decoded_tokens += de.running;
    while (!de.finishing.empty() && de.finishing.top().first <= de.step) {
        const uint32_t r = de.finishing.top().second;
        de.finishing.pop();
        const workload::TraceRequest& tr = trace_.requests[r];
        --de.running;
        ranks_[d].num_requests -= 1;
        ranks_[d].kv_tokens -= static_cast<int64_t>(tr.input_tokens) + tr.output_tokens - 1;
        finish(r);
    }
    if (de.evacuate_after_step) {
        evacuate_for_drain(d);
    }
    place_pending();
    if (!de.busy) {
        start_decode(d, /*after_step=*/true);
    }
}

void Sim::place_pending() {
    while (!decode_pending_.empty() && place_decode(decode_pending_.front())) {
        decode_pending_.pop_front();
    }
}

SimResult Sim::run() {
    const auto& trs = trace_.requests;
    // Arrivals are pushed lazily, one ahead, so the heap stays small.
    size_t next_arrival = 0;
    auto arrival_ns = [&](size_t i) {
        return static_cast<int64_t>(static_cast<double>(trs[i].arrival_ns) * time_scale_);
    };
    if (!trs.empty()) {
        push(arrival_ns(0), Ev::kArrival, 0);
        next_arrival = 1;
        t0_ns_ = arrival_ns(0);
    }
    if (c_.operations.enabled()) {
        init_operations();
    }
    while (!events_.empty()) {
        const Event ev = events_.top();
        events_.pop();
        now_ = ev.t_ns;
        ++res_.events;
        if (o_.timeline_bin_ns > 0) {
            sample_waiting();
        }
        switch (ev.type) {
            case Ev::kArrival:
                if (next_arrival < trs.size()) {
                    push(arrival_ns(next_arrival), Ev::kArrival,
                         static_cast<uint32_t>(next_arrival));
                    ++next_arrival;
                }
                on_arrival(ev.id);
                break;
            case Ev::kPrefillDone:
                on_prefill_done(static_cast<int>(ev.id));
                break;
            case Ev::kDecodeArrive:
                on_decode_arrive(ev.id);
                break;
            case Ev::kDecodeDone:
                on_decode_done(static_cast<int>(ev.id));
                break;
            case Ev::kPrefillWake:
                prefill_[ev.id].wake_pending = false;
                try_start_prefill(static_cast<int>(ev.id));
                break;
            case Ev::kPrefillRelease:
                on_prefill_release(ev.id);
                break;
            default:
                on_operation(ev);
                break;
        }
    }
    summarize();
    return res_;
}

void Sim::summarize() {
    const auto& trs = trace_.requests;
    const size_t n = trs.size();
    const int64_t t0 = reqs_.empty() ? 0 : reqs_[0].arrival_ns;
    int64_t end = t0;
    int64_t prefill_end = t0;
    std::vector<double> ttft;
    std::vector<double> tpot;
    std::array<std::vector<double>, cluster::kNumPrefillBuckets> bucket_ttft;
    ttft.reserve(n);
    int64_t output_tokens = 0;
    int64_t slo_met = 0;
    bool once = true;
    for (size_t i = 0; i < n; ++i) {
        const Req& q = reqs_[i];
        const workload::TraceRequest& tr = trs[i];
        once = once && q.finishes == 1;
        end = std::max(end, q.finish_ns);
        prefill_end = std::max(prefill_end, q.prefill_done_ns);
        ttft.push_back((q.first_token_ns - q.arrival_ns) / 1e6);
        bucket_ttft[bucket_of(tr.input_tokens)].push_back(ttft.back());
        bool met = ttft.back() <= o_.slo_ttft_ms;
        if (tr.output_tokens >= 2) {
            tpot.push_back((q.finish_ns - q.first_token_ns) / 1e6 / (tr.output_tokens - 1));
            res_.expected_decode_tokens += tr.output_tokens - 1;
            met = met && tpot.back() <= o_.slo_tpot_ms;
        }
        slo_met += (met && q.finishes == 1) ? 1 : 0;
        if (o_.keep_records) {
            auto rel = [&](int64_t t) { return t < 0 ? int64_t{-1} : t - t0_ns_; };
            res_.requests.push_back({static_cast<int64_t>(i), tr.input_tokens, tr.output_tokens,
                                     q.first_hit_tokens, rel(q.arrival_ns),
                                     rel(q.first_token_ns), rel(q.decode_arrive_ns),
                                     rel(q.second_token_ns), rel(q.finish_ns), q.prefill_engine,
                                     q.decode_engine});
        }
        res_.input_tokens += tr.input_tokens;
        output_tokens += tr.output_tokens;
    }
    res_.num_finished = num_finished_;
    const double span_ns = std::max<double>(1.0, static_cast<double>(end - t0));
    res_.makespan_s = span_ns / 1e9;
    res_.slo_attainment = n > 0 ? static_cast<double>(slo_met) / static_cast<double>(n) : 0.0;
    res_.goodput_requests_per_s = static_cast<double>(slo_met) / res_.makespan_s;
    res_.ttft_ms = distribution(std::move(ttft));
    for (int b = 0; b < cluster::kNumPrefillBuckets; ++b) {
        res_.bucket_ttft_ms[b] = distribution(std::move(bucket_ttft[b]));
    }
    res_.tpot_ms = distribution(std::move(tpot));
    res_.input_tokens_per_s = res_.input_tokens / res_.makespan_s;
    res_.output_tokens_per_s = output_tokens / res_.makespan_s;
    res_.hit_rate = res_.input_tokens > 0 ? static_cast<double>(res_.hit_tokens) / res_.input_tokens
                                          : 0.0;
    for (const auto& e : prefill_) {
        res_.prefill_utilisation.push_back(e.busy_ns / span_ns);
    }
    for (const auto& d : decode_) {
        res_.decode_utilisation.push_back(d.busy_ns / span_ns);
    }
    // LB efficiency: ideal makespan over the achieved one, honouring arrival times, with
    // the same hits as this run. The ideal is a lower bound: the larger of a fluid,
    // perfectly balanced, fully batched cluster and each request's own minimum latency.
    const double np = c_.num_prefill;
    const double nd = c_.num_decode;
    double fluid_p = static_cast<double>(t0);
    double prefill_bound = static_cast<double>(t0);
    std::vector<std::pair<double, size_t>> ideal_at_decode(n);
    std::vector<std::pair<double, size_t>> real_at_decode(n);
    for (size_t i = 0; i < n; ++i) {
        const workload::TraceRequest& tr = trs[i];
        const double a = static_cast<double>(reqs_[i].arrival_ns);
        const double w =
            ideal_prefill_ns(c_, o_.prefill_lb, tr.input_tokens, reqs_[i].first_hit_tokens);
        fluid_p = std::max(fluid_p, a) + w / np;
        // A request is not split across engines (no context parallelism, S-DEPLOY), so it
        // takes at least its own compute time on one engine.
        prefill_bound = std::max(prefill_bound, a + w);
        const double transfer = tr.input_tokens * c_.kv_bytes_per_token / c_.p2d_bytes_per_s * 1e9;
        ideal_at_decode[i] = {std::max(fluid_p, a + w) + transfer, i};
        real_at_decode[i] = {static_cast<double>(reqs_[i].decode_arrive_ns), i};
    }
    auto fluid_decode = [&](std::vector<std::pair<double, size_t>>& at) {
        std::sort(at.begin(), at.end());
        double fluid = static_cast<double>(t0);
        double bound = static_cast<double>(t0);
        for (const auto& [a, i] : at) {
            const workload::TraceRequest& tr = trs[i];
            fluid = std::max(fluid, a) + ideal_decode_ns(c_, tr.input_tokens, tr.output_tokens) / nd;
            bound = std::max(bound, a + min_decode_latency_ns(c_, tr.input_tokens, tr.output_tokens));
        }
        return std::max(fluid, bound);
    };
    res_.prefill_lb_efficiency =
        (std::max(fluid_p, prefill_bound) - t0) /
        std::max<double>(1.0, static_cast<double>(prefill_end - t0));
    res_.decode_lb_efficiency = (fluid_decode(real_at_decode) - t0) / span_ns;
    res_.lb_efficiency = (fluid_decode(ideal_at_decode) - t0) / span_ns;
    double device_hours = (np + nd) * span_ns / 3.6e12;
    if (c_.operations.enabled()) {
        now_ = end;
        account_devices();
        device_hours = device_ns_ / 3.6e12;
    }
    res_.device_hours = device_hours;
    const double total_tokens = static_cast<double>(res_.input_tokens + output_tokens);
    res_.cost_per_million_tokens =
        total_tokens > 0 ? device_hours * c_.price_per_device_hour / (total_tokens / 1e6) : 0.0;
    if (prefill_lb_) {
        res_.prefill_reassignments = prefill_lb_->num_reassignments();
    }
    if (o_.timeline_bin_ns > 0) {
        const size_t bins = std::max(prefill_busy_bins_.size(), decode_busy_bins_.size());
        prefill_busy_bins_.resize(bins, 0.0);
        decode_busy_bins_.resize(bins, 0.0);
        waiting_.resize(bins, -1);
        const double bin = static_cast<double>(o_.timeline_bin_ns);
        int64_t last_waiting = 0;
        for (size_t i = 0; i < bins; ++i) {
            last_waiting = waiting_[i] >= 0 ? waiting_[i] : last_waiting;
            res_.timeline.push_back({(static_cast<double>(i) * bin - t0) / 1e9,
                                     prefill_busy_bins_[i] / (bin * np),
                                     decode_busy_bins_[i] / (bin * nd), last_waiting});
        }
    }
    // Re-routed requests prefill their context again: tokens into prefill = prompts + the
    // re-routed contexts; the decode ranks end empty (every request's KV left with it).
    bool ranks_empty = decode_pending_.empty();
    for (const auto& rk : ranks_) {
        ranks_empty = ranks_empty && rk.num_requests == 0 && rk.kv_tokens == 0;
    }
    const int64_t prefill_in = res_.input_tokens + res_.rerouted_context_tokens;
    res_.conservation_ok =
        once && ranks_empty && res_.num_finished == static_cast<int64_t>(n) &&
        res_.hit_tokens + res_.rerouted_hit_tokens + res_.computed_tokens == prefill_in &&
        res_.decoded_tokens == res_.expected_decode_tokens && res_.kv_moved_tokens == prefill_in;
}

}  // namespace internal

Result<SimResult> simulate(const workload::Trace& trace, const ClusterDescription& cluster_desc,
                           const SimOptions& options) {
    DSI_RETURN_IF_ERROR(cluster_desc.validate());
    DSI_RETURN_IF_ERROR(options.prefill_lb.validate());
    DSI_RETURN_IF_ERROR(options.decode_lb.validate());
    if (trace.requests.empty()) {
        return invalid_argument("simulate: empty trace");
    }
    if (trace.requests.size() >= 0xffffffffu) {
        return invalid_argument("simulate: too many requests");
    }
    if (options.prefill_routing == PrefillRouting::kDeepSeek && options.store != StoreKind::kShared) {
        return invalid_argument("simulate: the DeepSeek prefill LB assumes a shared KV store");
    }
    if (!(options.time_scale > 0) || options.target_load < 0) {
        return invalid_argument("simulate: time_scale must be > 0 and target_load >= 0");
    }
    if (options.timeline_bin_ns < 0) {
        return invalid_argument("simulate: timeline_bin_ns must be >= 0");
    }
    const auto& trs = trace.requests;
    const int64_t span_ns = std::max<int64_t>(1, trs.back().arrival_ns - trs.front().arrival_ns);
    double time_scale = options.time_scale;
    if (options.target_load > 0) {
        // Offered work of each stage with shared-store hits at the trace's own timing.
        BlockIdCache probe(cluster_desc.store_capacity_tokens > 0
                             ? std::max<int64_t>(1, cluster_desc.store_capacity_tokens /
                                                        trace.block_tokens)
                             : 0,
                         cluster_desc.store_ttl_ns);
        double wp = 0;
        double wd = 0;
        for (const workload::TraceRequest& r : trs) {
            const auto chain = trace.blocks_of(r);
            int64_t hit = std::min<int64_t>(probe.match(chain, r.arrival_ns) * trace.block_tokens,
                                            r.input_tokens - kSwaReserveTokens);
            hit = std::max<int64_t>(0, hit / kKvBlockTokens * kKvBlockTokens);
            probe.insert(chain, r.arrival_ns);
            wp += ideal_prefill_ns(cluster_desc, options.prefill_lb, r.input_tokens, hit);
            wd += ideal_decode_ns(cluster_desc, r.input_tokens, r.output_tokens);
        }
        const double busiest = std::max(wp / cluster_desc.num_prefill, wd / cluster_desc.num_decode);
        time_scale = busiest / (static_cast<double>(span_ns) * options.target_load);
    }

    internal::Sim sim(trace, cluster_desc, options, time_scale);
    SimResult res = sim.run();
    res.time_scale = time_scale;
    res.num_requests = static_cast<int64_t>(trs.size());
    return res;
}

}  // namespace dsi::sim
