#include "spec/varlen.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <numeric>

#include "base/check.h"

namespace dsi::spec {

int AcceptanceEstimator::bin_index(float prob) {
    if (!(prob >= 0.0f)) return kProbBins;  // NaN or negative: no probability
    return std::min(kProbBins - 1, static_cast<int>(prob * kProbBins));
}

int AcceptanceEstimator::position(int j) { return std::clamp(j, 0, kMaxSpeculativeTokens - 1); }

const AcceptanceEstimator::Bin& AcceptanceEstimator::bin(int j, float prob) const {
    return bins_[static_cast<size_t>(position(j))][static_cast<size_t>(bin_index(prob))];
}

AcceptanceEstimator::Bin& AcceptanceEstimator::bin(int j, float prob) {
    return const_cast<Bin&>(std::as_const(*this).bin(j, prob));
}

double AcceptanceEstimator::estimate(int j, float prob) const {
    const Bin& b = bin(j, prob);
    double prior = 0.5;
    if (prob >= 0.0f) {
        // The drafter's probability, calibrated by what position j observed overall
        // (a head that is over-confident at deep positions is scaled down there).
        const Position& p = positions_[static_cast<size_t>(position(j))];
        const double calibration =
            (p.prob_accepted + kPriorWeight) / (p.prob_sum + kPriorWeight);
        prior = std::min(1.0, static_cast<double>(std::min(1.0f, prob)) * calibration);
    } else if (j > 0) {
        // Without a probability, a position nothing was learnt of yet starts from the
        // position before it: a drafter right at j - 1 is tried at j.
        prior = estimate(position(j) - 1, prob);
    }
    return (b.accepted + kPriorWeight * prior) / (b.n + kPriorWeight);
}

double AcceptanceEstimator::optimistic(int j, float prob) const {
    const double n = positions_[static_cast<size_t>(position(j))].n;
    const double bonus = n < kExploreObservations ? kExplore / std::sqrt(n + 1.0) : 0.0;
    return std::min(1.0, estimate(j, prob) + bonus);
}

void AcceptanceEstimator::observe(int j, float prob, bool accepted) {
    auto halve_at_window = [](double& n, std::initializer_list<double*> with) {
        if (n < kWindow) return;
        n *= 0.5;
        for (double* v : with) *v *= 0.5;
    };
    Bin& b = bin(j, prob);
    halve_at_window(b.n, {&b.accepted});
    b.n += 1;
    b.accepted += accepted ? 1 : 0;
    Position& p = positions_[static_cast<size_t>(position(j))];
    halve_at_window(p.n, {&p.prob_sum, &p.prob_accepted});
    p.n += 1;
    if (prob >= 0.0f) {
        p.prob_sum += std::min(1.0f, prob);
        p.prob_accepted += accepted ? 1 : 0;
    }
}

Result<VerifyCostCurve> VerifyCostCurve::create(std::vector<VerifyCostPoint> points) {
    if (points.size() < 2) {
        return invalid_argument("verify cost curve: needs at least 2 points, got " +
                                std::to_string(points.size()));
    }
    for (size_t i = 0; i < points.size(); ++i) {
        const VerifyCostPoint& p = points[i];
        if (p.tokens < 1 || (i > 0 && p.tokens <= points[i - 1].tokens)) {
            return invalid_argument("verify cost curve: token counts must increase from 1 (point " +
                                    std::to_string(i) + ")");
        }
        if (!std::isfinite(p.ns) || p.ns <= 0) {
            return invalid_argument("verify cost curve: time of point " + std::to_string(i) +
                                    " must be finite and > 0");
        }
    }
    VerifyCostCurve c;
    c.points_ = std::move(points);
    return c;
}

double VerifyCostCurve::ns(int64_t tokens) const {
    const std::vector<VerifyCostPoint>& p = points_;
    if (tokens <= p.front().tokens) return p.front().ns;
    size_t hi = 1;
    while (hi + 1 < p.size() && p[hi].tokens < tokens) ++hi;
    const VerifyCostPoint& a = p[hi - 1];
    const VerifyCostPoint& b = p[hi];
    const double slope = (b.ns - a.ns) / static_cast<double>(b.tokens - a.tokens);
    // Past the last point the last slope goes on; a measured dip never makes a larger
    // step cheaper than a smaller one.
    return std::max(a.ns, a.ns + slope * static_cast<double>(tokens - a.tokens));
}

std::string VerifyCostCurve::to_json(std::string_view info_json) const {
    nlohmann::ordered_json j;
    j["format"] = "dsinfer-verify-cost-v1";
    nlohmann::ordered_json pts = nlohmann::ordered_json::array();
    for (const VerifyCostPoint& p : points_) pts.push_back({{"tokens", p.tokens}, {"ns", p.ns}});
    j["points"] = std::move(pts);
    if (!info_json.empty()) j["fit"] = nlohmann::ordered_json::parse(info_json);
    return j.dump(2) + "\n";
}

Result<VerifyCostCurve> VerifyCostCurve::from_json(std::string_view text) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("verify cost curve: not a JSON object");
    if (auto f = j.find("format"); f == j.end() || *f != "dsinfer-verify-cost-v1") {  // any type: no throw
        return invalid_argument("verify cost curve: format is not dsinfer-verify-cost-v1");
    }
    auto it = j.find("points");
    if (it == j.end() || !it->is_array()) return invalid_argument("verify cost curve: no points array");
    std::vector<VerifyCostPoint> points;
    for (const nlohmann::json& p : *it) {
        if (!p.is_object() || !p.contains("tokens") || !p.contains("ns") ||
            !p["tokens"].is_number_integer() || !p["ns"].is_number()) {
            return invalid_argument("verify cost curve: a point needs integer tokens and number ns");
        }
        points.push_back({p["tokens"].get<int64_t>(), p["ns"].get<double>()});
    }
    return create(std::move(points));
}

