// Operations inside the request-level simulator: drains, failures, autoscaling
// (sim/sim_operations.cc).
#include <gtest/gtest.h>

#include "sim/simulator.h"

namespace dsi::sim {
namespace {

workload::Trace ops_trace(int64_t n, uint64_t seed, double input_median_tokens = 4000) {
    workload::SyntheticTraceSettings s;
    s.input_median_tokens = input_median_tokens;
    s.num_requests = n;
    s.seed = seed;
    s.rate_per_s = 100;
    s.long_context_fraction = 0.0;
    s.output_median_tokens = 300;  // requests decode for seconds, so drains find work
    return *workload::generate_synthetic_trace(s);
}

// 4 prefill engines; 8 decode ranks in 4 EP instances of 2.
ClusterDescription ops_cluster() {
    ClusterDescription c;
    c.num_prefill = 4;
    c.num_decode = 8;
    c.operations.decode_ep_size = 2;
    c.operations.drain_grace_s = 1;
    c.operations.restart_s = 5;
    return c;
}

void expect_same(const SimResult& a, const SimResult& b) {
    EXPECT_EQ(a.events, b.events);
    EXPECT_EQ(a.makespan_s, b.makespan_s);
    EXPECT_EQ(a.ttft_ms.p99, b.ttft_ms.p99);
    EXPECT_EQ(a.tpot_ms.p99, b.tpot_ms.p99);
    EXPECT_EQ(a.migrated_kv_tokens, b.migrated_kv_tokens);
    EXPECT_EQ(a.rerouted_requests, b.rerouted_requests);
    EXPECT_EQ(a.device_hours, b.device_hours);
}

TEST(SimOperationsTest, DrainMovesRequestsWithTheirKv) {
    const workload::Trace t = ops_trace(2000, 3);
    ClusterDescription c = ops_cluster();
    c.operations.drains = {{5.0, 1}};
    SimOptions o;
    o.time_scale = 1.0;
    auto a = simulate(t, c, o);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    EXPECT_TRUE(a->conservation_ok);
    EXPECT_EQ(a->num_finished, 2000);
    EXPECT_EQ(a->drains_completed, 1);
    EXPECT_GT(a->migrated_requests, 0);
    // Each moved request carries at least its prompt.
    EXPECT_GT(a->migrated_kv_tokens, a->migrated_requests);
    EXPECT_EQ(a->rerouted_requests, 0);  // the other instances had room
    EXPECT_EQ(a->min_online_decode_instances, 3);
    // The drained instance stopped working: less decode time than its peers.
    double drained = 0;
    double others = 0;
    for (int d = 0; d < 8; ++d) {
        (d / 2 == 1 ? drained : others) += a->decode_utilisation[d];
    }
    EXPECT_LT(drained / 2, others / 6);
    auto b = simulate(t, c, o);
    ASSERT_TRUE(b.is_ok());
    expect_same(*a, *b);
}

TEST(SimOperationsTest, FailureReroutesAndRestartsSmaller) {
    const workload::Trace t = ops_trace(2000, 4);
    ClusterDescription c = ops_cluster();
    c.num_decode = 8;
    c.operations.decode_ep_size = 4;
    c.operations.failures = {{6.0, 0, 1}};
    SimOptions o;
    auto a = simulate(t, c, o);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    EXPECT_TRUE(a->conservation_ok);
    EXPECT_EQ(a->num_finished, 2000);
    EXPECT_EQ(a->failures, 1);
    ASSERT_EQ(a->restart_ep_sizes.size(), 1u);
    EXPECT_EQ(a->restart_ep_sizes[0], 3);  // EP size = healthy devices
    EXPECT_GT(a->rerouted_requests, 0);
    // Re-routed requests prefill their prompt plus what they had generated.
    EXPECT_GT(a->rerouted_context_tokens, a->rerouted_requests);
    EXPECT_LE(a->rerouted_hit_tokens, a->rerouted_context_tokens);
    // The failed device's rank never comes back.
    EXPECT_LT(a->decode_utilisation[3], a->decode_utilisation[4] / 2);
    auto b = simulate(t, c, o);
    ASSERT_TRUE(b.is_ok());
    expect_same(*a, *b);
}

TEST(SimOperationsTest, FailureBelowMinimumEpLeavesWorkUnfinished) {
    const workload::Trace t = ops_trace(300, 5);
    ClusterDescription c = ops_cluster();
    c.num_decode = 2;
    c.operations.decode_ep_size = 2;
    c.operations.min_ep_size = 2;
    c.operations.failures = {{1.0, 0, 1}};
    auto r = simulate(t, c, SimOptions{});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->failures, 1);
    EXPECT_TRUE(r->restart_ep_sizes.empty());
    EXPECT_LT(r->num_finished, 300);
    EXPECT_FALSE(r->conservation_ok);  // reported, not hidden
}

TEST(SimOperationsTest, EventsAfterTheTraceChangeNothing) {
    const workload::Trace t = ops_trace(1000, 6);
    ClusterDescription c = ops_cluster();
    auto plain = simulate(t, c, SimOptions{});
    c.operations.drains = {{1e6, 0}};
    c.operations.failures = {{2e6, 1, 1}};
    auto late = simulate(t, c, SimOptions{});
    ASSERT_TRUE(plain.is_ok() && late.is_ok());
    EXPECT_TRUE(late->conservation_ok);
    EXPECT_EQ(plain->makespan_s, late->makespan_s);
    EXPECT_EQ(plain->ttft_ms.p99, late->ttft_ms.p99);
    EXPECT_EQ(plain->tpot_ms.mean, late->tpot_ms.mean);
    EXPECT_EQ(late->migrated_requests, 0);
    EXPECT_EQ(late->rerouted_requests, 0);
}

TEST(SimOperationsTest, AutoscalerFollowsLoadAndSavesDevices) {
    const workload::Trace t = ops_trace(2000, 7, 1000);
    ClusterDescription c = ops_cluster();
    c.num_prefill = 8;
    OperationsSettings& op = c.operations;
    op.autoscale = true;
    op.decision_interval_s = 1;
    op.provision_s = 3;
    op.initial_prefill = 1;
    op.initial_decode_instances = 1;
    op.initial_spare = 1;
    op.autoscaler.prefill_missed_tokens_per_s_per_instance = 100'000;
    op.autoscaler.decode_requests_per_instance = 10;
    op.autoscaler.scale_out_interval_ns = 1'000'000'000;
    op.autoscaler.scale_in_interval_ns = 5'000'000'000;
    op.autoscaler.spare_pool_target = 1;
    SimOptions o;
    o.target_load = 0.5;  // of the whole cluster: about half of it is needed
    auto a = simulate(t, c, o);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    EXPECT_TRUE(a->conservation_ok);
    EXPECT_EQ(a->num_finished, 2000);
    EXPECT_GT(a->scale_in_decisions, 0);
    EXPECT_GT(a->scale_out_decisions, 0);
    EXPECT_EQ(a->min_online_prefill, 1);
    EXPECT_GT(a->max_online_prefill, 1);
    EXPECT_GT(a->max_online_decode_instances, 1);
    EXPECT_LE(a->max_online_prefill, 8);
    EXPECT_LE(a->max_online_decode_instances, 4);
    // Fewer device-hours than holding the whole cluster for the same span.
    EXPECT_LT(a->device_hours, (8 + 8) * a->makespan_s / 3600);
    auto b = simulate(t, c, o);
    ASSERT_TRUE(b.is_ok());
    expect_same(*a, *b);
}

TEST(SimOperationsTest, EveryRoutingConservesUnderOperations) {
    const workload::Trace t = ops_trace(1500, 8);
    ClusterDescription c = ops_cluster();
    c.operations.drains = {{3.0, 2}};
    c.operations.failures = {{4.0, 0, 1}, {3.5, 2, 2}};  // the second hits a draining instance
    for (auto pr : {PrefillRouting::kDeepSeek, PrefillRouting::kRoundRobin,
                    PrefillRouting::kLeastLoaded, PrefillRouting::kPrefixAffinity}) {
        for (auto dr : {DecodeRouting::kDeepSeek, DecodeRouting::kRoundRobin,
                        DecodeRouting::kLeastLoaded}) {
            SimOptions o;
            o.prefill_routing = pr;
            o.decode_routing = dr;
            o.store = pr == PrefillRouting::kPrefixAffinity ? StoreKind::kPerEngine
                                                            : StoreKind::kShared;
            auto r = simulate(t, c, o);
            ASSERT_TRUE(r.is_ok()) << r.status().to_string();
            EXPECT_TRUE(r->conservation_ok)
                << prefill_routing_name(pr) << "/" << decode_routing_name(dr);
            EXPECT_EQ(r->num_finished, 1500);
            EXPECT_EQ(r->failures, 2);
        }
    }
}

TEST(SimOperationsTest, ParsesAndRejectsOperations) {
    auto c = parse_cluster_description(R"({"num_decode": 8, "operations": {
        "decode_ep_size": 4, "drain_grace_s": 30, "restart_s": 60, "autoscale": true,
        "drains": [{"at_s": 10, "instance": 1}],
        "failures": [{"at_s": 20, "instance": 0, "devices": 2}],
        "autoscaler": {"max_decode": 2, "scale_in_interval_s": 120, "headroom": 1.5}}})");
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->decode_ep(), 4);
    EXPECT_TRUE(c->operations.enabled());
    ASSERT_EQ(c->operations.failures.size(), 1u);
    EXPECT_EQ(c->operations.failures[0].devices, 2);
    EXPECT_EQ(c->operations.drains[0].instance, 1);
    EXPECT_EQ(c->operations.autoscaler.scale_in_interval_ns, 120'000'000'000);
    EXPECT_EQ(c->operations.autoscaler.headroom, 1.5);
    const char* bad[] = {
        R"({"operations": []})",
        R"({"operations": {"bogus": 1}})",
        R"({"num_decode": 8, "operations": {"decode_ep_size": 3}})",
        R"({"num_decode": 8, "operations": {"decode_ep_size": 4, "drains": [{"at_s": 1, "instance": 2}]}})",
        R"({"num_decode": 8, "operations": {"drains": [{"at_s": -1, "instance": 0}]}})",
        R"({"num_decode": 8, "operations": {"drains": {"at_s": 1}}})",
        R"({"num_decode": 8, "operations": {"drains": [{"at_s": 1, "instance": 0, "x": 1}]}})",
        R"({"num_decode": 8, "operations": {"decode_ep_size": 4, "failures": [{"at_s": 1, "instance": 0, "devices": 5}]}})",
        R"({"num_decode": 8, "operations": {"failures": [{"at_s": 1, "instance": 0, "devices": 0}]}})",
        R"({"operations": {"autoscale": 1}})",
        R"({"operations": {"autoscale": true, "autoscaler": {"headroom": 0}}})",
        R"({"operations": {"autoscaler": {"nope": 1}}})",
        R"({"operations": {"autoscaler": {"scale_in_interval_s": -5}}})",
        R"({"operations": {"restart_s": -1}})",
        R"({"operations": {"decision_interval_s": 0}})",
        R"({"operations": {"initial_prefill": 65}})",
        R"({"operations": {"decode_ep_size": 99999999999}})",
    };
    for (const char* b : bad) {
        auto r = parse_cluster_description(b);
        EXPECT_FALSE(r.is_ok()) << b;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << b;
    }
}

}  // namespace
}  // namespace dsi::sim
