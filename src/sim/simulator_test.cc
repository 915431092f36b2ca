#include "sim/simulator.h"

#include <gtest/gtest.h>

#include <array>
#include <initializer_list>

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

// One prefill and one decode engine with the given prefill cost (ns a prompt token),
// no step overhead, decode steps of `decode_step_ns` flat, no transfer time; the
// worked-number tests of the hops start from it.
ClusterDescription one_and_one(double prefill_ns_per_token, double decode_step_ns) {
    ClusterDescription c;
    c.num_prefill = 1;
    c.num_decode = 1;
    c.prefill_cost = engine::PrefillCostModel{0, prefill_ns_per_token, 0, 0, 0};
    c.prefill_step_overhead_ns = 0;
    c.decode_base_ns = decode_step_ns;
    c.decode_per_request_ns = 0;
    c.decode_per_kv_token_ns = 0;
    c.p2d_bytes_per_s = 1e18;
    return c;
}

// A trace of (arrival ns, prompt tokens, output tokens), each request its own block.
workload::Trace requests_at(std::initializer_list<std::array<int64_t, 3>> rs) {
    workload::Trace t;
    t.block_tokens = 512;
    for (const auto& [at, input, output] : rs) {
        const auto i = static_cast<uint32_t>(t.blocks.size());
        t.blocks.push_back(i + 1);
        t.requests.push_back({at, static_cast<int32_t>(input), static_cast<int32_t>(output), i, 1});
    }
    return t;
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

// The live system's hops (ClusterDescription::prefill_lb_cost, prefill_dispatch_ns,
// prefill_release_ns, p2d_latency_ns) on worked numbers: 100-token prompts sent at 0, 1
// and 1 ms to one prefill engine computing 0.1 ms a token (10 ms a prompt), one decode
// engine of 1 ms steps, the LB's bucket quota 1 s.
TEST(SimulatorTest, RouterPricingDispatchReleaseAndHandOverLatency) {
    const workload::Trace t = requests_at({{0, 100, 2}, {1'000'000, 100, 2}, {1'000'000, 100, 2}});
    const ClusterDescription c = one_and_one(1e5, 1e6);
    auto run = [&](const ClusterDescription& cc) {
        auto r = simulate(t, cc, SimOptions{});
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        return r.is_ok() ? *r : SimResult{};
    };
    // Priced by prefill_cost (10 ms each), the engine pulls prompts 1 and 2 together
    // when prompt 0 (0..10 ms) is done: one 20 ms step, first tokens at 10, 30, 30.
    SimResult r = run(c);
    EXPECT_NEAR(r.ttft_ms.mean, (10 + 29 + 29) / 3.0, 1e-3);
    // Priced at 1 s each (a router's conservative estimate), the quota holds one at a
    // time: 0..10, 10..20, 20..30.
    ClusterDescription lb = c;
    lb.prefill_lb_cost = engine::PrefillCostModel{0, 1e7, 0, 0, 0};
    r = run(lb);
    EXPECT_NEAR(r.ttft_ms.mean, (10 + 19 + 29) / 3.0, 1e-3);
    EXPECT_NEAR(r.ttft_ms.max, 29, 1e-3);
    // Dispatch 2 ms, release 3 ms: prompt 0 runs 2..12; released at 15, prompt 1 is at
    // the engine at 17 and runs 17..27; prompt 2 at 32..42. Each reaches decode 4 ms
    // after its prefill and takes one idle 1 ms step: TPOT 5 ms.
    lb.prefill_dispatch_ns = 2e6;
    lb.prefill_release_ns = 3e6;
    lb.p2d_latency_ns = 4e6;
    r = run(lb);
    EXPECT_NEAR(r.ttft_ms.mean, (12 + 26 + 41) / 3.0, 1e-3);
    EXPECT_NEAR(r.ttft_ms.max, 41, 1e-3);
    EXPECT_NEAR(r.tpot_ms.mean, 5, 1e-3);
    EXPECT_NEAR(r.tpot_ms.max, 5, 1e-3);
    EXPECT_TRUE(r.conservation_ok);
    EXPECT_FALSE(parse_cluster_description(R"({"p2d_latency_ns": -1})").is_ok());
    EXPECT_FALSE(parse_cluster_description(R"({"decode_async_join": 1})").is_ok());
    auto parsed = parse_cluster_description(
        R"({"prefill_lb_cost": {"per_q_ns": 7}, "prefill_dispatch_ns": 1, "prefill_release_ns": 2,
            "p2d_latency_ns": 3, "decode_async_join": true})");
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
    EXPECT_EQ(parsed->prefill_lb_cost->per_q_ns, 7);
    EXPECT_EQ(parsed->prefill_lb_cost->base_ns, parsed->prefill_cost.base_ns);
    EXPECT_TRUE(parsed->decode_async_join);
}