VarlenChoice choose_verify_lengths(std::span<const VarlenRequest> requests, int64_t base_tokens,
                                   int64_t sampled, const VerifyCostCurve& cost, double draft_ns) {
    struct Slot {
        double survival;
        uint32_t request;
        uint32_t pos;
    };
    std::vector<Slot> slots;
    for (size_t i = 0; i < requests.size(); ++i) {
        double s = 1.0;
        for (size_t j = 0; j < requests[i].accept.size(); ++j) {
            const double a = requests[i].accept[j];
            DSI_DCHECK(a >= 0.0 && a <= 1.0);
            s *= a;
            slots.push_back({s, static_cast<uint32_t>(i), static_cast<uint32_t>(j)});
        }
    }
    // Highest survival first; equal survivals of one request stay in draft order, so
    // every prefix of this order is a prefix of each request's drafts.
    std::stable_sort(slots.begin(), slots.end(),
                     [](const Slot& a, const Slot& b) { return a.survival > b.survival; });
    VarlenChoice best;
    best.lengths.assign(requests.size(), 0);
    double gain = 0;
    const double without = static_cast<double>(sampled) / cost.ns(base_tokens);
    best.tokens_per_ns = static_cast<double>(sampled) / (cost.ns(base_tokens) + draft_ns);
    size_t best_n = 0;
    for (size_t n = 1; n <= slots.size(); ++n) {
        gain += slots[n - 1].survival;
        const double rate = (static_cast<double>(sampled) + gain) /
                            (cost.ns(base_tokens + static_cast<int64_t>(n)) + draft_ns);
        if (rate > best.tokens_per_ns) {
            best.tokens_per_ns = rate;
            best.expected_accepted = gain;
            best_n = n;
        }
    }
    for (size_t n = 0; n < best_n; ++n) {
        int& len = best.lengths[slots[n].request];
        len = std::max(len, static_cast<int>(slots[n].pos) + 1);
    }
    best.verified = static_cast<int64_t>(best_n);
    best.pays = best.tokens_per_ns > without;
    return best;
}

double predict_speedup(const VerifyCostCurve& cost, std::span<const double> survival,
                       int64_t batch) {
    if (batch <= 0 || survival.empty()) return 0;
    const double b = static_cast<double>(batch);
    const double without = b / cost.ns(batch);
    double gain = 0;
    double best = 0;
    for (size_t n = 1; n <= survival.size(); ++n) {
        gain += survival[n - 1];
        const int64_t tokens = batch * (1 + static_cast<int64_t>(n));
        best = std::max(best, (b + b * gain) / cost.ns(tokens));
    }
    return best / without;
}

