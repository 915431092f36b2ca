#include "cluster/prefill_lb.h"

#include <gtest/gtest.h>

namespace dsi::cluster {
namespace {

PrefillWork work(uint64_t id, int64_t tokens, double cost) {
    return PrefillWork{id, tokens, cost, 0};
}

TEST(PrefillLbTest, BucketsByContextLength) {
    PrefillLb lb({}, 4, 0);
    EXPECT_EQ(lb.bucket_of(0), 0);
    EXPECT_EQ(lb.bucket_of(16383), 0);
    EXPECT_EQ(lb.bucket_of(16384), 1);
    EXPECT_EQ(lb.bucket_of(65535), 1);
    EXPECT_EQ(lb.bucket_of(65536), 2);
    EXPECT_EQ(lb.bucket_of(262143), 2);
    EXPECT_EQ(lb.bucket_of(262144), 3);
    EXPECT_EQ(lb.bucket_of(1 << 20), 3);
}

TEST(PrefillLbTest, ApportionFollowsDemandWithMinimumOne) {
    auto c = PrefillLb::apportion(10, {900, 100, 0, 0});
    EXPECT_EQ(c[0] + c[1] + c[2] + c[3], 10);
    EXPECT_EQ(c[0], 9);
    EXPECT_EQ(c[1], 1);
    EXPECT_EQ(c[2], 0);
    c = PrefillLb::apportion(8, {1000, 1, 1, 1});  // tiny buckets still get one engine
    EXPECT_EQ(c[0], 5);
    EXPECT_EQ(c[1], 1);
    EXPECT_EQ(c[2], 1);
    EXPECT_EQ(c[3], 1);
    c = PrefillLb::apportion(2, {1, 1, 1, 1});  // fewer engines than buckets
    EXPECT_EQ(c[0] + c[1] + c[2] + c[3], 2);
    c = PrefillLb::apportion(4, {0, 0, 0, 0});
    EXPECT_EQ(c[0] + c[1] + c[2] + c[3], 0);
}

TEST(PrefillLbTest, ReassignsAtRoundEndFromDemand) {
    PrefillLbSettings s;
    s.round_ns = 1000;
    s.reassign = PrefillReassign::kProportional;
    PrefillLb lb(s, 8, 0);
    EXPECT_EQ(lb.engines_per_bucket(), (std::array<int, 4>{2, 2, 2, 2}));
    for (int i = 0; i < 30; ++i) {
        lb.submit(work(i, 1000, 1e6));  // bucket 0
    }
    lb.submit(work(100, 100000, 10e6));  // bucket 2
    EXPECT_FALSE(lb.tick(999));          // round not over yet
    EXPECT_TRUE(lb.tick(1000));
    // demand 30e6 vs 10e6: 6 + 2 of 8 engines.
    EXPECT_EQ(lb.engines_per_bucket(), (std::array<int, 4>{6, 0, 2, 0}));
    EXPECT_EQ(lb.num_reassignments(), 1);
    // Stability: engines that were in bucket 0 (0, 1) stay there.
    EXPECT_EQ(lb.engine_bucket(0), 0);
    EXPECT_EQ(lb.engine_bucket(1), 0);
    // No demand in the next round: assignment kept.
    while (lb.num_pending() > 0) {
        for (int e = 0; e < 8; ++e) {
            (void)lb.pull(e, 0);
        }
    }
    EXPECT_FALSE(lb.tick(2000));
    EXPECT_EQ(lb.engines_per_bucket(), (std::array<int, 4>{6, 0, 2, 0}));
}

TEST(PrefillLbTest, MinMaxCompletionGivesLongRequestsTheirOwnEngines) {
    // 1,000 short requests (0.1 s each) and 4 long ones (10 s each) on 10 engines.
    // Proportional: 40 / 140 of 10 = 3 engines for the 4 long ones, so one waits ~10 s.
    const std::array<double, 4> demand = {100e9, 0, 40e9, 0};
    const std::array<double, 4> longest = {0.1e9, 0, 10e9, 0};
    const std::array<int, 4> max_engines = {1000, 0, 4, 0};
    EXPECT_EQ(PrefillLb::apportion(10, demand)[2], 3);
    const auto split = PrefillLb::min_max_completion_split(10, demand, longest, max_engines);
    EXPECT_NEAR(split[0] + split[1] + split[2] + split[3], 10.0, 1e-6);
    EXPECT_NEAR(split[2], 4.0, 1e-9);  // capped at its number of requests
    const auto c = PrefillLb::apportion(10, split);
    EXPECT_EQ(c, (std::array<int, 4>{6, 0, 4, 0}));
    // Completion of bucket 0 (100 s / 6 + 0.1 s) is then the latest, and below the
    // proportional split's bucket 2 (40 s / 3 + 10 s).
    EXPECT_LT(100.0 / 6 + 0.1, 40.0 / 3 + 10);
}

TEST(PrefillLbTest, MinMaxCompletionEqualisesWhenUncapped) {
    // Equal longest costs and no caps: the split is proportional to demand.
    const auto split = PrefillLb::min_max_completion_split(8, {30e9, 10e9, 0, 0},
                                                           {1e9, 1e9, 0, 0}, {100, 100, 0, 0});
    EXPECT_NEAR(split[0], 6.0, 1e-6);
    EXPECT_NEAR(split[1], 2.0, 1e-6);
    EXPECT_EQ(split[2], 0.0);
    // Every bucket at its cap: the spare engines are shared by demand, sum kept.
    const auto spare = PrefillLb::min_max_completion_split(8, {10e9, 0, 50e9, 0},
                                                           {1e9, 0, 50e9, 0}, {2, 0, 1, 0});
    EXPECT_NEAR(spare[0] + spare[2], 8.0, 1e-6);
    EXPECT_GE(spare[2], 1.0);
}

TEST(PrefillLbTest, MinMaxReassignmentPutsLongWaitingRequestsFirst) {
    PrefillLbSettings s;
    s.round_ns = 1000;
    PrefillLb lb(s, 10, 0);
    for (int i = 0; i < 1000; ++i) {
        lb.submit(work(i, 1000, 0.1e9));
    }
    for (int i = 0; i < 4; ++i) {
        lb.submit(work(2000 + i, 100000, 10e9));
    }
    EXPECT_TRUE(lb.tick(1000));
    EXPECT_EQ(lb.engines_per_bucket(), (std::array<int, 4>{6, 0, 4, 0}));
}

TEST(PrefillLbTest, PullByRemainingQuotaFifo) {
    PrefillLbSettings s;
    s.bucket_quota_ns = {10, 10, 10, 10};
    s.steal_when_idle = false;
    PrefillLb lb(s, 4, 0);  // engine 0 serves bucket 0
    ASSERT_EQ(lb.engine_bucket(0), 0);
    lb.submit(work(1, 100, 4));
    lb.submit(work(2, 100, 4));
    lb.submit(work(3, 100, 4));
    auto got = lb.pull(0, 0);
    ASSERT_EQ(got.size(), 2u);  // 4 + 4 <= 10 < 12
    EXPECT_EQ(got[0].id, 1u);
    EXPECT_EQ(got[1].id, 2u);
    EXPECT_TRUE(lb.pull(0, 8).empty());  // 8 + 4 > 10
    got = lb.pull(0, 6);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].id, 3u);
    EXPECT_EQ(lb.pending_cost_ns(0), 0.0);
}