// The hand-over carries full blocks (decode_join_recompute_block 128): a 300-token
// prompt sends 256 tokens of 1,000 B at 100 MB/s, 2.56 ms. The quota is released 3 ms
// after that (prefill_release_ns), the request reaches decode 4 ms after it
// (p2d_latency_ns). Prompt 0 runs 0..30 ms, is released at 35.56, prompt 1 (sent at 1
// ms) runs 35.56..65.56. Each reaches decode 6.56 ms after its prefill and takes one
// step of 1 ms + its join's recompute (300 mod 128 = 44 tokens at 0.1 ms): TPOT 11.96 ms.
TEST(SimulatorTest, TheQuotaIsReleasedAfterTheFullBlocksAreSent) {
    const workload::Trace t = requests_at({{0, 300, 2}, {1'000'000, 300, 2}});
    ClusterDescription c = one_and_one(1e5, 1e6);
    c.prefill_lb_cost = engine::PrefillCostModel{0, 1e7, 0, 0, 0};  // one at a time
    c.decode_join_recompute_block = 128;
    c.kv_bytes_per_token = 1000;
    c.p2d_bytes_per_s = 1e8;
    c.prefill_release_ns = 3e6;
    c.p2d_latency_ns = 4e6;
    auto r = simulate(t, c, SimOptions{});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_NEAR(r->ttft_ms.mean, (30 + 64.56) / 2, 1e-3);
    EXPECT_NEAR(r->tpot_ms.mean, 2.56 + 4 + 1 + 4.4, 1e-3);
    EXPECT_NEAR(r->tpot_ms.max, 2.56 + 4 + 1 + 4.4, 1e-3);
}

// decode_async_join: the engine planned its next step when the running one began, so a
// request arriving during a step joins the step after the next one. Request 0 decodes
// in 10 ms steps from t = 1 ms (steps start at 1, 11, 21, 31, ...); request 1 reaches
// decode at 15 ms, during the step of 11..21: it joins at 21 (its token at 31, TPOT 16
// ms), or asynchronously at 31 (token at 41, TPOT 26 ms). An idle engine takes a
// request at once either way (request 0).
TEST(SimulatorTest, AsyncDecodeJoinsTheStepAfterTheNext) {
    const workload::Trace t = requests_at({{0, 100, 20}, {14'000'000, 100, 2}});
    const ClusterDescription c = one_and_one(1e4, 10e6);  // 1 ms a prompt
    auto tpot_max = [&](bool async) {
        ClusterDescription cc = c;
        cc.decode_async_join = async;
        auto r = simulate(t, cc, SimOptions{});
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        EXPECT_TRUE(r.is_ok() && r->conservation_ok);
        return r.is_ok() ? r->tpot_ms.max : -1.0;
    };
    EXPECT_NEAR(tpot_max(false), 16, 1e-3);
    EXPECT_NEAR(tpot_max(true), 26, 1e-3);
}

// SimOptions::keep_records on the worked example above (asynchronous joins): request 0
// at 0 ms, first token 1, decode steps 1..11, 11..21, ..., its 19th decode token (the
// finish) at 191; request 1 at 14, first token and decode arrival at 15, joins the step
// of 31..41 (its second token and finish at 41).
TEST(SimulatorTest, RecordsTellEachRequestAndDecodeStep) {
    const workload::Trace t = requests_at({{0, 100, 20}, {14'000'000, 100, 2}});
    ClusterDescription c = one_and_one(1e4, 10e6);
    c.decode_async_join = true;
    SimOptions o;
    auto none = simulate(t, c, o);
    ASSERT_TRUE(none.is_ok());
    EXPECT_TRUE(none->requests.empty());
    EXPECT_TRUE(none->decode_steps.empty());
    o.keep_records = true;
    auto r = simulate(t, c, o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_EQ(r->requests.size(), 2u);
    const SimRequestRecord& a = r->requests[0];
    const SimRequestRecord& b = r->requests[1];
    EXPECT_EQ(a.index, 0);
    EXPECT_EQ(a.prompt_tokens, 100);
    EXPECT_EQ(a.output_tokens, 20);
    EXPECT_EQ(a.arrival_ns, 0);
    EXPECT_EQ(a.first_token_ns, 1'000'000);
    EXPECT_EQ(a.decode_arrive_ns, 1'000'000);
    EXPECT_EQ(a.second_token_ns, 11'000'000);
    EXPECT_EQ(a.finish_ns, 191'000'000);
    EXPECT_EQ(a.decode_engine, 0);
    EXPECT_EQ(b.arrival_ns, 14'000'000);
    EXPECT_EQ(b.first_token_ns, 15'000'000);
    EXPECT_EQ(b.decode_arrive_ns, 15'000'000);
    EXPECT_EQ(b.second_token_ns, 41'000'000);
    EXPECT_EQ(b.finish_ns, 41'000'000);
    // 19 steps of request 0, one of them (31..41) with request 1 joining.
    ASSERT_EQ(r->decode_steps.size(), 19u);
    int64_t joined = 0;
    for (size_t i = 0; i < r->decode_steps.size(); ++i) {
        const SimDecodeStep& s = r->decode_steps[i];
        EXPECT_EQ(s.start_ns, 1'000'000 + 10'000'000 * static_cast<int64_t>(i));
        EXPECT_EQ(s.end_ns - s.start_ns, 10'000'000);
        EXPECT_EQ(s.running, s.start_ns == 31'000'000 ? 2 : 1);
        joined += s.joining;
    }
    EXPECT_EQ(r->decode_steps[0].joining, 1);
    EXPECT_EQ(r->decode_steps[3].joining, 1);
    EXPECT_EQ(joined, 2);
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
