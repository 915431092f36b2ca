#include "cluster/autoscaler.h"

#include <gtest/gtest.h>

#include "base/env.h"

namespace dsi::cluster {
namespace {

AutoscalerSettings settings() {
    AutoscalerSettings s;
    s.prefill_missed_tokens_per_s_per_instance = 1000;
    s.decode_requests_per_instance = 100;
    s.headroom = 1.0;
    s.min_prefill = 2;
    s.max_prefill = 10;
    s.min_decode = 1;
    s.max_decode = 8;
    s.max_step_instances = 3;
    s.scale_out_interval_ns = 10;
    s.scale_in_interval_ns = 100;
    s.spare_pool_target = 2;
    return s;
}

TEST(AutoscalerTest, DemandFromMissedTokensAndRunningRequests) {
    AutoscalerSettings s = settings();
    s.headroom = 1.5;
    Autoscaler a(s);
    EXPECT_EQ(a.prefill_demand(4000), 6);  // 4000 * 1.5 / 1000
    EXPECT_EQ(a.decode_demand(150), 3);    // ceil(225 / 100)
    EXPECT_EQ(a.prefill_demand(-5), 0);
}

TEST(AutoscalerTest, ScaleOutIsRateLimitedAndBounded) {
    FakeClockEnv env(1000);
    Autoscaler a(settings());
    AutoscalerInput in;
    in.missed_tokens_per_s = 50'000;  // wants 50, bounded to 10
    in.online_prefill = 4;
    in.online_decode = 1;
    in.spare_ready_machines = 1;
    ScaleDecision d = a.decide(in, env.now_ns());
    EXPECT_EQ(d.prefill.target, 7);  // +3 per step
    EXPECT_EQ(d.prefill.delta, 3);
    EXPECT_EQ(d.prefill.from_spare, 1);
    EXPECT_EQ(d.provision_spares, 2 + 2);  // 2 more machines + refill pool of 2
    in.online_prefill = 7;
    env.advance_ns(5);
    d = a.decide(in, env.now_ns());
    EXPECT_TRUE(d.prefill.rate_limited);
    EXPECT_EQ(d.prefill.delta, 0);
    env.advance_ns(5);
    d = a.decide(in, env.now_ns());
    EXPECT_EQ(d.prefill.target, 10);  // max bound
}

TEST(AutoscalerTest, NoScaleInAboveUtilisationBound) {
    FakeClockEnv env(1000);
    Autoscaler a(settings());
    AutoscalerInput in;
    in.missed_tokens_per_s = 1000;  // wants 1 -> min 2
    in.online_prefill = 8;
    in.online_decode = 1;
    in.prefill_quota_utilisation = 0.81;
    ScaleDecision d = a.decide(in, env.now_ns());
    EXPECT_TRUE(d.prefill.blocked_by_utilisation);
    EXPECT_EQ(d.prefill.delta, 0);
    in.prefill_quota_utilisation = 0.8;  // at the bound: allowed (S-DEPLOY: "> 0.8")
    d = a.decide(in, env.now_ns());
    EXPECT_FALSE(d.prefill.blocked_by_utilisation);
    EXPECT_EQ(d.prefill.target, 5);  // -3 per step
    env.advance_ns(50);
    in.online_prefill = 5;
    d = a.decide(in, env.now_ns());
    EXPECT_TRUE(d.prefill.rate_limited);
    env.advance_ns(50);
    d = a.decide(in, env.now_ns());
    EXPECT_EQ(d.prefill.target, 2);  // min bound
}

TEST(AutoscalerTest, BelowMinimumRestoresAtOnce) {
    Autoscaler a(settings());
    AutoscalerInput in;
    in.online_prefill = 0;
    in.online_decode = 0;
    ScaleDecision d = a.decide(in, 0);
    EXPECT_EQ(d.prefill.target, 2);
    EXPECT_EQ(d.decode.target, 1);
}

TEST(AutoscalerTest, SettingsValidate) {
    AutoscalerSettings s = settings();
    s.min_prefill = 11;
    EXPECT_FALSE(s.validate().is_ok());
    s = settings();
    s.headroom = 0.5;
    EXPECT_FALSE(s.validate().is_ok());
    s = settings();
    s.scale_in_max_utilisation = 1.5;
    EXPECT_FALSE(s.validate().is_ok());
}

}  // namespace
}  // namespace dsi::cluster
