// Calibration: the least-squares fit recovers known coefficients, the JSON file round
// trips and malformed files give clear errors, the engine picks the file up, and the
// profiler measures the points it is asked for.
#include "engine/calibrate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <random>

#include "engine/engine.h"
#include "model/deepseek.h"
#include "model/synthetic.h"

namespace dsi::engine {
namespace {

std::vector<CalibrationPoint> synthetic_points(const PrefillCostModel& m, double noise,
                                               uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-noise, noise);
    std::vector<CalibrationPoint> pts;
    for (int64_t q : {16, 64, 256, 512, 1024}) {
        for (int64_t c : {0, 256, 1024, 4096}) pts.push_back({q, c, m.cost_ns(q, c) * (1 + u(rng))});
    }
    return pts;
}

TEST(CalibrateTest, FitRecoversTheCoefficients) {
    PrefillCostModel truth;
    truth.base_ns = 70'000;
    truth.per_q_ns = 9'000'000;
    truth.per_c_ns = 3'000;
    truth.per_qc_ns = 40;
    truth.per_qq_ns = 25;
    Result<PrefillCostModel> fit = fit_prefill_cost_model(synthetic_points(truth, 0, 1));
    ASSERT_TRUE(fit.is_ok()) << fit.status().to_string();
    EXPECT_NEAR(fit->base_ns, truth.base_ns, 1e-6 * truth.per_q_ns);
    EXPECT_NEAR(fit->per_q_ns, truth.per_q_ns, 1e-6 * truth.per_q_ns);
    EXPECT_NEAR(fit->per_c_ns, truth.per_c_ns, 1e-6 * truth.per_c_ns);
    EXPECT_NEAR(fit->per_qc_ns, truth.per_qc_ns, 1e-6 * truth.per_qc_ns);
    EXPECT_NEAR(fit->per_qq_ns, truth.per_qq_ns, 1e-6 * truth.per_qq_ns);
}

TEST(CalibrateTest, NoisyFitKeepsCoefficientsNonNegative) {
    PrefillCostModel truth;
    truth.base_ns = 0;  // noise pushes the unconstrained fit below zero
    truth.per_q_ns = 5'000'000;
    truth.per_c_ns = 0;
    truth.per_qc_ns = 10;
    truth.per_qq_ns = 0;
    for (uint64_t seed = 1; seed <= 5; ++seed) {
        Result<PrefillCostModel> fit = fit_prefill_cost_model(synthetic_points(truth, 0.02, seed));
        ASSERT_TRUE(fit.is_ok()) << fit.status().to_string();
        EXPECT_TRUE(fit->validate().is_ok());
        EXPECT_NEAR(fit->per_q_ns, truth.per_q_ns, 0.05 * truth.per_q_ns);
        // The fit predicts the measured points within the noise.
        for (const CalibrationPoint& p : synthetic_points(truth, 0, 1))
            EXPECT_NEAR(fit->cost_ns(p.q, p.c), p.ns, 0.05 * p.ns);
    }
}

TEST(CalibrateTest, FitRejectsPointsThatCannotDetermineIt) {
    PrefillCostModel m;
    std::vector<CalibrationPoint> few = synthetic_points(m, 0, 1);
    few.resize(4);
    EXPECT_FALSE(fit_prefill_cost_model(few).is_ok());
    std::vector<CalibrationPoint> one_c;
    for (int64_t q : {1, 2, 4, 8, 16, 32}) one_c.push_back({q, 0, m.cost_ns(q, 0)});
    Result<PrefillCostModel> r = fit_prefill_cost_model(one_c);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().to_string().find("separate"), std::string::npos);
    std::vector<CalibrationPoint> bad = synthetic_points(m, 0, 1);
    bad[3].ns = -1;
    EXPECT_FALSE(fit_prefill_cost_model(bad).is_ok());
    bad[3].ns = std::nan("");
    EXPECT_FALSE(fit_prefill_cost_model(bad).is_ok());
    bad[3] = {0, 0, 1.0};
    EXPECT_FALSE(fit_prefill_cost_model(bad).is_ok());
}

