#include "cluster/eplb.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/env.h"
#include "cluster/eplb_live.h"

namespace dsi::cluster {
namespace {

// DeepSeek's public EPLB example: 2 layers, 12 experts in 4 groups, 16 physical
// experts on 2 nodes x 4 GPUs, and the placement its README prints.
const std::vector<double> kExampleLoad = {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,
                                          20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27};
const std::vector<int> kExamplePhyToLog = {5, 6,  5, 7, 8, 4,  3, 4, 10, 9, 10, 2, 0, 1, 11, 1,
                                           7, 10, 6, 8, 6, 11, 8, 9, 2,  4, 5,  1, 5, 0, 3,  1};

EplbLayout example_layout() { return EplbLayout{4, 2, 8, 16}; }

TEST(EplbTest, ReproducesPublishedExample) {
    auto p = place_experts(kExampleLoad, 2, 12, example_layout(), /*refine=*/false);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    ASSERT_TRUE(p->validate().is_ok()) << p->validate().to_string();
    EXPECT_EQ(p->phy_to_log, kExamplePhyToLog);
}

TEST(EplbTest, RefineNeverWorseThanReference) {
    auto ref = place_experts(kExampleLoad, 2, 12, example_layout(), false);
    auto ours = place_experts(kExampleLoad, 2, 12, example_layout(), true);
    ASSERT_TRUE(ours.is_ok());
    ASSERT_TRUE(ours->validate().is_ok());
    EXPECT_LE(moe_lb(*ours, kExampleLoad).max, moe_lb(*ref, kExampleLoad).max + 1e-12);
    EXPECT_EQ(ours->replica_count, ref->replica_count);
}

TEST(EplbTest, PhysicalCountRoundsUpToEpMultiple) {
    EXPECT_EQ(num_physical_experts(256, 32, 4), 384);
    EXPECT_EQ(num_physical_experts(384, 64, 1), 448);  // 7 per rank at EP64
    EXPECT_EQ(num_physical_experts(256, 6, 1), 264);   // 262 -> 264
    EXPECT_EQ(EplbSettings::decode_defaults().window_steps, 1000);
    EXPECT_EQ(EplbSettings::decode_defaults().rebalance_interval_steps, 10000);
    EXPECT_EQ(EplbSettings::prefill_defaults().redundant_experts_per_rank, 4);
}

std::vector<double> zipf_loads(int layers, int experts, double s, uint64_t seed) {
    SplitMix64 rng(seed);
    std::vector<double> w(static_cast<size_t>(layers) * experts);
    for (int l = 0; l < layers; ++l) {
        // A random permutation of ranks per layer, Zipf weights with noise.
        std::vector<int> perm(experts);
        for (int i = 0; i < experts; ++i) {
            perm[i] = i;
        }
        for (int i = experts - 1; i > 0; --i) {
            std::swap(perm[i], perm[rng.next() % (i + 1)]);
        }
        for (int e = 0; e < experts; ++e) {
            w[static_cast<size_t>(l) * experts + perm[e]] =
                1e6 / std::pow(e + 1.0, s) * (0.9 + 0.2 * rng.next_double());
        }
    }
    return w;
}

TEST(EplbTest, SkewedDecodeLoadsAtEp64) {
    const int layers = 4, experts = 384, ep = 64;
    EplbLayout layout{8, 8, ep, num_physical_experts(experts, ep, 1)};
    const auto w = zipf_loads(layers, experts, 0.8, 3);
    auto p = place_experts(w, layers, experts, layout);
    ASSERT_TRUE(p.is_ok());
    ASSERT_TRUE(p->validate().is_ok()) << p->validate().to_string();
    auto ident = identity_placement(layers, experts, layout);
    ASSERT_TRUE(ident.is_ok());
    ASSERT_TRUE(ident->validate().is_ok());
    const MoeLb before = moe_lb(*ident, w);
    const MoeLb after = moe_lb(*p, w);
    EXPECT_LT(after.max, before.max);
    EXPECT_GE(after.mean, 1.0);
    // Global policy (groups do not divide over nodes) is valid too.
    EplbLayout global{5, 8, ep, layout.num_physical};
    auto g = place_experts(w, layers, experts, global);
    ASSERT_TRUE(g.is_ok());
    EXPECT_TRUE(g->validate().is_ok());
}

TEST(EplbTest, RejectsBadInput) {
    EXPECT_FALSE(place_experts(kExampleLoad, 2, 11, example_layout()).is_ok());  // size
    EXPECT_FALSE(place_experts(kExampleLoad, 2, 12, EplbLayout{4, 3, 8, 16}).is_ok());
    EXPECT_FALSE(place_experts(kExampleLoad, 2, 12, EplbLayout{4, 2, 8, 10}).is_ok());
    std::vector<double> neg = kExampleLoad;
    neg[3] = -1;
    EXPECT_FALSE(place_experts(neg, 2, 12, example_layout()).is_ok());
    neg[3] = NAN;
    EXPECT_FALSE(place_experts(neg, 2, 12, example_layout()).is_ok());
}

TEST(EplbTest, ValidateCatchesBrokenPlacement) {
    auto p = place_experts(kExampleLoad, 2, 12, example_layout());
    ASSERT_TRUE(p.is_ok());
    ExpertPlacement bad = *p;
    bad.phy_to_log[0] = bad.phy_to_log[1];  // expert 5 loses a copy, count mismatch
    EXPECT_FALSE(bad.validate().is_ok());
    bad = *p;
    bad.phy_to_log[3] = 99;
    EXPECT_FALSE(bad.validate().is_ok());
}

TEST(EplbTest, ControllerWindowAndInterval) {
    EplbSettings s{1, 10, 25, true};
    EplbController c(s, 2, 12, example_layout());
    std::vector<double> step(24, 0.0);
    EXPECT_FALSE(c.record_step(std::vector<double>(5)).is_ok());
    for (int i = 0; i < 24; ++i) {
        step.assign(24, 0.0);
        step[i % 24] = 1.0;
        ASSERT_TRUE(c.record_step(step).is_ok());
        EXPECT_FALSE(c.rebalance_due());
    }
    ASSERT_TRUE(c.record_step(kExampleLoad).is_ok());
    EXPECT_TRUE(c.rebalance_due());
    // The window holds the last 10 steps only: steps 15..23 and the example load.
    auto w = c.window_load();
    double total = 0;
    for (double v : w) {
        total += v;
    }
    double example_total = 0;
    for (double v : kExampleLoad) {
        example_total += v;
    }
    EXPECT_DOUBLE_EQ(total, example_total + 9);
    auto p = c.rebalance();
    ASSERT_TRUE(p.is_ok());
    EXPECT_FALSE(c.rebalance_due());
    EXPECT_EQ(c.steps(), 25);
}

TEST(EplbTest, LeastLoadedReplicaAbsorbsSkew) {
    // 2 ranks x 2 slots: rank 0 = {B, A}, rank 1 = {A, C}; A is replicated.
    ExpertPlacement p;
    p.num_layers = 1;
    p.num_logical = 3;
    p.num_physical = 4;
    p.num_ranks = 2;
    p.phy_to_log = {1, 0, 0, 2};
    p.replica_index = {0, 0, 1, 0};
    p.replica_count = {2, 1, 1};
    ASSERT_TRUE(p.validate().is_ok());
    const std::vector<double> load = {10, 10, 0};  // A, B, C
    const auto even = rank_loads(p, load, 0, ReplicaDispatch::kEvenSplit);
    EXPECT_DOUBLE_EQ(even[0], 15);
    EXPECT_DOUBLE_EQ(even[1], 5);
    const auto dyn = rank_loads(p, load, 0, ReplicaDispatch::kLeastLoadedReplica);
    EXPECT_DOUBLE_EQ(dyn[0] + dyn[1], 20);  // every token lands somewhere, once
    EXPECT_NEAR(dyn[0], 10, 10.0 / kDispatchChunks);
    EXPECT_NEAR(moe_lb(p, load, ReplicaDispatch::kLeastLoadedReplica).max, 1.0,
                1.0 / kDispatchChunks);
    EXPECT_DOUBLE_EQ(moe_lb(p, load).max, 1.5);
    // A hot unreplicated expert cannot be helped.
    const std::vector<double> hot_b = {0, 30, 0};
    EXPECT_DOUBLE_EQ(moe_lb(p, hot_b, ReplicaDispatch::kLeastLoadedReplica).max, 2.0);
}

TEST(EplbTest, ControllerSmoothingOverCompletedWindows) {
    const int n = 24;  // 2 layers x 12 experts
    auto run = [&](EplbSmoothing mode, int windows, double alpha) {
        EplbSettings s{1, 4, 1000, false, mode, windows, alpha};
        EplbController c(s, 2, 12, example_layout());
        // Window k (4 steps) puts 1 per step on expert k only: window sums are 4 x e_k.
        for (int k = 0; k < 5; ++k) {
            std::vector<double> step(n, 0.0);
            step[k] = 1.0;
            for (int i = 0; i < 4; ++i) {
                EXPECT_TRUE(c.record_step(step).is_ok());
            }
        }
        EXPECT_EQ(c.num_completed_windows(), 5);
        return c.estimated_load();
    };
    const auto last = run(EplbSmoothing::kLastWindow, 10, 0.2);
    EXPECT_DOUBLE_EQ(last[4], 4);
    EXPECT_DOUBLE_EQ(last[3], 0);
    const auto mean3 = run(EplbSmoothing::kMeanOfWindows, 3, 0.2);  // windows 2, 3, 4
    EXPECT_DOUBLE_EQ(mean3[0], 0);
    EXPECT_DOUBLE_EQ(mean3[1], 0);
    EXPECT_DOUBLE_EQ(mean3[2], 4.0 / 3);
    EXPECT_DOUBLE_EQ(mean3[4], 4.0 / 3);
    const auto ema = run(EplbSmoothing::kEma, 10, 0.5);
    // ema = w0, then ema += 0.5 (w - ema): weights 1/16, 1/16, 1/8, 1/4, 1/2.
    EXPECT_DOUBLE_EQ(ema[0], 4.0 / 16);
    EXPECT_DOUBLE_EQ(ema[3], 4.0 / 4);
    EXPECT_DOUBLE_EQ(ema[4], 4.0 / 2);
    EXPECT_FALSE((EplbSettings{1, 4, 10, true, EplbSmoothing::kEma, 10, 0.0}).validate().is_ok());
    EXPECT_FALSE(
        (EplbSettings{1, 4, 10, true, EplbSmoothing::kMeanOfWindows, 0, 0.2}).validate().is_ok());
    EXPECT_FALSE(
        (EplbSettings{1, 4, 10, true, EplbSmoothing::kMeanOfWindows, 65, 0.2}).validate().is_ok());
}

TEST(EplbTest, PhaseDefaultsFollowSpec) {
    const EplbSettings p = EplbSettings::prefill_defaults();
    const EplbSettings d = EplbSettings::decode_defaults();
    EXPECT_EQ(p.redundant_experts_per_rank, 4);
    EXPECT_EQ(p.window_steps, 100);
    EXPECT_EQ(p.rebalance_interval_steps, 1000);
    EXPECT_EQ(d.redundant_experts_per_rank, 1);
    EXPECT_EQ(d.window_steps, 1000);
    EXPECT_EQ(d.rebalance_interval_steps, 10000);
    // Smoothing (ours): EMA over completed windows in both phases.
    EXPECT_EQ(p.smoothing, EplbSmoothing::kEma);
    EXPECT_EQ(d.smoothing, EplbSmoothing::kEma);
    EXPECT_DOUBLE_EQ(d.ema_alpha, 0.2);
}

// The live policy (eplb_live.h): decides only when the interval is due, on the window's
// loads, and two instances fed the same loads decide the same (what keeps ranks in step).
TEST(LiveEplbPolicyTest, DecidesEveryIntervalDeterministically) {
    EplbSettings st;
    st.redundant_experts_per_rank = 1;
    st.window_steps = 2;
    st.rebalance_interval_steps = 3;
    st.smoothing = EplbSmoothing::kLastWindow;
    auto make = live_eplb_factory(st);
    auto a = make(2, 8, 2);
    auto b = make(2, 8, 2);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    std::vector<double> load(16, 1.0);
    load[3] = 30;  // a hot expert in layer 0
    load[8 + 6] = 20;
    int decisions = 0;
    for (int step = 1; step <= 6; ++step) {
        ASSERT_TRUE((*a)->record_step(load).is_ok());
        ASSERT_TRUE((*b)->record_step(load).is_ok());
        auto da = (*a)->decide();
        auto db = (*b)->decide();
        ASSERT_TRUE(da.is_ok() && db.is_ok());
        EXPECT_EQ(da->phy_to_log, db->phy_to_log);
        EXPECT_EQ(da->phy_to_log.empty(), step % 3 != 0) << "step " << step;
        if (da->phy_to_log.empty()) continue;
        ++decisions;
        ASSERT_EQ(da->phy_to_log.size(), 2u * 10u);  // 8 + 1 per rank, 2 layers
        // Both spare slots of layer 0 go to its hot expert (30 / 3 replicas > 1); the best
        // split of 10 + 10 + 10 + 7 x 1 over two ranks of 5 slots is 23 / 18.5.
        EXPECT_EQ(std::count(da->phy_to_log.begin(), da->phy_to_log.begin() + 10, 3), 3);
        EXPECT_NEAR(da->moe_lb_on_window, (23.0 / 18.5 + 1.0) / 2, 0.2);
    }
    EXPECT_EQ(decisions, 2);
    EXPECT_EQ((*a)->record_step(std::vector<double>(3)).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(make(2, 8, 9).status().code(), StatusCode::kInvalidArgument);  // ranks > experts
}

}  // namespace
}  // namespace dsi::cluster
