#include "sim/step_fit.h"

#include <gtest/gtest.h>

#include "sim/simulator.h"

namespace dsi::sim {
namespace {

using Item = engine::StepRecord::Item;

engine::StepRecord step(int64_t start_ns, int64_t end_ns, std::vector<Item> items) {
    engine::StepRecord r;
    r.start_ns = start_ns;
    r.end_ns = end_ns;
    r.cpu_ns = (end_ns - start_ns) / 2;  // the worker had its core half the time
    r.items = std::move(items);
    return r;
}

// A calibration of 1 us a prompt token and 2 ns a (new token x context token), so a
// chunk of q at context c costs q us + 2 q c ns.
engine::PrefillCostModel per_token_us() {
    engine::PrefillCostModel m;
    m.base_ns = 0;
    m.per_q_ns = 1000;
    m.per_c_ns = 0;
    m.per_qc_ns = 2;
    m.per_qq_ns = 0;
    return m;
}

// Live prefill steps take 50 us a step + per sequence 10 us + 1 us a token + 0.5 ns x
// q^2, and the calibration's 2 ns x q x c; decode steps 2 ms + 100 us a sequence + 10 ns
// a KV token. The fit finds exactly those numbers.
std::vector<engine::StepRecord> prefill_steps() {
    return {
        step(0, 165'000, {{100, 0}}),  // 50k + 10k + 100k + 5k
        // Starts 500 ns after the last ended: the host's planning, counted (279.5k + 0.5k
        // = 50k + 10k + 200k + 20k).
        step(165'500, 445'000, {{200, 0}}),
        step(500'000, 500'100, {}),                // no items: not a forward pass
        step(10'000'000, 10'405'000, {{300, 0}}),  // idle before: 50k + 10k + 300k + 45k
        // Two prompts, one at context 100: 50k + (10k + 100k + 5k) + (10k + 150k +
        // 11.25k) + 2 x 150 x 100.
        step(20'000'000, 20'366'250, {{100, 0}, {150, 100}}),
        step(30'000'000, 30'202'400, {{40, 0}, {40, 0}, {40, 0}}),  // 50k + 3 x 50.8k
    };
}

std::vector<engine::StepRecord> decode_steps() {
    // Far apart: no gap counts.
    return {
        step(0, 2'101'000, {{1, 99}}),                                           // 1 seq, 100 KV
        step(10'000'000, 12'203'000, {{1, 99}, {1, 199}}),                       // 2 seqs, 300 KV
        step(20'000'000, 22'410'000, {{1, 249}, {1, 249}, {1, 249}, {1, 249}}),  // 4, 1000
        // A request joins with 20 tokens to recompute at context 128 (20 us + 2 x 20 x
        // 128 ns at the calibration): 2 seqs, 100 + 148 KV tokens.
        step(30'000'000, 32'227'600, {{1, 99}, {20, 128}}),
    };
}

TEST(StepFitTest, RecoversTheStepCostsOfWorkedRecords) {
    const auto p = prefill_steps();
    const auto d = decode_steps();
    Result<StepCostFit> f = fit_step_costs(p, d, per_token_us());
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_NEAR(f->prefill_step_overhead_ns, 50'000, 1e-3);
    EXPECT_NEAR(f->prefill_time_cost.base_ns, 10'000, 1e-3);
    EXPECT_NEAR(f->prefill_time_cost.per_q_ns, 1000, 1e-6);
    EXPECT_NEAR(f->prefill_time_cost.per_qq_ns, 0.5, 1e-9);
    EXPECT_EQ(f->prefill_time_cost.per_qc_ns, 2);  // the calibration's context terms
    EXPECT_EQ(f->prefill_time_cost.per_c_ns, 0);
    EXPECT_EQ(f->num_prefill_steps, 5);
    EXPECT_NEAR(f->prefill_mean_rel_error, 0, 1e-9);
    // Walls 165k + 279.5k + 405k + 366.25k + 202.4k (CPU half of them) over 1,000k of
    // calibrated cost (100k + 200k + 300k + 280k + 120k).
    EXPECT_NEAR(f->prefill_wall_over_calibration, 1.41815, 1e-9);
    EXPECT_NEAR(f->prefill_cpu_over_calibration, 0.709075, 1e-9);
    EXPECT_NEAR(f->prefill_wall_over_cpu, 2.0, 1e-9);
    EXPECT_NEAR(f->decode_base_ns, 2e6, 1e-3);
    EXPECT_NEAR(f->decode_per_request_ns, 1e5, 1e-3);
    EXPECT_NEAR(f->decode_per_kv_token_ns, 10, 1e-6);
    EXPECT_EQ(f->num_decode_steps, 4);
    EXPECT_NEAR(f->decode_mean_rel_error, 0, 1e-9);
}

// A gap longer than max_gap_ns counts as step time when a sequence runs on across it
// (its item [1, 100] follows [1, 99]): the engine had work, its host was late. Step 2's
// wall is 0.70301 ms after a 1.5 ms gap: 2 ms + 2 x 100 us + 10 ns x 301 KV tokens.
TEST(StepFitTest, AGapASequenceRunsOnAcrossIsStepTime) {
    const std::vector<engine::StepRecord> d = {
        step(0, 2'101'000, {{1, 99}}),
        step(3'601'000, 4'304'010, {{1, 100}, {1, 199}}),
        step(20'000'000, 22'410'000, {{1, 249}, {1, 249}, {1, 249}, {1, 249}}),
        step(30'000'000, 32'227'600, {{1, 99}, {20, 128}}),
    };
    Result<StepCostFit> f = fit_step_costs(prefill_steps(), d, per_token_us());
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_NEAR(f->decode_base_ns, 2e6, 1e-3);
    EXPECT_NEAR(f->decode_per_request_ns, 1e5, 1e-3);
    EXPECT_NEAR(f->decode_per_kv_token_ns, 10, 1e-6);
    EXPECT_NEAR(f->decode_mean_rel_error, 0, 1e-9);
}

// A join step the calibration overprices (its recompute at 2.512 ms of a 2.612 ms step:
// 0.1 ms left) weighs as one step of 2.612 ms among the others, not as one of 0.1 ms
// (which would outweigh the rest ~700 times and pull the base towards it).
TEST(StepFitTest, AnOverpricedJoinDoesNotOutweighTheOtherSteps) {
    std::vector<engine::StepRecord> d;
    for (int64_t k = 0; k < 6; ++k) {
        std::vector<Item> items(static_cast<size_t>(k + 1), Item{1, 99});
        d.push_back(step(k * 10'000'000, k * 10'000'000 + 2'000'000 + (k + 1) * 101'000, items));
    }
    d.push_back(step(60'000'000, 62'612'000, {{1, 99}, {2000, 128}}));
    Result<StepCostFit> f = fit_step_costs(prefill_steps(), d, per_token_us());
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    // The six steps say 2 ms + 100 us a sequence + 10 ns a KV token; the join step pulls
    // the fit down a little, not to it.
    EXPECT_GT(f->decode_base_ns + f->decode_per_request_ns, 1.5e6);  // 2.1e6 without it
    EXPECT_NEAR(f->decode_base_ns + 6 * f->decode_per_request_ns + 600 * f->decode_per_kv_token_ns,
                2.606e6, 0.26e6);
}

// A decode step counts by the tokens it makes (TPOT is per token): forty steps of one
// sequence (2.1 ms) and forty of two (2.2 ms) against one of 40 sequences that took 10 ms
// (a full batch costs more per sequence than the small ones say: no line fits all three).
// Weighing steps alike, the eighty small ones put the full batch at 9.1 ms (9 % short,
// where half of the tokens are made); weighing by tokens, within 1 % of it, and the
// small steps within 4 %.
TEST(StepFitTest, ADecodeStepWeighsAsTheTokensItMakes) {
    std::vector<engine::StepRecord> d;
    int64_t t = 0;
    auto add = [&](int n, int64_t wall_ns) {
        d.push_back(step(t, t + wall_ns, std::vector<Item>(static_cast<size_t>(n), Item{1, 0})));
        t += 100'000'000;  // idle between steps: no gap counts
    };
    for (int i = 0; i < 40; ++i) {
        add(1, 2'100'000);
        add(2, 2'200'000);
    }
    add(40, 10'000'000);
    Result<StepCostFit> f = fit_step_costs(prefill_steps(), d, per_token_us());
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    auto at = [&](double n) {
        return f->decode_base_ns + n * (f->decode_per_request_ns + f->decode_per_kv_token_ns);
    };
    EXPECT_NEAR(at(40), 10e6, 0.1e6);
    EXPECT_NEAR(at(1), 2.1e6, 0.1e6);
}

TEST(StepFitTest, CoefficientsStayNonNegative) {
    const std::vector<engine::StepRecord> d = {
        step(0, 3'000'000, {{1, 99}}),
        step(10'000'000, 12'000'000, {{1, 999}}),
        step(20'000'000, 22'000'000, {{1, 1999}}),
    };
    const auto p = prefill_steps();
    Result<StepCostFit> f = fit_step_costs(p, d, per_token_us());
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ(f->decode_per_kv_token_ns, 0);
    // A constant c minimising sum ((c - y) / y)^2: sum (1 / y) / sum (1 / y^2) over
    // 3, 2 and 2 ms = (4 / 3) / (11 / 18) ms.
    EXPECT_NEAR(f->decode_base_ns + f->decode_per_request_ns, 1e6 * (4.0 / 3) / (11.0 / 18), 1e-3);
    EXPECT_GE(f->decode_base_ns, 0);
    EXPECT_GE(f->decode_per_request_ns, 0);
}

TEST(StepFitTest, TooFewStepsIsAnError) {
    const auto p = prefill_steps();
    const auto d = decode_steps();
    EXPECT_EQ(fit_step_costs(p, std::span(d).first(2), per_token_us()).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(fit_step_costs({}, d, per_token_us()).status().code(), StatusCode::kInvalidArgument);
}

TEST(StepFitTest, ParsesTheServeStepLog) {
    Result<std::vector<engine::StepRecord>> r = parse_step_log(
        "{\"start_ns\":10,\"end_ns\":30,\"cpu_ns\":15,\"items\":[[128,0],[1,300]]}\n"
        "\n"
        "{\"start_ns\":40,\"end_ns\":45,\"cpu_ns\":-1,\"items\":[]}\n");
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_EQ(r->size(), 2u);
    EXPECT_EQ((*r)[0].end_ns, 30);
    EXPECT_EQ((*r)[0].cpu_ns, 15);
    ASSERT_EQ((*r)[0].items.size(), 2u);
    EXPECT_EQ((*r)[0].items[1].q, 1);
    EXPECT_EQ((*r)[0].items[1].c, 300);
    EXPECT_EQ((*r)[1].cpu_ns, -1);
    const char* bad[] = {
        "{\"start_ns\":1,\"end_ns\":2,\"cpu_ns\":1,\"items\":[[1,0]]}\nnot json\n",
        "{\"start_ns\":1,\"end_ns\":2,\"cpu_ns\":1,\"items\":[[1,0]]}\n{\"start_ns\":1}\n",
        "{\"start_ns\":1,\"end_ns\":2,\"cpu_ns\":1,\"items\":[[1,0]]}\n"
        "{\"start_ns\":1,\"end_ns\":2,\"cpu_ns\":1,\"items\":[[1]]}\n",
        "{\"start_ns\":1,\"end_ns\":2,\"cpu_ns\":1,\"items\":[[1,0]]}\n"
        "{\"start_ns\":5,\"end_ns\":2,\"cpu_ns\":1,\"items\":[]}\n",
    };
    for (const char* b : bad) {
        Result<std::vector<engine::StepRecord>> e = parse_step_log(b);
        ASSERT_FALSE(e.is_ok()) << b;
        EXPECT_NE(e.status().message().find("line 2"), std::string::npos) << e.status().to_string();
    }
}

// The fit as an overlay: its keys replace the calibrated description's, the rest stays;
// the simulator then charges a prefill step the overhead + the fitted chunks' cost.
TEST(StepFitTest, OverlayTimesTheSimulatedPrefill) {
    const auto p = prefill_steps();
    const auto d = decode_steps();
    Result<StepCostFit> f = fit_step_costs(p, d, per_token_us());
    ASSERT_TRUE(f.is_ok());
    ClusterDescription base;
    base.num_prefill = 1;
    base.num_decode = 1;
    base.prefill_cost = per_token_us();
    base.prefill_step_overhead_ns = 0;
    Result<ClusterDescription> c = apply_cluster_description(step_fit_overlay_json(*f), base);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->num_prefill, 1);
    EXPECT_EQ(c->prefill_cost.per_q_ns, 1000);
    ASSERT_TRUE(c->prefill_time_cost.has_value());
    EXPECT_NEAR(c->prefill_time_cost->per_qq_ns, 0.5, 1e-9);
    EXPECT_NEAR(c->prefill_step_overhead_ns, 50'000, 1e-3);
    EXPECT_NEAR(c->decode_per_request_ns, 1e5, 1e-3);

    // One 1,000-token request (one chunk): 1 ms calibrated; fitted 50 us + 10 us + 1 ms
    // + 0.5 ms (q^2).
    workload::Trace t;
    t.block_tokens = 512;
    t.blocks = {1, 2};
    t.requests.push_back({0, 1000, 2, 0, 2});
    Result<SimResult> before = simulate(t, base, SimOptions{});
    Result<SimResult> after = simulate(t, *c, SimOptions{});
    ASSERT_TRUE(before.is_ok()) << before.status().to_string();
    ASSERT_TRUE(after.is_ok()) << after.status().to_string();
    EXPECT_NEAR(after->ttft_ms.p50 - before->ttft_ms.p50, 0.05 + 0.01 + 0.5, 1e-3);
    EXPECT_FALSE(parse_cluster_description(R"({"prefill_time_cost": {"per_q_ns": -1}})").is_ok());
    EXPECT_FALSE(parse_cluster_description(R"({"prefill_time_cost": {"x": 1}})").is_ok());
}

}  // namespace
}  // namespace dsi::sim