TEST(CalibrateTest, JsonRoundTripAndMalformedFiles) {
    PrefillCostModel m;
    m.base_ns = 1.5;
    m.per_q_ns = 2.25e6;
    m.per_c_ns = 0;
    m.per_qc_ns = 7;
    m.per_qq_ns = 0.125;
    Result<PrefillCostModel> back = cost_model_from_json(cost_model_to_json(m, R"({"threads": 2})"));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->base_ns, m.base_ns);
    EXPECT_EQ(back->per_q_ns, m.per_q_ns);
    EXPECT_EQ(back->per_qc_ns, m.per_qc_ns);
    EXPECT_EQ(back->per_qq_ns, m.per_qq_ns);
    const std::pair<const char*, const char*> cases[] = {
        {"{", "not a JSON object"},
        {"[1, 2]", "not a JSON object"},
        {R"({"base_ns": 1})", "format"},
        {R"({"format": "other", "base_ns": 1})", "format"},
        {R"({"format": "dsinfer-prefill-cost-v1", "base_ns": 1, "per_q_ns": 1, "per_c_ns": 1,
             "per_qc_ns": 1})", "per_qq_ns"},
        {R"({"format": "dsinfer-prefill-cost-v1", "base_ns": "1", "per_q_ns": 1, "per_c_ns": 1,
             "per_qc_ns": 1, "per_qq_ns": 1})", "base_ns"},
        {R"({"format": "dsinfer-prefill-cost-v1", "base_ns": 1, "per_q_ns": -1, "per_c_ns": 1,
             "per_qc_ns": 1, "per_qq_ns": 1})", ">= 0"},
    };
    for (const auto& [text, what] : cases) {
        Result<PrefillCostModel> r = cost_model_from_json(text);
        ASSERT_FALSE(r.is_ok()) << text;
        EXPECT_NE(r.status().to_string().find(what), std::string::npos)
            << text << " -> " << r.status().to_string();
    }
    EXPECT_EQ(cost_model_path_for("models/small/"), "models/small/dsinfer_prefill_cost.json");
    EXPECT_EQ(cost_model_path_for("m/x.gguf"), "m/x.gguf.dsinfer_prefill_cost.json");
}

std::unique_ptr<DeepseekModel> tiny_model() {
    ModelConfig c = synthetic_preset("tiny-v3").value();
    c.vocab_size = 512;
    c.num_hidden_layers = 2;
    return DeepseekModel::load(synthetic_memory_model(c, 7), {1}).value();
}

// Steps to finish one request of `prompt_len` tokens and 1 output token.
Result<int64_t> steps_for_prompt(DeepseekModel* model, EngineOptions o, int prompt_len) {
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::create(model, o, Env::default_env()));
    GenerateRequest r;
    for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(i % 500);
    r.sampling.max_tokens = 1;
    DSI_RETURN_IF_ERROR(e->add_request(std::move(r), nullptr).status());
    DSI_RETURN_IF_ERROR(e->run());
    return e->stats().steps;
}

TEST(CalibrateTest, EngineLoadsTheFileWhenPresent) {
    Env* env = Env::default_env();
    std::unique_ptr<DeepseekModel> model = tiny_model();
    const std::string dir = "/tmp/dsinfer_calibrate_test_" + std::to_string(::getpid());
    ASSERT_TRUE(env->create_dirs(dir).is_ok());
    const std::string path = cost_model_path_for(dir);
    std::remove(path.c_str());
    EngineOptions o;
    o.num_kv_blocks = 8;
    o.scheduler.step_budget_ns = 1e9;
    o.cost_model_path = path;
    // No file: the default model (cheap per token) takes the 100-token prompt at once.
    Result<int64_t> steps = steps_for_prompt(model.get(), o, 100);
    ASSERT_TRUE(steps.is_ok()) << steps.status().to_string();
    EXPECT_EQ(*steps, 1);
    // A fit that makes a token cost 1/10 of the budget: chunks of at most 10 tokens.
    PrefillCostModel slow;
    slow.base_ns = 0;
    slow.per_q_ns = 1e8;
    slow.per_c_ns = slow.per_qc_ns = slow.per_qq_ns = 0;
    ASSERT_TRUE(env->write_file(path, cost_model_to_json(slow, "")).is_ok());
    steps = steps_for_prompt(model.get(), o, 100);
    ASSERT_TRUE(steps.is_ok()) << steps.status().to_string();
    EXPECT_EQ(*steps, 10);
    // A malformed file fails engine creation, naming the file.
    ASSERT_TRUE(env->write_file(path, R"({"format": "dsinfer-prefill-cost-v1"})").is_ok());
    Result<std::unique_ptr<Engine>> e = Engine::create(model.get(), o, env);
    ASSERT_FALSE(e.is_ok());
    EXPECT_NE(e.status().to_string().find(path), std::string::npos) << e.status().to_string();
    EXPECT_NE(e.status().to_string().find("base_ns"), std::string::npos);
    std::remove(path.c_str());
    ::rmdir(dir.c_str());
}

