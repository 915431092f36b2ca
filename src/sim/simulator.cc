#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>

#include "sim/block_store.h"

namespace dsi::sim {
namespace {

// S-KV-10: the hit never exceeds L - 134 and is a multiple of 128 tokens.
constexpr int64_t kSwaReserveTokens = 134;
constexpr int64_t kKvBlockTokens = 128;

// Ideal per-request work on a perfectly balanced, fully batched cluster.
double ideal_prefill_ns(const ClusterDescription& c, const cluster::PrefillLbSettings& lb,
                        int64_t input, int64_t hit) {
    const double w = c.prefill_cost.cost_ns(input - hit, hit);
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

enum class Ev : uint8_t { kArrival, kPrefillDone, kDecodeArrive, kDecodeDone };

struct Event {
    int64_t t_ns;
    uint64_t seq;
    Ev type;
    uint32_t id;
};
struct Later {
    bool operator()(const Event& a, const Event& b) const {
        return a.t_ns > b.t_ns || (a.t_ns == b.t_ns && a.seq > b.seq);
    }
};

struct Req {
    int64_t arrival_ns = 0;
    int64_t hit_tokens = 0;
    int64_t done_tokens = 0;  // computed so far (excluding the hit)
    double cost_ns = 0;       // whole-request estimate for quotas
    int32_t prefill_engine = -1;
    int32_t decode_engine = -1;
    int64_t ready_ns = 0;  // arrival + store read
    int64_t prefill_done_ns = -1;
    int64_t first_token_ns = -1;
    int64_t decode_arrive_ns = -1;
    int64_t finish_ns = -1;
    int32_t finishes = 0;
};

struct Chunk {
    uint32_t req;
    int64_t q;
};

struct PrefillEngine {
    std::deque<uint32_t> queue;  // FIFO (S-LB)
    double held_cost_ns = 0;
    int64_t queued_tokens = 0;  // missed tokens not yet computed
    bool busy = false;
    double busy_ns = 0;
    std::vector<Chunk> step;
    std::unique_ptr<BlockStore> store;  // per-engine store mode only
};

struct DecodeEngine {
    std::vector<uint32_t> joining;
    std::priority_queue<std::pair<int64_t, uint32_t>, std::vector<std::pair<int64_t, uint32_t>>,
                        std::greater<>>
        finishing;  // (finish step, request)
    int64_t step = 0;
    int64_t running = 0;
    bool busy = false;
    double busy_ns = 0;
};

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

class Sim {
public:
    Sim(const Trace& trace, const ClusterDescription& c, const SimOptions& o, double time_scale)
        : trace_(trace),
          c_(c),
          o_(o),
          time_scale_(time_scale),
          reqs_(trace.requests.size()),
          prefill_(c.num_prefill),
          decode_(c.num_decode),
          ranks_(c.num_decode),
          decode_lb_(o.decode_lb) {
        const int64_t cap_blocks =
            c.store_capacity_tokens > 0
                ? std::max<int64_t>(1, c.store_capacity_tokens / trace.block_tokens)
                : 0;
        if (o.store == StoreKind::kShared) {
            shared_store_ = std::make_unique<BlockStore>(cap_blocks, c.store_ttl_ns);
        } else {
            for (auto& e : prefill_) {
                e.store = std::make_unique<BlockStore>(
                    cap_blocks > 0 ? std::max<int64_t>(1, cap_blocks / c.num_prefill) : 0,
                    c.store_ttl_ns);
            }
        }
        if (o.prefill_routing == PrefillRouting::kDeepSeek) {
            prefill_lb_ = std::make_unique<cluster::PrefillLb>(o.prefill_lb, c.num_prefill, 0);
        }
        for (auto& r : ranks_) {
            r.max_requests = c.decode_max_batch;
            r.kv_capacity_tokens = c.decode_kv_capacity_tokens;
        }
    }

    SimResult run();

private:
    void summarize();
    void push(int64_t t_ns, Ev type, uint32_t id) { events_.push({t_ns, seq_++, type, id}); }
    int64_t hit_tokens_for(const TraceRequest& tr, int64_t matched_blocks) const;
    void on_arrival(uint32_t r);
    void try_start_prefill(int e);
    void on_prefill_done(int e);
    void on_decode_arrive(uint32_t r);
    bool place_decode(uint32_t r);
    void start_decode(int d);
    void on_decode_done(int d);
    int bucket_of(int64_t tokens) const {
        for (int b = 0; b < cluster::kNumPrefillBuckets - 1; ++b) {
            if (tokens < o_.prefill_lb.bucket_upper_tokens[b]) {
                return b;
            }
        }
        return cluster::kNumPrefillBuckets - 1;
    }
    // Spreads a busy interval [start, start + dur) of one engine over the timeline bins.
    void add_busy(std::vector<double>& bins, int64_t start_ns, double dur_ns) {
        const double bin = static_cast<double>(o_.timeline_bin_ns);
        double t = static_cast<double>(start_ns);
        const double end = t + dur_ns;
        while (t < end) {
            const size_t i = static_cast<size_t>(t / bin);
            if (i >= bins.size()) {
                bins.resize(i + 1, 0.0);
            }
            const double bin_end = (static_cast<double>(i) + 1) * bin;
            bins[i] += std::min(end, bin_end) - t;
            t = bin_end;
        }
    }
    void sample_waiting() {
        const size_t i = static_cast<size_t>(now_ / o_.timeline_bin_ns);
        if (i >= waiting_.size()) {
            waiting_.resize(i + 1, -1);
        }
        int64_t n = prefill_lb_ ? static_cast<int64_t>(prefill_lb_->num_pending()) : 0;
        for (const auto& e : prefill_) {
            n += static_cast<int64_t>(e.queue.size());
        }
        waiting_[i] = n;
    }
    void finish(uint32_t r) {
        Req& q = reqs_[r];
        q.finish_ns = now_;
        ++q.finishes;
        ++num_finished_;
    }

    const Trace& trace_;
    const ClusterDescription& c_;
    const SimOptions& o_;
    double time_scale_;
    std::vector<Req> reqs_;
    std::vector<PrefillEngine> prefill_;
    std::vector<DecodeEngine> decode_;
    std::vector<cluster::DecodeRankState> ranks_;
    cluster::DecodeLb decode_lb_;
    cluster::DecodeRoundRobin decode_rr_;
    std::unique_ptr<cluster::PrefillLb> prefill_lb_;
    std::unique_ptr<BlockStore> shared_store_;
    std::priority_queue<Event, std::vector<Event>, Later> events_;
    std::deque<uint32_t> decode_pending_;
    uint64_t seq_ = 0;
    int64_t now_ = 0;
    int64_t num_finished_ = 0;
    size_t rr_prefill_ = 0;
    size_t wake_from_ = 0;
    std::vector<double> prefill_busy_bins_;
    std::vector<double> decode_busy_bins_;
    std::vector<int64_t> waiting_;
    SimResult res_;
};

int64_t Sim::hit_tokens_for(const TraceRequest& tr, int64_t matched_blocks) const {
    // S-KV-10: hit <= L - 134, rounded down to whole 128-token blocks.
    int64_t hit = std::min<int64_t>(matched_blocks * trace_.block_tokens,
                                    tr.input_tokens - kSwaReserveTokens);
    hit = hit / kKvBlockTokens * kKvBlockTokens;
    return std::max<int64_t>(0, hit);
}

void Sim::on_arrival(uint32_t r) {
    const TraceRequest& tr = trace_.requests[r];
    Req& q = reqs_[r];
    q.arrival_ns = now_;
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
            engine = static_cast<int>(rr_prefill_++ % prefill_.size());
            break;
        case PrefillRouting::kLeastLoaded:
            engine = 0;
            for (int e = 1; e < c_.num_prefill; ++e) {
                if (prefill_[e].queued_tokens < prefill_[engine].queued_tokens) {
                    engine = e;
                }
            }
            break;
        case PrefillRouting::kPrefixAffinity: {
            // Public KV-aware routers: cost = tokens to compute here + w x queued tokens.
            double best = 0;
            for (int e = 0; e < c_.num_prefill; ++e) {
                const int64_t hit =
                    o_.store == StoreKind::kShared
                        ? q.hit_tokens
                        : hit_tokens_for(tr, prefill_[e].store->peek(chain, now_));
                const double score = static_cast<double>(tr.input_tokens - hit) +
                                     o_.affinity_load_weight * prefill_[e].queued_tokens;
                if (engine < 0 || score < best) {
                    engine = e;
                    best = score;
                }
            }
            break;
        }
    }
    if (o_.store == StoreKind::kPerEngine) {
        q.hit_tokens = hit_tokens_for(tr, prefill_[engine].store->match(chain, now_));
    }
    const int64_t miss = tr.input_tokens - q.hit_tokens;
    q.cost_ns = c_.prefill_cost.cost_ns(miss, q.hit_tokens);
    q.ready_ns = now_ + static_cast<int64_t>(q.hit_tokens * c_.kv_bytes_per_token /
                                             c_.store_read_bytes_per_s * 1e9);
    res_.bucket_requests[bucket_of(tr.input_tokens)]++;
    if (prefill_lb_) {
        prefill_lb_->tick(now_);
        prefill_lb_->submit({r, tr.input_tokens, q.cost_ns, now_});
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
            pe.queue.push_back(r);
            pe.held_cost_ns += w.cost_ns;
            pe.queued_tokens += trace_.requests[r].input_tokens - reqs_[r].hit_tokens;
        }
    }
    if (pe.queue.empty()) {
        return;
    }
    // S-LB: the step's time budget is the bucket's quota; each chunk is the largest the
    // cost model fits into what is left of it, FIFO.
    const double budget =
        o_.prefill_lb.bucket_quota_ns[bucket_of(trace_.requests[pe.queue.front()].input_tokens)];
    double left = budget;
    double total = 0;
    pe.step.clear();
    for (uint32_t r : pe.queue) {
        const Req& q = reqs_[r];
        const int64_t c = q.hit_tokens + q.done_tokens;
        const int64_t remaining = trace_.requests[r].input_tokens - c;
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
        total += cost;
        if (n < remaining || left <= 0) {
            break;
        }
    }
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
        const TraceRequest& tr = trace_.requests[ch.req];
        q.done_tokens += ch.q;
        res_.computed_tokens += ch.q;
        pe.queued_tokens -= ch.q;
        if (q.hit_tokens + q.done_tokens < tr.input_tokens) {
            continue;
        }
        DSI_CHECK(pe.queue.front() == ch.req, "prefill FIFO order broken");
        pe.queue.pop_front();
        pe.held_cost_ns = pe.queue.empty() ? 0.0 : pe.held_cost_ns - q.cost_ns;
        q.prefill_done_ns = now_;
        // The first token comes out of prefill; the store read overlapped the queueing.
        q.first_token_ns = std::max(now_, q.ready_ns);
        // S-KV-7 analogue: the prompt's blocks are written to the store.
        BlockStore* store = shared_store_ ? shared_store_.get() : pe.store.get();
        store->insert(trace_.blocks_of(tr), now_);
        res_.kv_moved_tokens += tr.input_tokens;
        const int64_t transfer_ns =
            static_cast<int64_t>(tr.input_tokens * c_.kv_bytes_per_token / c_.p2d_bytes_per_s * 1e9);
        push(q.first_token_ns + transfer_ns, Ev::kDecodeArrive, ch.req);
    }
    pe.step.clear();
    if (prefill_lb_) {
        prefill_lb_->tick(now_);
    }
    try_start_prefill(e);
}

