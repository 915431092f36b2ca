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
