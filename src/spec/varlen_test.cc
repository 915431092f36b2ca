#include "spec/varlen.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace dsi::spec {
namespace {

VerifyCostCurve curve(std::vector<VerifyCostPoint> p) {
    auto c = VerifyCostCurve::create(std::move(p));
    EXPECT_TRUE(c.is_ok()) << c.status().message();
    return std::move(c).value();
}

TEST(AcceptanceEstimatorTest, StartsAtTheDrafterProbabilityAndLearnsTheObservedRate) {
    AcceptanceEstimator e;
    EXPECT_DOUBLE_EQ(e.estimate(0, 0.83f), 0.83f);
    EXPECT_DOUBLE_EQ(e.estimate(3, NAN), 0.5);  // no probability (n-gram): 0.5
    // The drafter says 0.95 but only 1 in 4 is accepted at position 0 in that bin.
    for (int i = 0; i < 400; ++i) e.observe(0, 0.95f, i % 4 == 0);
    EXPECT_NEAR(e.estimate(0, 0.96f), 0.25, 0.02);
    // Another position is untouched; another bin of position 0 starts from its
    // probability scaled by the position's calibration (accepted / sum of probabilities).
    EXPECT_DOUBLE_EQ(e.estimate(1, 0.95f), 0.95f);
    const double calibration = (100 + 4.0) / (400 * static_cast<double>(0.95f) + 4.0);
    EXPECT_NEAR(e.estimate(0, 0.45f), 0.45 * calibration, 1e-6);
    // A drift to always-accepted is followed (counts are halved at the window).
    for (int i = 0; i < 3000; ++i) e.observe(0, 0.95f, true);
    EXPECT_GT(e.estimate(0, 0.95f), 0.97);
    EXPECT_LE(e.observed(0, 0.95f), AcceptanceEstimator::kWindow + 1);
    // The choice explores: an untried position gets +0.5; the bonus shrinks as
    // 0.5 / sqrt(n + 1) with the position's observations (every bin).
    EXPECT_NEAR(e.optimistic(7, 0.1f), 0.6, 1e-6);
    EXPECT_DOUBLE_EQ(e.optimistic(7, 0.9f), 1.0);
    AcceptanceEstimator g;
    for (int i = 0; i < 15; ++i) g.observe(0, 0.2f, false);
    EXPECT_NEAR(g.optimistic(0, 0.2f), g.estimate(0, 0.2f) + 0.125, 1e-12);
    EXPECT_NEAR(g.optimistic(0, 0.7f), g.estimate(0, 0.7f) + 0.125, 1e-12);
    // No bonus once the position has kExploreObservations observations.
    for (int i = 15; i < 32; ++i) g.observe(0, 0.2f, false);
    EXPECT_DOUBLE_EQ(g.optimistic(0, 0.2f), g.estimate(0, 0.2f));
    EXPECT_LT(g.optimistic(0, 0.2f), 0.06);
    // Without a probability, an unexplored position starts from the one before it.
    AcceptanceEstimator chain;
    for (int i = 0; i < 200; ++i) chain.observe(0, NAN, true);
    EXPECT_GT(chain.estimate(1, NAN), 0.97);
    EXPECT_GT(chain.estimate(4, NAN), 0.97);
    for (int i = 0; i < 200; ++i) chain.observe(1, NAN, false);
    EXPECT_LT(chain.estimate(1, NAN), 0.05);
    EXPECT_LT(chain.estimate(2, NAN), 0.05);
    // Positions past the last share its bins; probabilities above 1 are capped.
    for (int i = 0; i < 100; ++i) e.observe(40, NAN, false);
    EXPECT_LT(e.estimate(kMaxSpeculativeTokens - 1, NAN), 0.05);
    EXPECT_LE(e.estimate(5, 7.0f), 1.0);
}

TEST(VerifyCostCurveTest, InterpolatesAndExtrapolatesAndRejectsBadPoints) {
    VerifyCostCurve c = curve({{1, 100}, {5, 140}, {9, 300}});
    EXPECT_DOUBLE_EQ(c.ns(1), 100);
    EXPECT_DOUBLE_EQ(c.ns(0), 100);
    EXPECT_DOUBLE_EQ(c.ns(3), 120);
    EXPECT_DOUBLE_EQ(c.ns(7), 220);
    EXPECT_DOUBLE_EQ(c.ns(13), 460);  // the last slope (40 / token) goes on
    // A measured dip never makes more tokens cheaper than the point before.
    VerifyCostCurve dip = curve({{1, 100}, {2, 90}});
    EXPECT_DOUBLE_EQ(dip.ns(4), 100);

    EXPECT_FALSE(VerifyCostCurve::create({{1, 100}}).is_ok());
    EXPECT_FALSE(VerifyCostCurve::create({{0, 100}, {2, 200}}).is_ok());
    EXPECT_FALSE(VerifyCostCurve::create({{2, 100}, {2, 200}}).is_ok());
    EXPECT_FALSE(VerifyCostCurve::create({{1, 100}, {2, NAN}}).is_ok());
    EXPECT_FALSE(VerifyCostCurve::create({{1, 100}, {2, -1}}).is_ok());
}

TEST(VerifyCostCurveTest, JsonRoundTripAndErrors) {
    VerifyCostCurve c = curve({{1, 100.5}, {8, 400}});
    auto back = VerifyCostCurve::from_json(c.to_json(R"({"threads": 2})"));
    ASSERT_TRUE(back.is_ok()) << back.status().message();
    ASSERT_EQ(back->points().size(), 2u);
    EXPECT_EQ(back->points()[1].tokens, 8);
    EXPECT_DOUBLE_EQ(back->points()[0].ns, 100.5);
    for (const char* bad : {"", "[]", "{\"format\": \"x\", \"points\": []}",
                            R"({"format": 5, "points": [{"tokens": 1, "ns": 2}, {"tokens": 3, "ns": 4}]})",
                            R"({"format": "dsinfer-verify-cost-v1"})",
                            R"({"format": "dsinfer-verify-cost-v1", "points": [{"tokens": 1}]})",
                            R"({"format": "dsinfer-verify-cost-v1", "points": [{"tokens": 1.5, "ns": 2}, {"tokens": 3, "ns": 4}]})"}) {
        EXPECT_FALSE(VerifyCostCurve::from_json(bad).is_ok()) << bad;
    }
}

TEST(ChooseVerifyLengthsTest, WorkedNumbers) {
    // Two requests alone in the step (base 2 tokens, 2 sampled). Step time 10 for up to
    // 4 tokens, then +5 per token: drafts are free up to 2 more tokens, then cost half a
    // step each.
    VerifyCostCurve c = curve({{1, 10}, {4, 10}, {8, 30}});
    const std::vector<double> a{0.9, 0.8, 0.5};  // survivals 0.9, 0.72, 0.36
    const std::vector<double> b{0.6, 0.5};       // survivals 0.6, 0.3
    const std::vector<VarlenRequest> r{{a}, {b}};
    VarlenChoice ch = choose_verify_lengths(r, 2, 2, c);
    // Order: a1 .9, a2 .72, b1 .6, a3 .36, b2 .3. Rates: N=0 2/10 = .2; N=1 2.9/10;
    // N=2 3.62/10 = .362; N=3 4.22/15 = .281; ... best N = 2 (a's first two drafts).
    ASSERT_EQ(ch.lengths.size(), 2u);
    EXPECT_EQ(ch.lengths[0], 2);
    EXPECT_EQ(ch.lengths[1], 0);
    EXPECT_EQ(ch.verified, 2);
    EXPECT_NEAR(ch.expected_accepted, 1.62, 1e-12);
    EXPECT_NEAR(ch.tokens_per_ns, 0.362, 1e-12);
}

TEST(ChooseVerifyLengthsTest, FlatCostVerifiesEverythingAndSteepCostNothing) {
    const std::vector<double> a{0.9, 0.2, 0.1};
    const std::vector<double> b{0.05};
    const std::vector<VarlenRequest> r{{a}, {b}};
    VarlenChoice flat = choose_verify_lengths(r, 2, 2, curve({{1, 10}, {100, 10.0001}}));
    EXPECT_EQ(flat.lengths, (std::vector<int>{3, 1}));
    // Each token costs a full step: a draft pays only if certain, and 1.0 only ties.
    VerifyCostCurve steep = curve({{1, 10}, {2, 20}});
    VarlenChoice none = choose_verify_lengths(r, 2, 2, steep);
    EXPECT_EQ(none.lengths, (std::vector<int>{0, 0}));
    EXPECT_EQ(none.verified, 0);
    // Other sequences' tokens in the step count in the time.
    const std::vector<double> sure{1.0, 1.0};
    const std::vector<VarlenRequest> one{{sure}};
    VerifyCostCurve knee = curve({{1, 10}, {64, 10}, {65, 100}});
    EXPECT_EQ(choose_verify_lengths(one, 1, 1, knee).verified, 2);
    EXPECT_EQ(choose_verify_lengths(one, 64, 5, knee).verified, 0);
    // No requests, no drafts.
    EXPECT_EQ(choose_verify_lengths({}, 3, 3, knee).verified, 0);
    EXPECT_FALSE(choose_verify_lengths({}, 3, 3, knee).pays);
}

// The drafting cost: it makes longer verification worth more (the best N grows) and
// decides whether speculating pays at all.
TEST(ChooseVerifyLengthsTest, DraftingCostDecidesWhetherSpeculationPays) {
    VerifyCostCurve c = curve({{1, 10}, {2, 14}});  // a draft costs 40 % of a step
    const std::vector<double> a{0.9, 0.6, 0.5};    // survivals 0.9, 0.54, 0.27
    const std::vector<VarlenRequest> r{{a}};
    // Free drafting: N=1 (1.9/14 = .136 > 1/10; N=2: 2.44/18 = .136 also ties lower).
    VarlenChoice free_draft = choose_verify_lengths(r, 1, 1, c, 0);
    EXPECT_EQ(free_draft.verified, 1);
    EXPECT_TRUE(free_draft.pays);
    // Drafting costs 8: N=0 gives 1/18; N=1 1.9/22 = .086; N=2 2.44/26 = .094; N=3
    // 2.71/30 = .090: N=2, but not drafting (1/10) is better.
    VarlenChoice costly = choose_verify_lengths(r, 1, 1, c, 8);
    EXPECT_EQ(costly.verified, 2);
    EXPECT_FALSE(costly.pays);
    EXPECT_NEAR(costly.tokens_per_ns, 2.44 / 26, 1e-12);
}

// The choice equals the best of every combination of per-request prefix lengths.
TEST(ChooseVerifyLengthsTest, MatchesBruteForceOverAllPrefixLengths) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int trial = 0; trial < 300; ++trial) {
        const int R = 1 + static_cast<int>(rng() % 3);
        std::vector<std::vector<double>> acc(static_cast<size_t>(R));
        for (auto& v : acc) {
            v.resize(rng() % 4);
            for (double& x : v) x = trial % 5 == 0 ? std::round(u(rng) * 2) / 2 : u(rng);
        }
        std::vector<VarlenRequest> reqs;
        for (const auto& v : acc) reqs.push_back({v});
        const int64_t base = R + static_cast<int64_t>(rng() % 5);
        const double step = 1 + u(rng) * 10;
        VerifyCostCurve c =
            curve({{1, step}, {2 + static_cast<int64_t>(rng() % 6), step * (1 + u(rng))},
                   {20, step * (2 + u(rng) * 6)}});
        VarlenChoice ch = choose_verify_lengths(reqs, base, R, c);
        // Brute force.
        double best = 0;
        std::vector<int> len(static_cast<size_t>(R), 0);
        while (true) {
            double gain = 0;
            int64_t n = 0;
            for (int i = 0; i < R; ++i) {
                double s = 1;
                for (int j = 0; j < len[static_cast<size_t>(i)]; ++j) {
                    s *= acc[static_cast<size_t>(i)][static_cast<size_t>(j)];
                    gain += s;
                }
                n += len[static_cast<size_t>(i)];
            }
            best = std::max(best, (R + gain) / c.ns(base + n));
            int i = 0;
            while (i < R && len[static_cast<size_t>(i)] ==
                                static_cast<int>(acc[static_cast<size_t>(i)].size())) {
                len[static_cast<size_t>(i)] = 0;
                ++i;
            }
            if (i == R) break;
            ++len[static_cast<size_t>(i)];
        }
        EXPECT_NEAR(ch.tokens_per_ns, best, 1e-12 * best) << "trial " << trial;
        int64_t sum = 0;
        for (size_t i = 0; i < ch.lengths.size(); ++i) {
            EXPECT_LE(ch.lengths[i], static_cast<int>(acc[i].size()));
            sum += ch.lengths[i];
        }
        EXPECT_EQ(sum, ch.verified);
    }
}

