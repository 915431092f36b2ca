#include "cluster/decode_lb.h"

#include <gtest/gtest.h>

#include <vector>

#include "base/env.h"

namespace dsi::cluster {
namespace {

DecodeRankState rank(int n, int64_t kv) {
    DecodeRankState r;
    r.num_requests = n;
    r.kv_tokens = kv;
    return r;
}

TEST(DecodeLbTest, ShortRequestGoesToLowConcurrencyHighKv) {
    DecodeLb lb;
    // Mean context = (10*1000 + 4*20000 + 4*2000 + 10*1000) / 28.
    std::vector<DecodeRankState> r = {rank(10, 10000), rank(4, 80000), rank(4, 8000),
                                      rank(10, 10000)};
    auto c = lb.choose(r, 500, 600);
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(*c, 1);  // few requests, much KV
}

TEST(DecodeLbTest, LongRequestGoesToLeastKv) {
    DecodeLb lb;
    std::vector<DecodeRankState> r = {rank(10, 10000), rank(4, 80000), rank(4, 8000),
                                      rank(2, 9000)};
    auto c = lb.choose(r, 50000, 51000);
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(*c, 2);
}

TEST(DecodeLbTest, SkipsFullAndDrainingRanks) {
    DecodeLb lb;
    std::vector<DecodeRankState> r = {rank(1, 10), rank(0, 0), rank(5, 100)};
    r[1].accepting = false;
    r[0].max_requests = 1;
    auto c = lb.choose(r, 10, 10);
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(*c, 2);
    r[2].kv_capacity_tokens = 105;
    EXPECT_EQ(lb.choose(r, 10, 10).status().code(), StatusCode::kResourceExhausted);
}

TEST(DecodeLbTest, ACountBelowZeroIsARankWithRoom) {
    // Counts are the caller's (the router's bookkeeping); -1 is a count, not "none fits"
    // (a sentinel that once refused every request once an engine's count went to -1).
    DecodeLb lb;
    std::vector<DecodeRankState> r = {rank(-1, 0)};
    auto c = lb.choose(r, 10, 10);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(*c, 0);
}

TEST(DecodeLbTest, EmptyClusterPicksFirstRank) {
    DecodeLb lb;
    std::vector<DecodeRankState> r(3);
    auto c = lb.choose(r, 100, 100);
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(*c, 0);
}

TEST(DecodeLbTest, BalancesCountsAndKvOverManyRequests) {
    DecodeLb lb;
    std::vector<DecodeRankState> r(8);
    for (auto& x : r) {
        x.max_requests = 1 << 20;
        x.kv_capacity_tokens = int64_t{1} << 40;
    }
    SplitMix64 rng(7);
    for (int i = 0; i < 4000; ++i) {
        const int64_t len = rng.next_double() < 0.1 ? 30000 : 1000;
        auto c = lb.choose(r, len, len);
        ASSERT_TRUE(c.is_ok());
        r[*c].num_requests++;
        r[*c].kv_tokens += len;
    }
    int min_n = 1 << 30, max_n = 0;
    int64_t min_kv = INT64_MAX, max_kv = 0;
    for (const auto& x : r) {
        min_n = std::min(min_n, x.num_requests);
        max_n = std::max(max_n, x.num_requests);
        min_kv = std::min(min_kv, x.kv_tokens);
        max_kv = std::max(max_kv, x.kv_tokens);
    }
    EXPECT_LE(max_n - min_n, 30);
    EXPECT_LT(static_cast<double>(max_kv) / min_kv, 1.1);
}

TEST(DecodeLbTest, Baselines) {
    std::vector<DecodeRankState> r = {rank(3, 0), rank(1, 0), rank(2, 0)};
    EXPECT_EQ(*decode_choose_least_loaded(r, 1), 1);
    DecodeRoundRobin rr;
    EXPECT_EQ(*rr.choose(r, 1), 0);
    EXPECT_EQ(*rr.choose(r, 1), 1);
    r[2].accepting = false;
    EXPECT_EQ(*rr.choose(r, 1), 0);
}

}  // namespace
}  // namespace dsi::cluster