TEST(CalibrateTest, ProfileMeasuresEveryPoint) {
    std::unique_ptr<DeepseekModel> model = tiny_model();
    const int64_t qs[] = {4, 16, 8};
    const int64_t cs[] = {32, 0};
    Result<std::vector<CalibrationPoint>> pts = profile_prefill(model.get(), qs, cs, 1);
    ASSERT_TRUE(pts.is_ok()) << pts.status().to_string();
    ASSERT_EQ(pts->size(), 6u);
    for (const CalibrationPoint& p : *pts) {
        EXPECT_GE(p.ns, 0);  // a marginal time; noise can make it 0
        EXPECT_TRUE(p.c == 0 || p.c == 32);
    }
    const int64_t too_long[] = {1'000'000'000};
    EXPECT_FALSE(profile_prefill(model.get(), too_long, cs, 1).is_ok());
    const int64_t zero[] = {0};
    EXPECT_FALSE(profile_prefill(model.get(), zero, cs, 1).is_ok());
    EXPECT_FALSE(profile_prefill(model.get(), qs, cs, 0).is_ok());
}

// Issue 22 D3: the estimate for a checkpoint without a fit grows with the model, is a
// valid (monotone) cost model, and charges attention per (new, prefix) token pair.
TEST(CalibrateTest, ConservativeCpuCostModelFollowsTheModelSizes) {
    ModelConfig small = synthetic_preset("tiny-v3").value();
    ModelConfig big = small;
    big.num_hidden_layers *= 4;
    big.hidden_size *= 2;
    const PrefillCostModel a = conservative_cpu_cost_model(prefill_shape(small));
    const PrefillCostModel b = conservative_cpu_cost_model(prefill_shape(big));
    ASSERT_TRUE(a.validate().is_ok());
    ASSERT_TRUE(b.validate().is_ok());
    EXPECT_GT(b.per_q_ns, 4 * a.per_q_ns);
    EXPECT_GT(b.per_qc_ns, 3 * a.per_qc_ns);
    EXPECT_GT(a.per_qc_ns, 0);
    EXPECT_DOUBLE_EQ(a.per_qq_ns, a.per_qc_ns / 2);
    EXPECT_GT(a.cost_ns(1024, 4096), a.cost_ns(1024, 0));
    // Per token, a CPU is slower than the H800-class default charges for attention.
    EXPECT_GT(a.per_qc_ns, PrefillCostModel{}.per_qc_ns);
    // The vector kernel levels divide the matmul and attention terms by their scales;
    // reading KV and the per-chunk overhead stay.
    for (kernels::Isa isa : {kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
        const CpuRateScale k = conservative_rate_scale(isa);
        const PrefillCostModel v = conservative_cpu_cost_model(prefill_shape(small), isa);
        EXPECT_DOUBLE_EQ(v.per_q_ns * k.gemm, a.per_q_ns);
        EXPECT_DOUBLE_EQ(v.per_qc_ns * k.attention, a.per_qc_ns);
        EXPECT_DOUBLE_EQ(v.per_c_ns, a.per_c_ns);
        EXPECT_GT(k.gemm, 1);
    }
    EXPECT_EQ(conservative_rate_scale(kernels::Isa::kAvx512).gemm, 8);
    // The medium preset (30 layers, ~5 GFLOP a token) at AVX-512 rates: a 2 s step holds
    // ~12 prompt tokens, at the scalar rates one.
    const ModelConfig medium = synthetic_preset("medium").value();
    EXPECT_LE(conservative_cpu_cost_model(prefill_shape(medium)).max_chunk_tokens(2e9, 0, 8192), 1);
    EXPECT_GE(conservative_cpu_cost_model(prefill_shape(medium), kernels::Isa::kAvx512)
                  .max_chunk_tokens(2e9, 0, 8192),
              10);
}

// First start: no file -> profile the quick grid, write the fit, return it; the next call
// reads the same fit back without profiling; a malformed file or a bad grid is an error
// (and writes nothing).
TEST(CalibrateTest, EnsureCostModelCalibratesOnceAndKeepsTheFit) {
    Env* env = Env::default_env();
    std::unique_ptr<DeepseekModel> model = tiny_model();
    const std::string dir = "/tmp/dsinfer_ensure_cost_test_" + std::to_string(::getpid());
    ASSERT_TRUE(env->create_dirs(dir).is_ok());
    const std::string path = cost_model_path_for(dir);
    std::remove(path.c_str());
    QuickCalibration grid;
    grid.q_values = {64, 128, 256};
    grid.c_values = {0, 128, 512};
    grid.reps = 1;
    QuickCalibration bad = grid;
    bad.q_values = {0};
    EXPECT_FALSE(ensure_cost_model(env, model.get(), path, bad).is_ok());
    EXPECT_FALSE(env->file_exists(path));
    Result<PrefillCostModel> first = ensure_cost_model(env, model.get(), path, grid);
    ASSERT_TRUE(first.is_ok()) << first.status().to_string();
    ASSERT_TRUE(env->file_exists(path));
    Result<std::optional<PrefillCostModel>> stored = load_cost_model(env, path);
    ASSERT_TRUE(stored.is_ok() && stored->has_value());
    EXPECT_DOUBLE_EQ((*stored)->per_q_ns, first->per_q_ns);
    Result<PrefillCostModel> again = ensure_cost_model(env, model.get(), path, bad);  // no profiling
    ASSERT_TRUE(again.is_ok()) << again.status().to_string();
    EXPECT_DOUBLE_EQ(again->per_qc_ns, first->per_qc_ns);
    ASSERT_TRUE(env->write_file(path, "{").is_ok());
    Result<PrefillCostModel> broken = ensure_cost_model(env, model.get(), path, grid);
    ASSERT_FALSE(broken.is_ok());
    EXPECT_NE(broken.status().to_string().find(path), std::string::npos);
    std::remove(path.c_str());
    ::rmdir(dir.c_str());
}


// Variable-length verification's step-cost curve (issue 24): one point per step size,
// increasing token counts, positive times, kept beside the checkpoint and read back
// without profiling; bad grids and malformed files are errors naming them.
TEST(CalibrateTest, VerifyCostCurveIsProfiledOnceAndKept) {
    Env* env = Env::default_env();
    std::unique_ptr<DeepseekModel> model = tiny_model();
    VerifyCalibration grid;
    grid.tokens = {1, 3, 7, 12};
    grid.tokens_per_seq = 4;
    grid.context = 40;
    grid.reps = 1;
    Result<spec::VerifyCostCurve> curve = profile_verify_cost(model.get(), grid);
    ASSERT_TRUE(curve.is_ok()) << curve.status().to_string();
    ASSERT_EQ(curve->points().size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(curve->points()[i].tokens, grid.tokens[i]);
        EXPECT_GT(curve->points()[i].ns, 0);
    }
    for (auto bad_grid : {std::vector<int64_t>{}, std::vector<int64_t>{0, 2},
                          std::vector<int64_t>{4, 2}, std::vector<int64_t>{2, 2}}) {
        VerifyCalibration bad = grid;
        bad.tokens = bad_grid;
        EXPECT_EQ(profile_verify_cost(model.get(), bad).status().code(), StatusCode::kInvalidArgument);
    }
    VerifyCalibration too_long = grid;
    too_long.context = 1'000'000'000;
    EXPECT_FALSE(profile_verify_cost(model.get(), too_long).is_ok());

    const std::string dir = "/tmp/dsinfer_verify_cost_test_" + std::to_string(::getpid());
    ASSERT_TRUE(env->create_dirs(dir).is_ok());
    const std::string path = verify_cost_path_for(dir);
    EXPECT_EQ(path, dir + "/dsinfer_verify_cost.json");
    EXPECT_EQ(verify_cost_path_for("/m/x.gguf"), "/m/x.gguf.dsinfer_verify_cost.json");
    std::remove(path.c_str());
    Result<spec::VerifyCostCurve> first = ensure_verify_cost(env, model.get(), path, grid);
    ASSERT_TRUE(first.is_ok()) << first.status().to_string();
    ASSERT_TRUE(env->file_exists(path));
    VerifyCalibration unusable = grid;
    unusable.tokens = {};
    Result<spec::VerifyCostCurve> again = ensure_verify_cost(env, model.get(), path, unusable);
    ASSERT_TRUE(again.is_ok()) << again.status().to_string();  // read, not profiled
    EXPECT_DOUBLE_EQ(again->points()[2].ns, first->points()[2].ns);
    ASSERT_TRUE(env->write_file(path, R"({"format": "dsinfer-verify-cost-v1", "points": []})").is_ok());
    Result<spec::VerifyCostCurve> broken = ensure_verify_cost(env, model.get(), path, grid);
    ASSERT_FALSE(broken.is_ok());
    EXPECT_NE(broken.status().to_string().find(path), std::string::npos);
    std::remove(path.c_str());
    ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace dsi::engine