// A simulated engine loop for SpecGate: each mode has a true output rate (tokens per ns)
// per batch size, measured with +-10 % noise; observations arrive `delay` steps after
// the plan (the asynchronous loop), or at once. Returns the tokens per ns achieved.
struct GateRun {
    int64_t on_steps = 0;
    int64_t steps = 0;
    double tokens = 0;
    double ns = 0;
    double rate() const { return tokens / ns; }
};
template <typename RateFn>
GateRun run_gate(SpecGate& gate, int64_t batch, int steps, RateFn true_rate, int delay = 0,
                 uint32_t seed = 1, double predicted = 0) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> noise(0.9, 1.1);
    GateRun r;
    // Speculating emits 1.5 tokens per sequence and step (batch: even).
    std::vector<std::pair<bool, double>> pending;  // (mode, period) in plan order
    for (int i = 0; i < steps; ++i) {
        const bool on = gate.speculate(batch, true, predicted);
        const double tokens = static_cast<double>(batch) * (on ? 1.5 : 1.0);
        const double period = tokens / (true_rate(i, on) * noise(rng));
        r.on_steps += on ? 1 : 0;
        ++r.steps;
        r.tokens += tokens;
        r.ns += period;
        pending.push_back({on, period});
        if (static_cast<int>(pending.size()) > delay) {
            auto [m, p] = pending.front();
            pending.erase(pending.begin());
            gate.observe(m, batch, m ? batch * 3 / 2 : batch, std::llround(p));
        }
    }
    return r;
}

