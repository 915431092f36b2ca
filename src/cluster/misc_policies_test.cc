// Tests of the small policies: VE LB, decode drain, EP failover, capacity arithmetic.
#include <gtest/gtest.h>

#include <map>

#include "base/env.h"
#include "cluster/capacity.h"
#include "cluster/drain.h"
#include "cluster/ep_failover.h"
#include "cluster/ve_lb.h"

namespace dsi::cluster {
namespace {

TEST(VeLbTest, PatchesAndFewestPatchesDevice) {
    EXPECT_EQ(*image_patches(448, 224, 14), 32 * 16);
    EXPECT_EQ(*image_patches(20, 20, 14), 1);
    EXPECT_FALSE(image_patches(10, 10, 0).is_ok());
    std::vector<VeMachine> m(3);
    m[0].patches_in_flight = {5, 1, 1};
    m[1].up = false;
    m[1].patches_in_flight = {0};
    m[2].patches_in_flight = {3, 9, 0, 2};
    VeLb lb(1);
    std::map<int, int> machines;
    for (int i = 0; i < 200; ++i) {
        auto c = lb.choose(m);
        ASSERT_TRUE(c.is_ok());
        ASSERT_NE(c->machine, 1);  // down
        EXPECT_EQ(c->device, c->machine == 0 ? 1 : 2);
        machines[c->machine]++;
    }
    EXPECT_GT(machines[0], 50);  // random machine: both used
    EXPECT_GT(machines[2], 50);
    VeLb same(1);
    EXPECT_EQ(same.choose(m)->machine, VeLb(1).choose(m)->machine);  // seeded
    for (auto& x : m) {
        x.up = false;
    }
    EXPECT_EQ(lb.choose(m).status().code(), StatusCode::kUnavailable);
}

TEST(DrainTest, GracePeriodThenMoveAllInOneGo) {
    FakeClockEnv env(0);
    DecodeDrain drain;
    DecodeLb lb;
    ASSERT_TRUE(drain.start(1, env.now_ns()).is_ok());
    EXPECT_FALSE(drain.start(1, env.now_ns()).is_ok());
    EXPECT_TRUE(drain.is_draining(1));
    env.advance_ns(59'999'999'999);
    EXPECT_TRUE(drain.due(env.now_ns()).empty());
    env.advance_ns(1);
    ASSERT_EQ(drain.due(env.now_ns()), std::vector<int>{1});

    std::vector<DecodeRankState> ranks(3);
    ranks[0].num_requests = 2;
    ranks[0].kv_tokens = 1000;
    ranks[1].num_requests = 3;
    ranks[1].kv_tokens = 3000;
    ranks[2].kv_capacity_tokens = 1500;
    std::vector<DecodeRequestView> unfinished = {{10, 500}, {11, 2000}, {12, 500}};
    DrainPlan p = drain.plan(1, unfinished, ranks, lb);
    EXPECT_EQ(p.moves.size() + p.unplaced.size(), 3u);  // every request accounted for
    int64_t moved_kv = 0;
    for (const auto& mv : p.moves) {
        EXPECT_NE(mv.to, 1);
        EXPECT_EQ(mv.from, 1);
        moved_kv += mv.kv_tokens;
    }
    EXPECT_EQ(moved_kv, 3000);  // KV conserved
    EXPECT_EQ(p.moves[0].request_id, 11u);  // largest first
    EXPECT_FALSE(drain.is_draining(1));
}

TEST(DrainTest, UnplacedWhenNoRoom) {
    DecodeDrain drain;
    ASSERT_TRUE(drain.start(0, 0).is_ok());
    std::vector<DecodeRankState> ranks(2);
    ranks[1].kv_capacity_tokens = 10;
    std::vector<DecodeRequestView> unfinished = {{1, 100}};
    DrainPlan p = drain.plan(0, unfinished, ranks, DecodeLb());
    EXPECT_TRUE(p.moves.empty());
    EXPECT_EQ(p.unplaced, std::vector<uint64_t>{1});
}

TEST(EpFailoverTest, RestartWithHealthyDevices) {
    std::vector<bool> healthy(64, true);
    healthy[5] = false;
    auto p = plan_ep_restart(healthy, 384, 1, 8);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->ep_size, 63);
    EXPECT_EQ(p->devices.size(), 63u);
    EXPECT_EQ(p->devices[5], 6);
    EXPECT_EQ(p->num_physical_experts % 63, 0);
    EXPECT_GE(p->num_physical_experts, 384 + 63);
    std::vector<bool> full(64, true);
    EXPECT_EQ(plan_ep_restart(full, 384, 1, 8)->experts_per_rank, 7);  // S-EPLB: EP64 -> 7
    std::vector<bool> few(8, false);
    few[0] = few[1] = true;
    EXPECT_EQ(plan_ep_restart(few, 384, 1, 4).status().code(), StatusCode::kUnavailable);
    EXPECT_FALSE(plan_ep_restart(full, 0, 1, 1).is_ok());
}

TEST(CapacityTest, DocumentNumbers) {
    CapacitySettings s;
    EXPECT_EQ(swa_state_bytes_per_sequence(s), 1'415'040);  // S-KV-8
    auto z = store_servers_for_devices(s, 64);
    ASSERT_TRUE(z.is_ok());
    // 64 x 14.4 TB x 1.2 = 1105.92 TB over 614.6 TB per server -> 2 servers.
    EXPECT_EQ(z->servers, 2);
    EXPECT_NEAR(z->raw_bytes, 1105.92e12, 1e6);
    EXPECT_EQ(*devices_for_tokens_per_day(155e12, 10000), 179399);
    EXPECT_DOUBLE_EQ(*tokens_per_day_for_devices(1, 1000), 86.4e6);
    EXPECT_FALSE(devices_for_tokens_per_day(1, 0).is_ok());
    EXPECT_FALSE(store_servers_for_devices(s, -1).is_ok());
}

}  // namespace
}  // namespace dsi::cluster