TEST(PrefillLbTest, EmptyEngineTakesOversizedHead) {
    PrefillLbSettings s;
    s.bucket_quota_ns = {10, 10, 10, 10};
    PrefillLb lb(s, 4, 0);
    lb.submit(work(1, 100, 50));
    auto got = lb.pull(0, 0);
    ASSERT_EQ(got.size(), 1u);  // larger than the cap, taken and chunked
    EXPECT_EQ(got[0].id, 1u);
}

TEST(PrefillLbTest, IdleEngineStealsOnlyWhenEnabledAndEmpty) {
    PrefillLbSettings s;
    s.bucket_quota_ns = {10, 10, 10, 10};
    s.steal_when_idle = false;
    PrefillLb strict(s, 4, 0);
    strict.submit(work(1, 300000, 5));  // bucket 3
    EXPECT_TRUE(strict.pull(0, 0).empty());
    EXPECT_EQ(strict.pull(3, 0).size(), 1u);

    s.steal_when_idle = true;
    PrefillLb lb(s, 4, 0);
    lb.submit(work(1, 300000, 5));
    EXPECT_TRUE(lb.pull(0, 3).empty());  // holds work: no stealing
    EXPECT_EQ(lb.pull(0, 0).size(), 1u);
}

TEST(PrefillLbTest, UnavailableEnginesPullNothingAndAreNotAssigned) {
    PrefillLbSettings s;
    s.round_ns = 10;
    PrefillLb lb(s, 4, 0);
    lb.set_engine_available(2, false);
    lb.submit(work(1, 10, 1));
    EXPECT_TRUE(lb.pull(2, 0).empty());
    EXPECT_TRUE(lb.tick(10));
    EXPECT_EQ(lb.engine_bucket(2), -1);
    auto n = lb.engines_per_bucket();
    EXPECT_EQ(n[0] + n[1] + n[2] + n[3], 3);
}

TEST(PrefillLbTest, SettingsValidate) {
    PrefillLbSettings s;
    s.bucket_upper_tokens = {100, 50, 200};
    EXPECT_FALSE(s.validate().is_ok());
    s = {};
    s.bucket_quota_ns[2] = 0;
    EXPECT_FALSE(s.validate().is_ok());
    s = {};
    s.round_ns = 0;
    EXPECT_FALSE(s.validate().is_ok());
}

}  // namespace
}  // namespace dsi::cluster