TEST(SpecGateTest, BucketsByPowersOfTwo) {
    EXPECT_EQ(SpecGate::bucket(0), 0);
    EXPECT_EQ(SpecGate::bucket(1), 0);
    EXPECT_EQ(SpecGate::bucket(2), 1);
    EXPECT_EQ(SpecGate::bucket(3), 2);
    EXPECT_EQ(SpecGate::bucket(4), 2);
    EXPECT_EQ(SpecGate::bucket(5), 3);
    EXPECT_EQ(SpecGate::bucket(64), 6);
    EXPECT_EQ(SpecGate::bucket(65), 7);
    EXPECT_EQ(SpecGate::bucket(int64_t{1} << 40), SpecGate::kBuckets - 1);
}

TEST(SpecGateTest, HoldsTheFasterModeAndSpendsLittleOnTheOther) {
    for (int delay : {0, 1}) {
        // Speculating 1.5x faster: almost every step speculates.
        SpecGate fast;
        const GateRun a = run_gate(fast, 2, 2000, [](int, bool on) { return on ? 1.5e-6 : 1e-6; },
                                   delay);
        EXPECT_GT(a.on_steps, a.steps * 95 / 100) << "delay " << delay;
        EXPECT_TRUE(fast.mode(2));
        EXPECT_NEAR(fast.rate(2, true) / fast.rate(2, false), 1.5, 0.15);
        // Speculating at 0.6x: almost none does, and the run keeps >= 97 % of the
        // faster mode's rate (the probes' cost).
        SpecGate slow;
        const GateRun b = run_gate(slow, 64, 2000, [](int, bool on) { return on ? 0.6e-6 : 1e-6; },
                                   delay);
        EXPECT_LT(b.on_steps, b.steps * 5 / 100) << "delay " << delay;
        EXPECT_FALSE(slow.mode(64));
        EXPECT_GT(b.rate(), 0.97e-6) << "delay " << delay;
    }
}

