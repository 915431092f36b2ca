#include "engine/prefill_cost_model.h"

#include <gtest/gtest.h>

namespace dsi::engine {
namespace {

TEST(PrefillCostModelTest, CostIsQuadraticAndZeroForEmptyChunk) {
    PrefillCostModel m{10, 2, 1, 0.5, 0.25};
    EXPECT_EQ(m.cost_ns(0, 100), 0.0);
    // 10 + 2*4 + 1*8 + 0.5*4*8 + 0.25*16
    EXPECT_DOUBLE_EQ(m.cost_ns(4, 8), 10 + 8 + 8 + 16 + 4);
}

TEST(PrefillCostModelTest, SolverFindsLargestFittingChunk) {
    PrefillCostModel m;
    ASSERT_TRUE(m.validate().is_ok());
    for (int64_t c : {0, 1000, 100000, 500000}) {
        for (double budget : {1e6, 5e7, 3e8, 1e9, 2e9}) {
            const int64_t q = m.max_chunk_tokens(budget, c, 1 << 30);
            if (q > 0) {
                EXPECT_LE(m.cost_ns(q, c), budget);
            }
            if (q < kMaxPrefillChunkTokens) {
                EXPECT_GT(m.cost_ns(q + 1, c), budget) << "c=" << c << " budget=" << budget;
            }
        }
    }
}

TEST(PrefillCostModelTest, SolverCapsAndLimits) {
    PrefillCostModel m;
    EXPECT_EQ(m.max_chunk_tokens(1e18, 0, 1 << 30), kMaxPrefillChunkTokens);  // S-LB cap
    EXPECT_EQ(m.max_chunk_tokens(1e18, 0, 100), 100);  // what is left of the sequence
    EXPECT_EQ(m.max_chunk_tokens(1.0, 0, 100), 0);     // not one token fits
    EXPECT_EQ(m.max_chunk_tokens(1e9, 0, 0), 0);
}

TEST(PrefillCostModelTest, LinearModelSolves) {
    PrefillCostModel m{0, 100, 0, 0, 0};
    ASSERT_TRUE(m.validate().is_ok());
    EXPECT_EQ(m.max_chunk_tokens(1000, 0, 1000), 10);
}

TEST(PrefillCostModelTest, RejectsNegativeOrDegenerate) {
    PrefillCostModel m;
    m.per_qc_ns = -1;
    EXPECT_FALSE(m.validate().is_ok());
    PrefillCostModel z{0, 0, 0, 0, 0};
    EXPECT_FALSE(z.validate().is_ok());
}

}  // namespace
}  // namespace dsi::engine