std::vector<double> observed_survival(std::span<const int64_t> drafted,
                                      std::span<const int64_t> accepted, int max_drafts) {
    std::vector<double> s;
    const size_t n =
        std::min({drafted.size(), accepted.size(), static_cast<size_t>(std::max(max_drafts, 0))});
    double prev = 1;         // survival[j - 1]
    double conditional = 1;  // survival[j - 1] / survival[j - 2]
    for (size_t j = 0; j < n; ++j) {
        const double prior = prev * conditional;
        const double seen =
            (static_cast<double>(accepted[j]) + kSurvivalPrior * prior) /
            (static_cast<double>(std::max<int64_t>(drafted[j], 0)) + kSurvivalPrior);
        // Deep positions are verified for confident drafts only: never above the
        // position before.
        const double here = std::clamp(seen, 0.0, prev);
        conditional = prev > 0 ? here / prev : 0;
        prev = here;
        s.push_back(here);
    }
    return s;
}

int SpecGate::bucket(int64_t batch) {
    int b = 0;
    while (b + 1 < kBuckets && (int64_t{1} << b) < batch) ++b;
    return b;
}

double SpecGate::rate(int64_t batch, bool speculated) const {
    return buckets_[static_cast<size_t>(bucket(batch))].rate[speculated ? 1 : 0];
}

void SpecGate::start_run(Bucket& b, bool on, bool probing, int steps) {
    bool priced_out = false;
    if (on && !may_switch_on_) {
        // Switching on would not pay for its catch-up (SwitchPrice): hold the plain loop
        // and ask again. Not a switch of the loop: the rows to catch up say it was plain.
        ++priced_out_;
        priced_out = true;
        on = false;
        probing = false;
        steps = o_.min_hold;
    }
    if (on != b.on || !b.started) {
        // A new mode: its first step carries the switch; its rate is measured afresh.
        if (b.started && !priced_out) ++switches_;
        b.fresh = true;
        b.run_tokens = 0;
        b.run_ns = 0;
        b.run_steps = 0;
    }
    b.started = true;
    b.on = on;
    b.probing = probing;
    b.left = std::max(steps, 1);
}

void SpecGate::decide(Bucket& b, bool may_probe_on) {
    const bool other = !b.on;
    if (other && !may_probe_on && (!b.probing || b.rate[1] == 0)) {
        // The curve says speculating cannot pay here: no probe of it; ask again after a
        // short hold (the prediction follows the observed acceptance).
        start_run(b, false, false, o_.min_hold);
        return;
    }
    if (!b.probing) {
        start_run(b, other, true, o_.probe_steps);  // a hold ended: probe the other mode
        return;
    }
    if (b.rate[other ? 1 : 0] == 0) {
        start_run(b, other, true, o_.probe_steps);  // never measured: probe it first
        return;
    }
    const bool best_on = b.rate[1] >= b.rate[0];
    b.speedup = b.rate[1] / b.rate[0];
    b.hold = b.has_winner && best_on == b.winner_on ? std::max(b.hold, o_.min_hold) * 2
                                                      : o_.min_hold;
    const double slower = std::min(b.rate[0], b.rate[1]) / std::max(b.rate[0], b.rate[1]);
    // A probe's loss is its time (its steps at the slower mode's step time) times the
    // rate it gives up; the hold's output is its steps at the faster mode's step time.
    const double lose = best_on ? b.step_ns[0] : b.step_ns[1];
    const double keep = best_on ? b.step_ns[1] : b.step_ns[0];
    const double step_ratio = lose > 0 && keep > 0 ? lose / keep : 1;
    const double budget = o_.probe_steps * step_ratio * (1 - slower) / o_.max_probe_cost;
    if (budget > b.hold) b.hold = static_cast<int>(std::min<double>(std::ceil(budget), o_.max_hold));
    b.hold = std::min(b.hold, o_.max_hold);
    b.winner_on = best_on;
    b.has_winner = true;
    start_run(b, best_on, false, b.hold);
}