TEST(SpecGateTest, BucketsDecideApartAndFollowADrift) {
    SpecGate gate;
    // Batch 2: speculation pays; batch 64: it does not. Interleaved steps.
    for (int i = 0; i < 300; ++i) {
        const auto seed = static_cast<uint32_t>(i);
        run_gate(gate, 2, 1, [](int, bool on) { return on ? 1.6e-6 : 1e-6; }, 0, seed);
        run_gate(gate, 64, 1, [](int, bool on) { return on ? 0.7e-6 : 1e-6; }, 0, seed);
    }
    EXPECT_TRUE(gate.mode(2));
    EXPECT_FALSE(gate.mode(64));
    EXPECT_FALSE(gate.mode(40));  // 33-64: the bucket of 64
    // The batch-2 rates change: speculation stops paying (a harder prompt). Within a
    // longest hold plus two probes the gate has switched, and stays switched.
    SpecGate drift;
    run_gate(drift, 2, 1000, [](int, bool on) { return on ? 1.6e-6 : 1e-6; });
    EXPECT_TRUE(drift.mode(2));
    const SpecGate::Options o;
    const int within = o.max_hold + 2 * o.probe_steps + 1;
    const int64_t switches = drift.switches();
    run_gate(drift, 2, within, [](int, bool on) { return on ? 0.5e-6 : 1e-6; });
    EXPECT_FALSE(drift.mode(2));
    EXPECT_GT(drift.switches(), switches);
    const GateRun later = run_gate(drift, 2, 1000, [](int, bool on) { return on ? 0.5e-6 : 1e-6; });
    EXPECT_LT(later.on_steps, later.steps * 5 / 100);
}

