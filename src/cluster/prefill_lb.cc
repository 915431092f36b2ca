#include "cluster/prefill_lb.h"

#include <algorithm>
#include <cmath>

namespace dsi::cluster {

Status PrefillLbSettings::validate() const {
    int64_t prev = 0;
    for (int64_t b : bucket_upper_tokens) {
        if (b <= prev) {
            return invalid_argument("prefill lb: bucket bounds must be increasing and > 0");
        }
        prev = b;
    }
    for (double q : bucket_quota_ns) {
        if (!(q > 0) || !std::isfinite(q)) {
            return invalid_argument("prefill lb: bucket quota caps must be > 0");
        }
    }
    if (round_ns <= 0) {
        return invalid_argument("prefill lb: round_ns must be > 0");
    }
    return Status::ok();
}

PrefillLb::PrefillLb(const PrefillLbSettings& settings, int num_engines, int64_t now_ns)
    : settings_(settings),
      engine_bucket_(num_engines, -1),
      available_(num_engines, true),
      next_round_ns_(now_ns + settings.round_ns) {
    DSI_CHECK(settings.validate().is_ok(), settings.validate().to_string());
    DSI_CHECK(num_engines >= 1);
    // Before any demand is known, spread engines evenly.
    reassign(apportion(num_engines, {1, 1, 1, 1}));
}

int PrefillLb::bucket_of(int64_t total_tokens) const {
    // S-LB: < 16K, 16-64K, 64-256K, >= 256K.
    for (int b = 0; b < kNumPrefillBuckets - 1; ++b) {
        if (total_tokens < settings_.bucket_upper_tokens[b]) {
            return b;
        }
    }
    return kNumPrefillBuckets - 1;
}

void PrefillLb::submit(const PrefillWork& work) {
    const int b = bucket_of(work.total_tokens);
    queues_[b].push_back(work);
    pending_cost_ns_[b] += work.cost_ns;
    round_demand_ns_[b] += work.cost_ns;
    ++round_arrivals_[b];
}

double PrefillLb::quota_cap_ns(int engine) const {
    const int b = engine_bucket_[engine];
    return b < 0 ? 0.0 : settings_.bucket_quota_ns[b];
}

void PrefillLb::take_from(int bucket, double held_cost_ns, double cap_ns,
                          std::vector<PrefillWork>& out) {
    auto& q = queues_[bucket];
    // S-LB: pull by remaining quota; an empty engine always takes the head (it chunks it).
    while (!q.empty()) {
        const PrefillWork& head = q.front();
        const bool empty_engine = held_cost_ns <= 0 && out.empty();
        if (!empty_engine && held_cost_ns + head.cost_ns > cap_ns) {
            break;
        }
        held_cost_ns += head.cost_ns;
        pending_cost_ns_[bucket] -= head.cost_ns;
        out.push_back(head);
        q.pop_front();
    }
    if (q.empty()) {
        pending_cost_ns_[bucket] = 0;  // no drift from floating-point subtraction
    }
}

std::vector<PrefillWork> PrefillLb::pull(int engine, double held_cost_ns) {
    std::vector<PrefillWork> out;
    const int b = engine_bucket_[engine];
    if (!available_[engine] || b < 0) {
        return out;
    }
    take_from(b, held_cost_ns, settings_.bucket_quota_ns[b], out);
    if (out.empty() && held_cost_ns <= 0 && settings_.steal_when_idle) {
        int best = -1;
        for (int o = 0; o < kNumPrefillBuckets; ++o) {
            if (!queues_[o].empty() && (best < 0 || pending_cost_ns_[o] > pending_cost_ns_[best])) {
                best = o;
            }
        }
        if (best >= 0) {
            take_from(best, held_cost_ns, settings_.bucket_quota_ns[best], out);
        }
    }
    return out;
}

std::array<int, kNumPrefillBuckets> PrefillLb::apportion(
    int num_engines, const std::array<double, kNumPrefillBuckets>& demand) {
    std::array<int, kNumPrefillBuckets> count{};
    double total = 0;
    for (double d : demand) {
        total += std::max(0.0, d);
    }
    if (num_engines <= 0 || total <= 0) {
        return count;
    }
    // One engine for each bucket with demand, in bucket order while engines last.
    int left = num_engines;
    for (int b = 0; b < kNumPrefillBuckets && left > 0; ++b) {
        if (demand[b] > 0) {
            count[b] = 1;
            --left;
        }
    }
    // The rest in proportion to what each bucket still lacks of its ideal share, by
    // largest remainder (ties to the lower bucket).
    std::array<double, kNumPrefillBuckets> extra{};
    double extra_total = 0;
    for (int b = 0; b < kNumPrefillBuckets; ++b) {
        if (demand[b] > 0) {
            extra[b] = std::max(0.0, demand[b] / total * num_engines - count[b]);
            extra_total += extra[b];
        }
    }
    if (left == 0 || extra_total <= 0) {
        return count;
    }
    std::array<double, kNumPrefillBuckets> remainder{};
    for (int b = 0; b < kNumPrefillBuckets; ++b) {
        const double want = extra[b] / extra_total * left;
        const int whole = static_cast<int>(std::floor(want));
        count[b] += whole;
        remainder[b] = want - whole;
    }
    int given = 0;
    for (int c : count) {
        given += c;
    }
    for (; given < num_engines; ++given) {
        int best = 0;
        for (int b = 1; b < kNumPrefillBuckets; ++b) {
            if (remainder[b] > remainder[best]) {
                best = b;
            }
        }
        ++count[best];
        remainder[best] = -1;
    }
    return count;
}

std::array<double, kNumPrefillBuckets> PrefillLb::min_max_completion_split(
    int num_engines, const std::array<double, kNumPrefillBuckets>& demand_ns,
    const std::array<double, kNumPrefillBuckets>& longest_ns,
    const std::array<int, kNumPrefillBuckets>& max_engines) {
    // S-LB (reassignment from quota demand), min-max form: the engines bucket b needs to
    // finish its backlog by time t are demand / (t - longest), at
    // most max_engines (more would idle). The sum falls with t; bisect for the smallest t
    // whose need fits the engines. Engines left when every bucket is at its maximum are
    // spread by demand (apportion gives them out in proportion).
    auto need = [&](double t) {
        std::array<double, kNumPrefillBuckets> n{};
        for (int b = 0; b < kNumPrefillBuckets; ++b) {
            if (demand_ns[b] <= 0) {
                continue;
            }
            const double cap = std::max(1, max_engines[b]);
            n[b] = t <= longest_ns[b] ? cap : std::min(cap, demand_ns[b] / (t - longest_ns[b]));
        }
        return n;
    };
    auto sum = [](const std::array<double, kNumPrefillBuckets>& n) {
        double s = 0;
        for (double x : n) {
            s += x;
        }
        return s;
    };
    double lo = 0;
    double hi = 1;
    for (int b = 0; b < kNumPrefillBuckets; ++b) {
        lo = std::max(lo, longest_ns[b]);
        hi += longest_ns[b] + std::max(0.0, demand_ns[b]);
    }
    if (sum(need(lo)) <= num_engines) {
        std::array<double, kNumPrefillBuckets> n = need(lo);
        // Every bucket is at its cap: share the surplus by demand (work conservation).
        const double spare = num_engines - sum(n);
        double total = 0;
        for (double d : demand_ns) {
            total += std::max(0.0, d);
        }
        for (int b = 0; b < kNumPrefillBuckets && total > 0; ++b) {
            n[b] += spare * std::max(0.0, demand_ns[b]) / total;
        }
        return n;
    }
    for (int it = 0; it < 60; ++it) {
        const double mid = 0.5 * (lo + hi);
        (sum(need(mid)) > num_engines ? lo : hi) = mid;
    }
    return need(hi);
}

void PrefillLb::reassign(const std::array<int, kNumPrefillBuckets>& target) {
    std::array<int, kNumPrefillBuckets> have{};
    std::vector<int> pool;
    for (int e = 0; e < num_engines(); ++e) {
        const int b = engine_bucket_[e];
        if (!available_[e]) {
            engine_bucket_[e] = -1;
        } else if (b >= 0 && have[b] < target[b]) {
            ++have[b];
        } else {
            engine_bucket_[e] = -1;
            pool.push_back(e);
        }
    }
    size_t next = 0;
    for (int b = 0; b < kNumPrefillBuckets; ++b) {
        while (have[b] < target[b] && next < pool.size()) {
            engine_bucket_[pool[next++]] = b;
            ++have[b];
        }
    }
    // Engines left over (target sums to fewer) serve bucket 0 rather than idle.
    while (next < pool.size()) {
        engine_bucket_[pool[next++]] = 0;
    }
}

bool PrefillLb::tick(int64_t now_ns) {
    if (now_ns < next_round_ns_) {
        return false;
    }
    // S-LB: engines per bucket follow each bucket's quota demand in the last round.
    std::array<double, kNumPrefillBuckets> demand{};
    std::array<double, kNumPrefillBuckets> longest{};
    std::array<int, kNumPrefillBuckets> max_engines{};
    double total = 0;
    for (int b = 0; b < kNumPrefillBuckets; ++b) {
        demand[b] = round_demand_ns_[b] + pending_cost_ns_[b];
        total += demand[b];
        for (const PrefillWork& w : queues_[b]) {
            longest[b] = std::max(longest[b], w.cost_ns);
        }
        // One request never uses more than one engine: the waiting ones, plus those that
        // arrived this round (already pulled or not).
        max_engines[b] = static_cast<int>(queues_[b].size()) + round_arrivals_[b];
        round_demand_ns_[b] = 0;
        round_arrivals_[b] = 0;
    }
    const int64_t rounds = (now_ns - next_round_ns_) / settings_.round_ns + 1;
    next_round_ns_ += rounds * settings_.round_ns;
    if (total <= 0) {
        return false;
    }
    int num_available = 0;
    for (bool a : available_) {
        num_available += a ? 1 : 0;
    }
    if (settings_.reassign == PrefillReassign::kMinMaxCompletion) {
        const auto split = min_max_completion_split(num_available, demand, longest, max_engines);
        reassign(apportion(num_available, split));
    } else {
        reassign(apportion(num_available, demand));
    }
    ++num_reassignments_;
    return true;
}

void PrefillLb::set_engine_available(int engine, bool available) {
    available_[engine] = available;
    if (!available) {
        engine_bucket_[engine] = -1;
    }
}

std::array<int, kNumPrefillBuckets> PrefillLb::engines_per_bucket() const {
    std::array<int, kNumPrefillBuckets> n{};
    for (int b : engine_bucket_) {
        if (b >= 0) {
            ++n[b];
        }
    }
    return n;
}

size_t PrefillLb::num_pending() const {
    size_t n = 0;
    for (const auto& q : queues_) {
        n += q.size();
    }
    return n;
}

}  // namespace dsi::cluster