bool Sim::place_decode(uint32_t r) {
    const TraceRequest& tr = trace_.requests[r];
    const int64_t reserve = static_cast<int64_t>(tr.input_tokens) + tr.output_tokens;
    Result<int> d = resource_exhausted("");
    switch (o_.decode_routing) {
        case DecodeRouting::kDeepSeek:
            d = decode_lb_.choose(ranks_, tr.input_tokens, reserve);
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
    ranks_[*d].kv_tokens += tr.input_tokens;
    decode_[*d].joining.push_back(r);
    if (!decode_[*d].busy) {
        start_decode(*d);
    }
    return true;
}

void Sim::on_decode_arrive(uint32_t r) {
    reqs_[r].decode_arrive_ns = now_;
    if (trace_.requests[r].output_tokens <= 1) {
        finish(r);  // prefill produced the only token
        return;
    }
    if (!decode_pending_.empty() || !place_decode(r)) {
        decode_pending_.push_back(r);
    }
}

void Sim::start_decode(int d) {
    DecodeEngine& de = decode_[d];
    for (uint32_t r : de.joining) {
        de.finishing.push({de.step + trace_.requests[r].output_tokens - 1, r});
        ++de.running;
    }
    de.joining.clear();
    if (de.running == 0) {
        return;
    }
    const double duration = c_.decode_base_ns + c_.decode_per_request_ns * de.running +
                            c_.decode_per_kv_token_ns * ranks_[d].kv_tokens;
    de.busy = true;
    de.busy_ns += duration;
    if (o_.timeline_bin_ns > 0) {
        add_busy(decode_busy_bins_, now_, duration);
    }
    push(now_ + static_cast<int64_t>(std::ceil(duration)), Ev::kDecodeDone, d);
}

void Sim::on_decode_done(int d) {
    DecodeEngine& de = decode_[d];
    de.busy = false;
    ++de.step;
    ranks_[d].kv_tokens += de.running;  // every running request gained one token
    res_.decoded_tokens += de.running;
    while (!de.finishing.empty() && de.finishing.top().first <= de.step) {
        const uint32_t r = de.finishing.top().second;
        de.finishing.pop();
        const TraceRequest& tr = trace_.requests[r];
        --de.running;
        ranks_[d].num_requests -= 1;
        ranks_[d].kv_tokens -= static_cast<int64_t>(tr.input_tokens) + tr.output_tokens - 1;
        finish(r);
    }
    while (!decode_pending_.empty() && place_decode(decode_pending_.front())) {
        decode_pending_.pop_front();
    }
    if (!de.busy) {
        start_decode(d);
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
    bool once = true;
    for (size_t i = 0; i < n; ++i) {
        const Req& q = reqs_[i];
        const TraceRequest& tr = trs[i];
        once = once && q.finishes == 1;
        end = std::max(end, q.finish_ns);
        prefill_end = std::max(prefill_end, q.prefill_done_ns);
        ttft.push_back((q.first_token_ns - q.arrival_ns) / 1e6);
        bucket_ttft[bucket_of(tr.input_tokens)].push_back(ttft.back());
        if (tr.output_tokens >= 2) {
            tpot.push_back((q.finish_ns - q.first_token_ns) / 1e6 / (tr.output_tokens - 1));
            res_.expected_decode_tokens += tr.output_tokens - 1;
        }
        res_.input_tokens += tr.input_tokens;
        res_.hit_tokens += q.hit_tokens;
        output_tokens += tr.output_tokens;
    }
    res_.num_finished = num_finished_;
    const double span_ns = std::max<double>(1.0, static_cast<double>(end - t0));
    res_.makespan_s = span_ns / 1e9;
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
        const TraceRequest& tr = trs[i];
        const double a = static_cast<double>(reqs_[i].arrival_ns);
        const double w = ideal_prefill_ns(c_, o_.prefill_lb, tr.input_tokens, reqs_[i].hit_tokens);
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
            const TraceRequest& tr = trs[i];
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
    const double device_hours = (np + nd) * span_ns / 3.6e12;
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
    res_.conservation_ok = once && res_.num_finished == static_cast<int64_t>(n) &&
                           res_.hit_tokens + res_.computed_tokens == res_.input_tokens &&
                           res_.decoded_tokens == res_.expected_decode_tokens &&
                           res_.kv_moved_tokens == res_.input_tokens;
}

}  // namespace

Status ClusterDescription::validate() const {
    DSI_RETURN_IF_ERROR(prefill_cost.validate());
    if (num_prefill < 1 || num_decode < 1 || num_prefill > 100000 || num_decode > 100000) {
        return invalid_argument("cluster: num_prefill and num_decode must be in 1..100000");
    }
    const double positive[] = {decode_base_ns + decode_per_request_ns, kv_bytes_per_token,
                               p2d_bytes_per_s, store_read_bytes_per_s};
    for (double v : positive) {
        if (!(v > 0) || !std::isfinite(v)) {
            return invalid_argument("cluster: decode step cost, KV bytes and bandwidths must be > 0");
        }
    }
    if (prefill_step_overhead_ns < 0 || decode_base_ns < 0 || decode_per_request_ns < 0 ||
        decode_per_kv_token_ns < 0 || price_per_device_hour < 0) {
        return invalid_argument("cluster: costs and price must be >= 0");
    }
    if (decode_max_batch < 1 || decode_kv_capacity_tokens < 1) {
        return invalid_argument("cluster: decode_max_batch and KV capacity must be >= 1");
    }
    if (store_capacity_tokens < 0 || store_ttl_ns < 0) {
        return invalid_argument("cluster: store capacity and TTL must be >= 0");
    }
    return Status::ok();
}

Result<ClusterDescription> parse_cluster_description(std::string_view json) {
    nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
        return invalid_argument("cluster description: not a JSON object");
    }
    ClusterDescription c;
    auto num = [](const nlohmann::json& v, const std::string& key, auto& out) -> Status {
        if (!v.is_number()) {
            return invalid_argument("cluster description: \"" + key + "\" must be a number");
        }
        using T = std::decay_t<decltype(out)>;
        if constexpr (std::is_integral_v<T>) {
            if (!v.is_number_integer()) {
                return invalid_argument("cluster description: \"" + key + "\" must be an integer");
            }
            out = v.get<T>();
        } else {
            out = v.get<T>();
        }
        return Status::ok();
    };
    for (const auto& [key, v] : j.items()) {
        if (key == "device") {
            if (!v.is_string()) {
                return invalid_argument("cluster description: \"device\" must be a string");
            }
            c.device = v.get<std::string>();
        } else if (key == "num_prefill") {
            DSI_RETURN_IF_ERROR(num(v, key, c.num_prefill));
        } else if (key == "num_decode") {
            DSI_RETURN_IF_ERROR(num(v, key, c.num_decode));
        } else if (key == "prefill_step_overhead_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.prefill_step_overhead_ns));
        } else if (key == "decode_base_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_base_ns));
        } else if (key == "decode_per_request_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_per_request_ns));
        } else if (key == "decode_per_kv_token_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_per_kv_token_ns));
        } else if (key == "decode_max_batch") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_max_batch));
        } else if (key == "decode_kv_capacity_tokens") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_kv_capacity_tokens));
        } else if (key == "kv_bytes_per_token") {
            DSI_RETURN_IF_ERROR(num(v, key, c.kv_bytes_per_token));
        } else if (key == "p2d_bytes_per_s") {
            DSI_RETURN_IF_ERROR(num(v, key, c.p2d_bytes_per_s));
        } else if (key == "store_read_bytes_per_s") {
            DSI_RETURN_IF_ERROR(num(v, key, c.store_read_bytes_per_s));
        } else if (key == "store_capacity_tokens") {
            DSI_RETURN_IF_ERROR(num(v, key, c.store_capacity_tokens));
        } else if (key == "store_ttl_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.store_ttl_ns));
        } else if (key == "price_per_device_hour") {
            DSI_RETURN_IF_ERROR(num(v, key, c.price_per_device_hour));
        } else if (key == "prefill_cost") {
            if (!v.is_object()) {
                return invalid_argument("cluster description: \"prefill_cost\" must be an object");
            }
            for (const auto& [k2, v2] : v.items()) {
                double* dst = k2 == "base_ns"     ? &c.prefill_cost.base_ns
                              : k2 == "per_q_ns"  ? &c.prefill_cost.per_q_ns
                              : k2 == "per_c_ns"  ? &c.prefill_cost.per_c_ns
                              : k2 == "per_qc_ns" ? &c.prefill_cost.per_qc_ns
                              : k2 == "per_qq_ns" ? &c.prefill_cost.per_qq_ns
                                                  : nullptr;
                if (dst == nullptr) {
                    return invalid_argument("cluster description: unknown key prefill_cost." + k2);
                }
                DSI_RETURN_IF_ERROR(num(v2, "prefill_cost." + k2, *dst));
            }
        } else {
            return invalid_argument("cluster description: unknown key \"" + key + "\"");
        }
    }
    DSI_RETURN_IF_ERROR(c.validate());
    return c;
}