TEST(SpecGateTest, IgnoresBadAndStrayObservations) {
    SpecGate gate;
    gate.observe(true, 8, 100, 1000);  // before any plan of the bucket: ignored
    EXPECT_EQ(gate.rate(8, true), 0);
    EXPECT_FALSE(gate.speculate(8));    // no prior: the first probe does not speculate
    gate.observe(false, 8, 16, 1000);   // the run's first step: not measured
    gate.observe(false, 8, 16, 0);      // no period: ignored
    gate.observe(false, 8, 16, -5);
    gate.observe(false, 8, -1, 1000);
    gate.observe(true, 8, 16, 1000);    // a mode the bucket is not in: ignored
    EXPECT_EQ(gate.rate(8, true), 0);
    EXPECT_EQ(gate.rate(8, false), 0);
    gate.observe(false, 8, 16, 1000);
    EXPECT_DOUBLE_EQ(gate.rate(8, false), 16.0 / 1000);
    gate.observe(false, 8, 8, 1000);
    const double d = SpecGate::kDecay;
    EXPECT_DOUBLE_EQ(gate.rate(8, false), (16.0 * d + 8) / (1000 * d + 1000));
    EXPECT_EQ(gate.switches(), 0);
    // Gate off: always speculates.
    SpecGate always(SpecGate::Options{.measure = false});
    for (int i = 0; i < 50; ++i) EXPECT_TRUE(always.speculate(1 + i));
}

// A new bucket starts from its neighbours' measured speed-up: a clear loss at 33-64
// makes 17-32 start by holding off (no probe of speculation for the hold), a clear gain
// at 2 makes 3-4 start speculating; a bucket with no measured neighbour probes.
TEST(SpecGateTest, NewBucketsStartFromTheirNeighbours) {
    SpecGate gate;
    run_gate(gate, 64, 200, [](int, bool on) { return on ? 0.6e-6 : 1e-6; });
    EXPECT_FALSE(gate.mode(64));
    const GateRun next = run_gate(gate, 32, 40, [](int, bool on) { return on ? 0.6e-6 : 1e-6; });
    EXPECT_EQ(next.on_steps, 0);
    // ... and passes the prior on while the batch keeps shrinking (a round's wind-down).
    for (int64_t b : {16, 8, 4}) {
        const GateRun r = run_gate(gate, b, 10, [](int, bool on) { return on ? 0.6e-6 : 1e-6; });
        EXPECT_EQ(r.on_steps, 0) << b;
    }
    SpecGate up;
    run_gate(up, 2, 200, [](int, bool on) { return on ? 1.6e-6 : 1e-6; });
    EXPECT_TRUE(up.mode(2));
    EXPECT_TRUE(up.speculate(4));
    SpecGate far;
    run_gate(far, 2, 200, [](int, bool on) { return on ? 1.6e-6 : 1e-6; });
    EXPECT_FALSE(far.speculate(16));  // not a neighbour: probes, not speculating first
}