void SpecGate::start_bucket(int index, double predicted) {
    // Neighbours' measured speed-ups (rate on / rate off) are the prior: batch sizes
    // twice apart gain alike. A clear one starts the bucket holding that mode (as long
    // as the probe-cost rule asks); otherwise (or with none) the bucket probes not
    // speculating first (the loop without speculation costs nothing over the baseline).
    Bucket& b = buckets_[static_cast<size_t>(index)];
    if (predicted > 0 && predicted < o_.min_predicted) {
        start_run(b, false, false, o_.min_hold);  // cannot pay: not even a probe
        return;
    }
    double sum = 0;
    int n = 0;
    for (int nb : {index - 1, index + 1}) {
        if (nb < 0 || nb >= kBuckets) continue;
        const Bucket& o = buckets_[static_cast<size_t>(nb)];
        if (o.speedup <= 0) continue;
        sum += o.speedup;
        ++n;
    }
    // A predicted gain is no prior: the prediction leaves drafting and the synchronous
    // loop out, so it says where speculating cannot pay, not where it does.
    const double speedup = n > 0 ? sum / n : 1;
    if (std::abs(speedup - 1) < kPriorMargin) {
        start_run(b, false, true, o_.probe_steps);
        return;
    }
    const bool on = speedup > 1;
    b.speedup = speedup;  // passed on to its own new neighbours until measured
    const double slower = on ? 1 / speedup : speedup;
    const double budget = o_.probe_steps * (1 - slower) / o_.max_probe_cost;
    b.hold = static_cast<int>(std::clamp<double>(std::ceil(budget), o_.min_hold, o_.max_hold));
    start_run(b, on, false, b.hold);
}

bool SpecGate::switch_pays(int64_t batch, double predicted, const SwitchPrice& price) const {
    if (price.catchup_ns <= 0 || price.remaining_tokens < 0) return true;
    if (predicted <= 0) return true;  // nothing to price it with
    // The predicted gain, not a measured one: a measurement that found speculating slower
    // must not stop its own re-probing (the probe budget rule prices probes), and a hold
    // follows the measured rates anyway.
    const double gain = 1 - o_.min_predicted / predicted;
    const Bucket& b = buckets_[static_cast<size_t>(bucket(batch))];
    const double token_ns = b.rate[0] > 0 ? 1 / b.rate[0] : price.plain_token_ns;
    if (token_ns <= 0) return true;
    return static_cast<double>(price.remaining_tokens) * token_ns * gain >= price.catchup_ns;
}

bool SpecGate::speculate(int64_t batch, bool measurable, double predicted,
                         const SwitchPrice& price) {
    if (!o_.measure) return true;
    if (batch <= 0) return false;  // prefill only: the first drafts come one step later
    const int index = bucket(batch);
    Bucket& b = buckets_[static_cast<size_t>(index)];
    // A switch on (the engine has rows to catch up: its last steps were plain) that its
    // catch-up does not pay for is not made, whatever the bucket's run says.
    may_switch_on_ = switch_pays(batch, predicted, price);
    if (!measurable) return b.has_winner && !b.probing && b.on && may_switch_on_;
    if (!b.started) start_bucket(index, predicted);
    if (b.on && !may_switch_on_) start_run(b, true, false, 0);  // priced out: holds plain
    if (b.left <= 0) decide(b, !(predicted > 0 && predicted < o_.min_predicted));
    may_switch_on_ = true;
    --b.left;
    probe_steps_[b.on ? 1 : 0] += b.probing ? 1 : 0;
    return b.on;
}

void SpecGate::observe(bool speculated, int64_t batch, int64_t tokens, int64_t period_ns) {
    Bucket& b = buckets_[static_cast<size_t>(bucket(batch))];
    if (period_ns <= 0 || tokens < 0 || !b.started || speculated != b.on) return;
    if (b.fresh) {
        b.fresh = false;
        return;
    }
    // Recent steps weigh most (the rate drifts as contexts grow and prompts change).
    b.run_tokens = kDecay * b.run_tokens + static_cast<double>(tokens);
    b.run_ns = kDecay * b.run_ns + static_cast<double>(period_ns);
    b.run_steps = kDecay * b.run_steps + 1;
    b.rate[b.on ? 1 : 0] = b.run_tokens / b.run_ns;
    b.step_ns[b.on ? 1 : 0] = b.run_ns / b.run_steps;
}

}  // namespace dsi::spec