Result<PrefillRouting> parse_prefill_routing(std::string_view n) {
    if (n == "deepseek") return PrefillRouting::kDeepSeek;
    if (n == "round-robin") return PrefillRouting::kRoundRobin;
    if (n == "least-loaded") return PrefillRouting::kLeastLoaded;
    if (n == "prefix-affinity") return PrefillRouting::kPrefixAffinity;
    return invalid_argument("prefill routing: want deepseek|round-robin|least-loaded|prefix-affinity");
}

Result<DecodeRouting> parse_decode_routing(std::string_view n) {
    if (n == "deepseek") return DecodeRouting::kDeepSeek;
    if (n == "round-robin") return DecodeRouting::kRoundRobin;
    if (n == "least-loaded") return DecodeRouting::kLeastLoaded;
    return invalid_argument("decode routing: want deepseek|round-robin|least-loaded");
}

std::string_view prefill_routing_name(PrefillRouting r) {
    switch (r) {
        case PrefillRouting::kDeepSeek: return "deepseek";
        case PrefillRouting::kRoundRobin: return "round-robin";
        case PrefillRouting::kLeastLoaded: return "least-loaded";
        case PrefillRouting::kPrefixAffinity: return "prefix-affinity";
    }
    return "?";
}

std::string_view decode_routing_name(DecodeRouting r) {
    switch (r) {
        case DecodeRouting::kDeepSeek: return "deepseek";
        case DecodeRouting::kRoundRobin: return "round-robin";
        case DecodeRouting::kLeastLoaded: return "least-loaded";
    }
    return "?";
}

Result<SimResult> simulate(const Trace& trace, const ClusterDescription& cluster_desc,
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
        BlockStore probe(cluster_desc.store_capacity_tokens > 0
                             ? std::max<int64_t>(1, cluster_desc.store_capacity_tokens /
                                                        trace.block_tokens)
                             : 0,
                         cluster_desc.store_ttl_ns);
        double wp = 0;
        double wd = 0;
        for (const TraceRequest& r : trs) {
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

    Sim sim(trace, cluster_desc, options, time_scale);
    SimResult res = sim.run();
    res.time_scale = time_scale;
    res.num_requests = static_cast<int64_t>(trs.size());
    return res;
}

}  // namespace dsi::sim