// Steps that also run prefill chunks cannot be measured: they count no probe step and
// get the held mode (not speculating before the probes decided); prefill-only plans
// (batch 0) never speculate.
TEST(SpecGateTest, UnmeasurableStepsTakeTheHeldModeAndCountNothing) {
    SpecGate gate;
    for (int i = 0; i < 100; ++i) EXPECT_FALSE(gate.speculate(8, false));
    EXPECT_FALSE(gate.speculate(0));
    // The probes start only now: 4 steps not speculating, then 4 speculating.
    for (int i = 0; i < 4; ++i) EXPECT_FALSE(gate.speculate(8)) << i;
    EXPECT_TRUE(gate.speculate(8));
    run_gate(gate, 8, 200, [](int, bool on) { return on ? 1.6e-6 : 1e-6; });
    EXPECT_TRUE(gate.mode(8));
    EXPECT_TRUE(gate.speculate(8, false));  // holding speculation
    EXPECT_FALSE(gate.speculate(0));
}

// The curve's prediction, worked by hand. A memory-bound curve (4 tokens cost what 1
// does, then 1 ms a token): at batch 1 verifying 3 drafts of survival 0.9, 0.6, 0.3 gives
// 2.8 tokens in the time of 1; at batch 16 every verified row costs a decoded one, so no
// length pays (each n: (16 + 16 * sum) / (16 * (1 + n)) against 1 token per ms).
TEST(PredictSpeedupTest, WorkedNumbers) {
    const VerifyCostCurve c = VerifyCostCurve::create({{1, 4e6}, {4, 4e6}, {8, 8e6}}).value();
    const std::vector<double> s = {0.9, 0.6, 0.3};
    EXPECT_DOUBLE_EQ(predict_speedup(c, s, 1), 2.8);
    // Batch 2: n = 1 runs 4 tokens (4 ms: 3.8 tokens against 2 in 4 ms); n = 2: 6
    // tokens in 6 ms, 5 tokens; n = 3: 8 in 8 ms, 5.6 tokens: 1.9 is the best.
    EXPECT_DOUBLE_EQ(predict_speedup(c, s, 2), 1.9);
    EXPECT_LT(predict_speedup(c, s, 16), 1.0);
    EXPECT_DOUBLE_EQ(predict_speedup(c, s, 16), 16 * 1.9 / 32 / (16.0 / 16));
    EXPECT_EQ(predict_speedup(c, {}, 4), 0);  // no draft positions: no prediction
    EXPECT_EQ(predict_speedup(c, s, 0), 0);
}

TEST(PredictSpeedupTest, SurvivalsFromVerificationCounts) {
    const double w = kSurvivalPrior;
    // Nothing seen: every draft survives (the curve's bound for perfect drafts).
    EXPECT_EQ(observed_survival(std::vector<int64_t>{0, 0}, std::vector<int64_t>{0, 0}, 2),
              (std::vector<double>{1.0, 1.0}));
    // Position 0 seen (72 of 96 accepted, with the prior 1 of weight w); positions 1
    // and 2 unseen: the conditional acceptance of position 0 carries on; cut at
    // max_drafts.
    const std::vector<double> s =
        observed_survival(std::vector<int64_t>{96, 0, 0, 0}, std::vector<int64_t>{72, 0, 0, 0}, 3);
    ASSERT_EQ(s.size(), 3u);
    const double s0 = (72 + w) / (96 + w);
    EXPECT_DOUBLE_EQ(s[0], s0);
    EXPECT_DOUBLE_EQ(s[1], s0 * s0);
    EXPECT_DOUBLE_EQ(s[2], s0 * s0 * s0);
    // A deep position verified only for confident drafts never shows more than the one
    // before it.
    const std::vector<double> t =
        observed_survival(std::vector<int64_t>{12, 12}, std::vector<int64_t>{6, 12}, 2);
    ASSERT_EQ(t.size(), 2u);
    EXPECT_DOUBLE_EQ(t[0], (6 + w) / (12 + w));
    EXPECT_DOUBLE_EQ(t[1], t[0]);
}

