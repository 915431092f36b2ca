#include "sim/simulator.h"

#include <gtest/gtest.h>


namespace dsi::sim {
namespace {

workload::Trace small_trace(int64_t n, uint64_t seed, double long_fraction = 0.02) {
    workload::SyntheticTraceSettings s;
    s.num_requests = n;
    s.seed = seed;
    s.rate_per_s = 50;
    s.long_context_fraction = long_fraction;
    s.output_median_tokens = 50;
    return *workload::generate_synthetic_trace(s);
}

ClusterDescription small_cluster() {
    ClusterDescription c;
    c.num_prefill = 8;
    c.num_decode = 8;
    return c;
}

TEST(SimulatorTest, DeterministicAndConserving) {
    const workload::Trace t = small_trace(3000, 5);
    SimOptions o;
    o.target_load = 0.8;
    auto a = simulate(t, small_cluster(), o);
    auto b = simulate(t, small_cluster(), o);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok());
    EXPECT_TRUE(a->conservation_ok);
    EXPECT_EQ(a->num_finished, 3000);
    EXPECT_EQ(a->hit_tokens + a->computed_tokens, a->input_tokens);
    EXPECT_EQ(a->decoded_tokens, a->expected_decode_tokens);
    EXPECT_EQ(a->events, b->events);
    EXPECT_EQ(a->makespan_s, b->makespan_s);
    EXPECT_EQ(a->ttft_ms.p99, b->ttft_ms.p99);
    EXPECT_GT(a->bucket_requests[3], 0);  // >= 256K requests went through bucket 3
    EXPECT_GT(a->prefill_reassignments, 0);
    EXPECT_GT(a->lb_efficiency, 0.0);
    EXPECT_LE(a->lb_efficiency, 1.0 + 1e-9);
    EXPECT_LE(a->prefill_lb_efficiency, 1.0 + 1e-9);
    EXPECT_GT(a->cost_per_million_tokens, 0.0);
    EXPECT_GT(a->hit_rate, 0.1);
}

// Goodput counts the requests within both SLO bounds: an SLO looser than every request's
// TTFT and TPOT admits all of them, one below the smallest TTFT none, and the share falls
// as the TTFT bound tightens or the load rises.
TEST(SimulatorTest, SloAttainmentAndGoodput) {
    const workload::Trace t = small_trace(2000, 9);
    auto run = [&](double load, double ttft_ms, double tpot_ms) {
        SimOptions o;
        o.target_load = load;
        o.slo_ttft_ms = ttft_ms;
        o.slo_tpot_ms = tpot_ms;
        auto r = simulate(t, small_cluster(), o);
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        return *r;
    };
    const SimResult all = run(0.8, 1e12, 1e12);
    EXPECT_DOUBLE_EQ(all.slo_attainment, 1.0);
    EXPECT_DOUBLE_EQ(all.goodput_requests_per_s, all.num_finished / all.makespan_s);
    const SimResult none = run(0.8, 0.0, 1e12);
    EXPECT_DOUBLE_EQ(none.slo_attainment, 0.0);
    EXPECT_DOUBLE_EQ(none.goodput_requests_per_s, 0.0);
    const SimResult p50 = run(0.8, all.ttft_ms.p50, 1e12);
    EXPECT_GT(p50.slo_attainment, 0.45);
    EXPECT_LT(p50.slo_attainment, 0.55);
    const SimResult tight_tpot = run(0.8, 1e12, all.tpot_ms.p50);
    EXPECT_LT(tight_tpot.slo_attainment, 0.55);
    EXPECT_GE(run(0.5, all.ttft_ms.p90, 1e12).slo_attainment,
              run(1.0, all.ttft_ms.p90, 1e12).slo_attainment);
}

TEST(SimulatorTest, TimelineMatchesUtilisation) {
    const workload::Trace t = small_trace(2000, 7);
    SimOptions o;
    o.target_load = 0.9;
    o.timeline_bin_ns = 500'000'000;
    auto r = simulate(t, small_cluster(), o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_FALSE(r->timeline.empty());
    double busy = 0;
    for (const TimelinePoint& p : r->timeline) {
        EXPECT_GE(p.prefill_busy, 0.0);
        EXPECT_LE(p.prefill_busy, 1.0 + 1e-9);
        EXPECT_LE(p.decode_busy, 1.0 + 1e-9);
        EXPECT_GE(p.prefill_waiting, 0);
        busy += p.prefill_busy * 0.5;  // engine-shares x seconds
    }
    double util = 0;
    for (double u : r->prefill_utilisation) {
        util += u / r->prefill_utilisation.size();
    }
    EXPECT_NEAR(busy, util * r->makespan_s, 0.01 * busy + 1e-6);
    o.timeline_bin_ns = -1;
    EXPECT_FALSE(simulate(t, small_cluster(), o).is_ok());
}

TEST(SimulatorTest, MinMaxReassignmentNoWorseOnLongContexts) {
    const workload::Trace t = small_trace(3000, 11, 0.05);
    SimOptions o;
    o.target_load = 0.9;
    auto minmax = simulate(t, small_cluster(), o);
    o.prefill_lb.reassign = cluster::PrefillReassign::kProportional;
    auto proportional = simulate(t, small_cluster(), o);
    ASSERT_TRUE(minmax.is_ok() && proportional.is_ok());
    EXPECT_TRUE(minmax->conservation_ok);
    EXPECT_TRUE(proportional->conservation_ok);
    EXPECT_GE(minmax->lb_efficiency, proportional->lb_efficiency - 0.01);
    EXPECT_LE(minmax->bucket_ttft_ms[3].max, proportional->bucket_ttft_ms[3].max * 1.01);
}

TEST(SimulatorTest, EveryPolicyAndStoreModeConserves) {
    const workload::Trace t = small_trace(1500, 9);
    for (auto pr : {PrefillRouting::kDeepSeek, PrefillRouting::kRoundRobin,
                    PrefillRouting::kLeastLoaded, PrefillRouting::kPrefixAffinity}) {
        for (auto dr : {DecodeRouting::kDeepSeek, DecodeRouting::kRoundRobin,
                        DecodeRouting::kLeastLoaded}) {
            for (auto store : {StoreKind::kShared, StoreKind::kPerEngine}) {
                if (pr == PrefillRouting::kDeepSeek && store == StoreKind::kPerEngine) {
                    continue;
                }
                SimOptions o;
                o.prefill_routing = pr;
                o.decode_routing = dr;
                o.store = store;
                o.target_load = 0.9;
                auto r = simulate(t, small_cluster(), o);
                ASSERT_TRUE(r.is_ok()) << r.status().to_string();
                EXPECT_TRUE(r->conservation_ok)
                    << prefill_routing_name(pr) << "/" << decode_routing_name(dr);
                EXPECT_EQ(r->num_finished, 1500);
            }
        }
    }
}

TEST(SimulatorTest, StoreCapacityAndTtlLowerHitRate) {
    const workload::Trace t = small_trace(3000, 11, 0.0);
    ClusterDescription c = small_cluster();
    SimOptions o;
    o.time_scale = 1.0;
    const double unlimited = simulate(t, c, o)->hit_rate;
    c.store_capacity_tokens = 100'000;
    const double small = simulate(t, c, o)->hit_rate;
    c.store_capacity_tokens = 0;
    c.store_ttl_ns = 1'000'000'000;
    const double short_ttl = simulate(t, c, o)->hit_rate;
    EXPECT_GT(unlimited, small);
    EXPECT_GT(unlimited, short_ttl);
}

TEST(SimulatorTest, RejectsBadInputs) {
    const workload::Trace t = small_trace(10, 1);
    SimOptions o;
    o.store = StoreKind::kPerEngine;  // DeepSeek LB needs the shared store
    EXPECT_FALSE(simulate(t, small_cluster(), o).is_ok());
    ClusterDescription c = small_cluster();
    c.num_decode = 0;
    EXPECT_FALSE(simulate(t, c, SimOptions{}).is_ok());
    EXPECT_FALSE(simulate(workload::Trace{}, small_cluster(), SimOptions{}).is_ok());
}

// decode_join_recompute_block: a request whose prompt ends inside a block makes its
// joining decode step compute the prompt's last L mod B tokens; one whose prompt fills
// whole blocks costs nothing more.
TEST(SimulatorTest, DecodeJoinRecomputesThePartialBlock) {
    auto one = [](int32_t input) {
        workload::Trace t;
        t.block_tokens = 512;
        t.blocks = {1};
        t.requests.push_back({0, input, 5, 0, 1});
        return t;
    };
    ClusterDescription c;
    c.num_prefill = 1;
    c.num_decode = 1;
    c.prefill_cost.per_q_ns = 1e6;  // 1 ms a token: the join's share is easy to see
    auto tpot = [&](int32_t input, int64_t block) {
        ClusterDescription cc = c;
        cc.decode_join_recompute_block = block;
        auto r = simulate(one(input), cc, SimOptions{});
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        return r.is_ok() ? r->tpot_ms.mean : -1.0;
    };
    // 200 = 128 + 72: 72 tokens at 1 ms over the 4 tokens after the first.
    EXPECT_NEAR(tpot(200, 128) - tpot(200, 0), 72.0 / 4, 0.5);
    EXPECT_NEAR(tpot(256, 128), tpot(256, 0), 1e-9);
    EXPECT_FALSE(parse_cluster_description(R"({"decode_join_recompute_block": -1})").is_ok());
}

TEST(SimulatorTest, ClusterDescriptionParsing) {
    auto c = parse_cluster_description(
        R"({"num_prefill": 4, "num_decode": 2, "prefill_cost": {"per_q_ns": 1000},
            "store_ttl_ns": 5, "device": "x"})");
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->num_prefill, 4);
    EXPECT_EQ(c->prefill_cost.per_q_ns, 1000);
    EXPECT_EQ(c->device, "x");
    const char* bad[] = {
        "[]",
        "{\"num_prefill\": 0}",
        "{\"num_prefil\": 4}",
        "{\"num_prefill\": 2.5}",
        "{\"num_decode\": \"8\"}",
        "{\"prefill_cost\": {\"per_q_ns\": -1}}",
        "{\"prefill_cost\": {\"bogus\": 1}}",
        "{\"p2d_bytes_per_s\": 0}",
        "{not json",
    };
    for (const char* b : bad) {
        auto r = parse_cluster_description(b);
        EXPECT_FALSE(r.is_ok()) << b;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
}

}  // namespace
}  // namespace dsi::sim
