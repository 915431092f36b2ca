#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace dsi {
namespace {

TEST(SamplerTest, GreedyPicksMaxLowestOnTie) {
    std::vector<float> l = {0.1f, 3.0f, -2.0f, 3.0f};
    EXPECT_EQ(argmax(l), 1);
    EXPECT_EQ(sample_token(l, SamplingParams{}, 0), 1);
}

TEST(SamplerTest, SameSeedAndPositionSameToken) {
    std::vector<float> l(100);
    for (int i = 0; i < 100; ++i) l[i] = static_cast<float>(i % 7) * 0.3f;
    SamplingParams p;
    p.temperature = 1.0;
    p.seed = 99;
    for (uint64_t pos = 0; pos < 50; ++pos) {
        EXPECT_EQ(sample_token(l, p, pos), sample_token(l, p, pos));
    }
    // Different positions give a spread of tokens.
    std::vector<int> seen(100);
    for (uint64_t pos = 0; pos < 2000; ++pos) seen[sample_token(l, p, pos)]++;
    int distinct = 0;
    for (int s : seen) distinct += s > 0;
    EXPECT_GT(distinct, 20);
}

TEST(SamplerTest, DistributionMatchesSoftmax) {
    std::vector<float> l = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
    SamplingParams p;
    p.temperature = 1.0;
    p.seed = 5;
    int ones = 0;
    const int n = 20000;
    for (int pos = 0; pos < n; ++pos) ones += sample_token(l, p, static_cast<uint64_t>(pos)) == 1;
    EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.015);
}

TEST(SamplerTest, TopKAndTopPRestrict) {
    std::vector<float> l = {5.0f, 4.9f, 0.0f, -1.0f};
    SamplingParams p;
    p.temperature = 10.0;
    p.top_k = 2;
    for (uint64_t pos = 0; pos < 500; ++pos) EXPECT_LT(sample_token(l, p, pos), 2);
    p.top_k = 0;
    p.top_p = 0.01;
    for (uint64_t pos = 0; pos < 100; ++pos) EXPECT_EQ(sample_token(l, p, pos), 0);
}

TEST(SamplerTest, ValidatesParams) {
    SamplingParams p;
    p.temperature = -1;
    EXPECT_EQ(validate_sampling(p).code(), StatusCode::kInvalidArgument);
    p = {};
    p.top_p = 0;
    EXPECT_FALSE(validate_sampling(p).is_ok());
    p = {};
    p.top_k = -3;
    EXPECT_FALSE(validate_sampling(p).is_ok());
    EXPECT_TRUE(validate_sampling(SamplingParams{}).is_ok());
}

}  // namespace
}  // namespace dsi