// Where the curve predicts a loss (or a gain below min_predicted), a bucket never probes
// speculating, even when the loop would (here) measure it faster; once the prediction is
// a clear gain it probes, measures
// and holds speculation. A predicted gain decides nothing (a new bucket still probes
// the plain loop first); a measured gain outranks a later predicted loss; a predicted
// loss outranks the neighbours' prior.
TEST(SpecGateTest, ThePredictionBoundsWhatIsProbed) {
    auto faster_on = [](int, bool on) { return on ? 1.6e-6 : 1e-6; };
    SpecGate gate;
    const GateRun lost = run_gate(gate, 64, 500, faster_on, 0, 1, 0.8);
    EXPECT_EQ(lost.on_steps, 0);
    // A predicted gain smaller than what drafting and the loop cost: not probed either.
    const GateRun small = run_gate(gate, 64, 500, faster_on, 0, 1, 1.1);
    EXPECT_EQ(small.on_steps, 0);
    EXPECT_EQ(gate.probe_steps(true), 0);
    EXPECT_EQ(gate.rate(64, true), 0);
    const SpecGate::Options o;
    const GateRun gain = run_gate(gate, 64, 1000, faster_on, 0, 1, 1.3);
    EXPECT_GT(gain.on_steps, gain.steps * 9 / 10);
    EXPECT_TRUE(gate.mode(64));
    EXPECT_LE(gate.probe_steps(true), 2 * o.probe_steps);
    // Measured: the later prediction of a loss does not switch it off.
    const GateRun kept = run_gate(gate, 64, 200, faster_on, 0, 1, 0.8);
    EXPECT_GT(kept.on_steps, kept.steps * 9 / 10);

    SpecGate fresh;
    for (int i = 0; i < 4; ++i) EXPECT_FALSE(fresh.speculate(1, true, 3.0)) << i;
    EXPECT_TRUE(fresh.speculate(1, true, 3.0));  // the probe of speculating
    SpecGate up;
    run_gate(up, 2, 200, faster_on);
    EXPECT_TRUE(up.speculate(4));  // the neighbour's prior ...
    SpecGate up_lost;
    run_gate(up_lost, 2, 200, faster_on);
    const GateRun r = run_gate(up_lost, 4, 100, faster_on, 0, 1, 0.9);
    EXPECT_EQ(r.on_steps, 0);  // ... is not taken against a predicted loss
}

