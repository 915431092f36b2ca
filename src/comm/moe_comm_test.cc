// Pure parts of the EP all-to-all: placement tables, routing, the EPLB glue.
#include "comm/moe_comm.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cluster/eplb.h"
#include "comm/expert_load.h"

namespace dsi::comm {
namespace {

MoeShape shape(int ranks, int slots) {
    MoeShape s;
    s.num_ranks = ranks;
    s.hidden = 8;
    s.top_k = 2;
    s.max_tokens_per_rank = 4;
    s.slots_per_rank = slots;
    return s;
}

TEST(PlacementTableTest, ReplicasAscendAndEmptySlotsAllowed) {
    auto t = PlacementTable::create(3, 2, 3, {0, 1, -1, 2, 0, 1});
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_EQ(std::vector<int>(t->replicas(0).begin(), t->replicas(0).end()),
              (std::vector<int>{0, 4}));
    EXPECT_EQ(std::vector<int>(t->replicas(2).begin(), t->replicas(2).end()),
              (std::vector<int>{3}));
}

TEST(PlacementTableTest, RejectsMissingExpertAndBadIds) {
    auto missing = PlacementTable::create(4, 2, 2, {0, 1, 2, 2});
    ASSERT_FALSE(missing.is_ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(missing.status().message().find("expert 3 has no slot"), std::string::npos);
    EXPECT_EQ(PlacementTable::create(2, 2, 1, {0, 7}).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(PlacementTable::create(2, 2, 2, {0, 1}).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(PlacementTable::identity(5, 2, 4).status().code(), StatusCode::kInvalidArgument);
}

TEST(RouteTokensTest, ReplicaChoices) {
    // Expert 0 on rank 0 slot 0 and rank 1 slot 1; expert 1 on rank 1 slot 0.
    auto t = PlacementTable::create(2, 2, 2, {0, 1, 1, 0});
    ASSERT_TRUE(t.is_ok());
    const std::vector<int32_t> ids = {0, 1, 0, 1};  // 2 tokens x top_k 2
    MoeLayout first, local, spread;
    ASSERT_TRUE(route_tokens(shape(2, 2), *t, 1, ids, 2, ReplicaChoice::kFirst, first).is_ok());
    EXPECT_EQ(first.dst_rank, (std::vector<int32_t>{0, 0, 0, 0}));
    EXPECT_EQ(first.send_counts, (std::vector<int32_t>{4, 0}));
    ASSERT_TRUE(
        route_tokens(shape(2, 2), *t, 1, ids, 2, ReplicaChoice::kLocalFirst, local).is_ok());
    EXPECT_EQ(local.dst_rank, (std::vector<int32_t>{1, 1, 1, 1}));
    EXPECT_EQ(local.dst_slot, (std::vector<int32_t>{1, 0, 1, 0}));
    // Expert 0 twice per token: replica (token * 2 + 0 + k) % 2 alternates with k.
    ASSERT_TRUE(route_tokens(shape(2, 2), *t, 0, {{0, 0, 0, 0}}, 2, ReplicaChoice::kSpread, spread)
                    .is_ok());
    EXPECT_EQ(spread.dst_rank, (std::vector<int32_t>{0, 1, 0, 1}));
    EXPECT_EQ(spread.dst_slot, (std::vector<int32_t>{0, 1, 0, 1}));
    // Expert 0 always at k = 0: from rank 1 kSpread sends every row to replica
    // (2t + 1 + 0) % 2 = 1; round robin alternates (source rank 1 starts at replica 1).
    MoeLayout robin;
    ASSERT_TRUE(
        route_tokens(shape(2, 2), *t, 1, {{0, 1, 0, 1, 0, 1}}, 3, ReplicaChoice::kRoundRobin, robin)
            .is_ok());
    EXPECT_EQ(robin.dst_rank, (std::vector<int32_t>{1, 1, 0, 0, 1, 1}));
    EXPECT_EQ(robin.dst_slot, (std::vector<int32_t>{1, 0, 0, 1, 1, 0}));
}

TEST(RouteTokensTest, MalformedInput) {
    auto t = PlacementTable::identity(4, 2, 2);
    ASSERT_TRUE(t.is_ok());
    MoeLayout l;
    Status bad_id = route_tokens(shape(2, 2), *t, 0, {{0, 1, 2, 99}}, 2, ReplicaChoice::kFirst, l);
    EXPECT_EQ(bad_id.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad_id.message().find("token 1, k 1: expert 99"), std::string::npos)
        << bad_id.message();
    std::vector<int32_t> many(10, 0);
    EXPECT_EQ(route_tokens(shape(2, 2), *t, 0, many, 5, ReplicaChoice::kFirst, l).code(),
              StatusCode::kResourceExhausted);
    EXPECT_EQ(route_tokens(shape(2, 2), *t, 0, {{0, 1, 2}}, 2, ReplicaChoice::kFirst, l).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(route_tokens(shape(4, 2), *t, 0, {{0, 1}}, 1, ReplicaChoice::kFirst, l).code(),
              StatusCode::kInvalidArgument);
}

TEST(CombineInOrderTest, SumsInTopKOrderFromZero) {
    // y rows: (t, k) -> constant row; gate 0.5 / 0.25.
    const std::vector<float> rows = {1, 2, 3, 4, 5, 6, 7, 8};  // 2 tokens x 2 k x hidden 2
    std::vector<float> out(4, -1.0f);
    const std::vector<float> gate = {0.5f, 0.25f, 1.0f, -1.0f};
    combine_in_order(2, 2, 2, gate, out,
                     [&](int t, int k) { return rows.data() + (t * 2 + k) * 2; });
    EXPECT_EQ(out,
              (std::vector<float>{0.5f * 1 + 0.25f * 3, 0.5f * 2 + 0.25f * 4, 5 - 7.0f, 6 - 8.0f}));
}

// Every combine kernel this CPU runs gives the bits of the plain loop (one multiply and
// one add per element, k in order, from +0.0f), at widths that hit each variant's vector
// body and scalar tail, with values whose sums round.
TEST(CombineKernelTest, EveryVariantGivesThePlainLoopsBits) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (const int hidden : {1, 7, 63, 64, 100, 7168}) {
        for (const int top_k : {1, 3, 8}) {
            std::vector<std::vector<float>> rows(static_cast<size_t>(top_k),
                                                 std::vector<float>(static_cast<size_t>(hidden)));
            std::vector<const float*> ptrs;
            std::vector<float> w(static_cast<size_t>(top_k));
            for (int k = 0; k < top_k; ++k) {
                for (float& v : rows[static_cast<size_t>(k)]) {
                    v = u(rng);
                }
                rows[static_cast<size_t>(k)][0] = -0.0f;  // -0 products: the sum starts at +0
                ptrs.push_back(rows[static_cast<size_t>(k)].data());
                w[static_cast<size_t>(k)] = u(rng);
            }
            std::vector<float> want(static_cast<size_t>(hidden));
            for (int h = 0; h < hidden; ++h) {
                volatile float acc = 0.0f;  // volatile: no contraction into an FMA
                for (int k = 0; k < top_k; ++k) {
                    volatile float p = w[static_cast<size_t>(k)] * ptrs[static_cast<size_t>(k)][h];
                    acc = acc + p;
                }
                want[static_cast<size_t>(h)] = acc;
            }
            for (const CombineKernel& kernel : combine_kernels()) {
                std::vector<float> got(static_cast<size_t>(hidden), 42.0f);
                kernel.fn(got.data(), ptrs.data(), w.data(), top_k, hidden);
                EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
                    << kernel.isa << ", hidden " << hidden << ", top_k " << top_k;
            }
        }
    }
    EXPECT_STREQ(combine_kernels().back().isa, "generic");
}

TEST(ExpertLoadTest, CountsFeedTheEplbControllerAndItsPlacementFeedsLayout) {
    const int layers = 2, experts = 8, ranks = 2;
    ExpertLoadCounter counter(layers, experts);
    ASSERT_TRUE(counter.add(0, {{0, 0, 0, 1, 7}}).is_ok());
    ASSERT_TRUE(counter.add(1, {{3, 3}}).is_ok());
    EXPECT_EQ(counter.add(2, {{0}}).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(counter.add(0, {{8}}).code(), StatusCode::kInvalidArgument);
    std::vector<double> other(layers * experts, 0.0);
    other[0] = 1;
    ASSERT_TRUE(counter.merge(other).is_ok());
    EXPECT_EQ(counter.step_loads()[0], 4.0);
    EXPECT_EQ(counter.step_loads()[1], 1.0);
    EXPECT_EQ(counter.step_loads()[experts + 3], 2.0);
    EXPECT_EQ(counter.merge({{1.0}}).code(), StatusCode::kInvalidArgument);

    cluster::EplbSettings settings = cluster::EplbSettings::prefill_defaults();
    settings.redundant_experts_per_rank = 1;
    settings.window_steps = 10;
    settings.rebalance_interval_steps = 10;
    const int physical = cluster::num_physical_experts(experts, ranks, 1);
    cluster::EplbController controller(settings, layers, experts,
                                       cluster::EplbLayout{1, 1, ranks, physical});
    for (int step = 0; step < 10; ++step) {
        ASSERT_TRUE(controller.record_step(counter.step_loads()).is_ok());
    }
    ASSERT_TRUE(controller.rebalance_due());
    auto placement = controller.rebalance();
    ASSERT_TRUE(placement.is_ok()) << placement.status().to_string();
    for (int layer = 0; layer < layers; ++layer) {
        auto table = layer_placement(placement->phy_to_log, physical, layer, experts, ranks);
        ASSERT_TRUE(table.is_ok()) << table.status().to_string();
        EXPECT_EQ(table->slots_per_rank(), physical / ranks);
        EXPECT_GE(table->replicas(layer == 0 ? 0 : 3).size(),
                  2u);  // the hot expert got a spare slot
    }
    EXPECT_EQ(layer_placement(placement->phy_to_log, physical, 2, experts, ranks).status().code(),
              StatusCode::kInvalidArgument);
    counter.reset();
    EXPECT_EQ(counter.step_loads()[0], 0.0);
    // Per-slot rows of a layout (expert 0 twice: slots 0 and 3) -> per-expert loads.
    auto table = PlacementTable::create(experts, 2, 5, {0, 1, 2, 3, 4, 5, 6, 7, 0, -1});
    ASSERT_TRUE(table.is_ok());
    ASSERT_TRUE(counter.add_slot_rows(1, *table, {{2, 1, 0, 0, 0, 0, 0, 4, 3, 0}}).is_ok());
    EXPECT_EQ(counter.step_loads()[experts + 0], 5.0);
    EXPECT_EQ(counter.step_loads()[experts + 7], 4.0);
    EXPECT_EQ(counter.add_slot_rows(1, *table, {{2, 1}}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsi::comm
