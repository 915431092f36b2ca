#include "sim/ops_sim.h"

#include <gtest/gtest.h>

namespace dsi::sim {
namespace {

// A short compressed day: 2 h of traffic, fast decisions, so every policy acts.
OpsSimSettings short_day() {
    OpsSimSettings s;
    s.duration_s = 7200;
    s.day_s = 7200;
    s.mean_rate_per_s = 20;
    s.mean_output_tokens = 3000;  // ~100 s of decode: drains end with requests left
    s.autoscaler.decode_requests_per_instance = 300;
    s.autoscaler.scale_in_interval_ns = 60'000'000'000;
    s.autoscaler.max_decode = 32;
    s.autoscaler.max_prefill = 32;
    s.provision_s = 120;
    return s;
}

TEST(OpsSimTest, DiurnalScaleOutAndInConserving) {
    auto r = run_ops_sim(short_day());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(r->conservation_ok);
    EXPECT_EQ(r->finished, r->arrived);
    EXPECT_GT(r->scale_out_decisions, 0);
    EXPECT_GT(r->scale_in_decisions, 0);
    EXPECT_GT(r->max_online_decode, r->min_online_decode);
    // Scale-in went through drains that ended with one migration plan each.
    EXPECT_GT(r->drains_started, 0);
    EXPECT_EQ(r->drains_completed, r->drains_started);
    EXPECT_GT(r->migrated_kv_tokens, 0);
    // Deterministic.
    auto again = run_ops_sim(short_day());
    ASSERT_TRUE(again.is_ok());
    EXPECT_EQ(again->migrated_kv_tokens, r->migrated_kv_tokens);
    EXPECT_EQ(again->device_hours, r->device_hours);
}

TEST(OpsSimTest, NoScaleInWhileUtilisationHigh) {
    OpsSimSettings s = short_day();
    s.autoscaler.scale_in_max_utilisation = 0.001;  // every scale-in with load is blocked
    s.initial_decode = 1;  // nothing to scale in before traffic starts
    s.initial_prefill = 1;
    auto r = run_ops_sim(s);
    ASSERT_TRUE(r.is_ok());
    EXPECT_TRUE(r->conservation_ok);
    EXPECT_GT(r->blocked_by_utilisation, 0);
    // Drains only once traffic has stopped and nothing runs (utilisation 0).
    for (const OpsPoint& p : r->timeline) {
        if (p.draining > 0) {
            EXPECT_GE(p.t_s, s.duration_s);
        }
    }
}

TEST(OpsSimTest, DeviceFailureRestartsSmallerAndReroutes) {
    OpsSimSettings s = short_day();
    s.fail_at_s = 3600;
    s.fail_devices = 2;
    auto r = run_ops_sim(s);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(r->conservation_ok);
    EXPECT_EQ(r->failures, 1);
    EXPECT_EQ(r->restart_ep_size, 6);  // 8 devices, 2 failed
    EXPECT_GT(r->rerouted_requests, 0);
    bool saw_restart = false;
    for (const OpsPoint& p : r->timeline) {
        saw_restart = saw_restart || p.restarting > 0;
    }
    EXPECT_TRUE(saw_restart);
}

TEST(OpsSimTest, RejectsBadSettings) {
    OpsSimSettings s;
    s.step_s = 0;
    EXPECT_FALSE(run_ops_sim(s).is_ok());
    s = OpsSimSettings{};
    s.fail_devices = 9;
    EXPECT_FALSE(run_ops_sim(s).is_ok());
}

}  // namespace
}  // namespace dsi::sim