// Pricing a switch on, worked by hand. The tail of a 16-request round (bench/RESULTS.md,
// issue 24): 4 sequences left with 136 tokens of max_tokens to go, the curve's plain
// decode at batch 4 1.2 ms a token, a predicted speed-up of 1.5 — after what
// min_predicted (1.15) stands for, a gain of 1 - 1.15 / 1.5 = 0.2333 of 163.2 ms, i.e.
// 38.08 ms. Catching up their 1,900 deferred rows at 26 us a row (49.4 ms) does not pay;
// at 5 us a row (9.5 ms) it does. Nothing to catch up, or unknown remaining tokens: not
// priced.
TEST(SpecGateTest, SwitchPaysWorkedNumbers) {
    SpecGate gate;
    const SwitchPrice slow{1900 * 26e3, 136, 1.2e6};
    const SwitchPrice cheap{1900 * 5e3, 136, 1.2e6};
    EXPECT_FALSE(gate.switch_pays(4, 1.5, slow));
    EXPECT_TRUE(gate.switch_pays(4, 1.5, cheap));
    // The break-even: 38.08 ms of gain.
    EXPECT_TRUE(gate.switch_pays(4, 1.5, {38.0e6, 136, 1.2e6}));
    EXPECT_FALSE(gate.switch_pays(4, 1.5, {38.2e6, 136, 1.2e6}));
    // Fewer tokens to go: 40 gain 11.2 ms, more than the cheap catch-up's 9.5 ms; 30
    // gain 8.4 ms, less.
    EXPECT_TRUE(gate.switch_pays(4, 1.5, {9.5e6, 40, 1.2e6}));
    EXPECT_FALSE(gate.switch_pays(4, 1.5, {9.5e6, 30, 1.2e6}));
    EXPECT_TRUE(gate.switch_pays(4, 1.5, {0, 136, 1.2e6}));
    EXPECT_TRUE(gate.switch_pays(4, 1.5, {1900 * 26e3, -1, 1.2e6}));
    EXPECT_TRUE(gate.switch_pays(4, 0, slow));  // no prediction

    // A measured plain rate replaces the curve's time per token: 1 token per ms (2 tokens
    // every 2 ms); 60 tokens to go at a predicted 1.5 gain 0.2333 x 60 ms = 14 ms. The
    // measured gain (speculating 1.5x faster here, or slower) does not enter.
    SpecGate measured;
    for (int i = 0; i < 4; ++i) {
        ASSERT_FALSE(measured.speculate(2)) << i;  // the probe of the plain loop
        measured.observe(false, 2, 2, 2'000'000);
    }
    ASSERT_TRUE(measured.speculate(2));
    measured.observe(true, 2, 3, 2'000'000);  // the run's first step: not measured
    ASSERT_TRUE(measured.speculate(2));
    measured.observe(true, 2, 3, 2'000'000);
    ASSERT_NEAR(measured.rate(2, false), 1e-6, 1e-12);
    ASSERT_NEAR(measured.rate(2, true), 1.5e-6, 1e-12);
    EXPECT_FALSE(measured.switch_pays(2, 1.5, {15e6, 60, 9e9}));
    EXPECT_TRUE(measured.switch_pays(2, 1.5, {13e6, 60, 9e9}));
}

// A switch that does not pay is not made: not by a probe (the bucket holds the plain
// loop and asks again), not by a bucket holding speculation when rows are left to catch
// up, not by a step with prefill chunks; one that pays is made as before.
TEST(SpecGateTest, ASwitchThatDoesNotPayIsNotMade) {
    const SwitchPrice no{50e6, 136, 1.2e6};  // 50 ms against 38 ms
    const SwitchPrice yes{5e6, 136, 1.2e6};
    SpecGate gate;
    for (int i = 0; i < 200; ++i) {
        const bool on = gate.speculate(4, true, 1.5, no);
        EXPECT_FALSE(on) << i;
        gate.observe(false, 4, 4, 4'000'000);
    }
    EXPECT_GT(gate.priced_out(), 0);
    EXPECT_EQ(gate.probe_steps(true), 0);
    SpecGate paying;
    int first_on = -1;
    for (int i = 0; i < 20 && first_on < 0; ++i) {
        if (paying.speculate(4, true, 1.5, yes)) first_on = i;
        paying.observe(false, 4, 4, 4'000'000);
    }
    EXPECT_EQ(first_on, SpecGate::Options{}.probe_steps);  // after the plain probe
    EXPECT_EQ(paying.priced_out(), 0);

    // Holding speculation (measured faster at 2), then the plain loop ran (e.g. at
    // another batch) and left rows whose catch-up does not pay: no switch back on.
    SpecGate held;
    run_gate(held, 2, 200, [](int, bool on) { return on ? 1.6e-6 : 1e-6; });
    ASSERT_TRUE(held.mode(2));
    EXPECT_FALSE(held.speculate(2, false, 1.5, {1e9, 10, 1e6}));  // prefill step
    EXPECT_FALSE(held.speculate(2, true, 1.5, {1e9, 10, 1e6}));
    EXPECT_FALSE(held.mode(2));
}

}  // namespace
}  // namespace dsi::spec
