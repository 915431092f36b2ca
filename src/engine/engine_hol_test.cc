// Issue 22 D3, head-of-line blocking, counted in steps (no timing): a 16k-token prompt
// that arrives while another sequence decodes is prefilled in chunks that each fit the
// step budget, across at least N steps (N from the cost model and the budget), and the
// decoding sequence gets a token in every one of those steps. Also: without a fit the
// engine uses the conservative CPU cost model, not the H800-class default.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/calibrate.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "model/deepseek.h"
#include "model/synthetic.h"

namespace dsi::engine {
namespace {

constexpr int64_t kLongPrompt = 16384;

// Steps a chunked prefill of `tokens` needs at least: every chunk costs at most the
// budget, and the chunks of one prompt cost at least cost(tokens, 0) together (with
// per_qc >= 2 per_qq, splitting never makes the attention cheaper).
int64_t min_steps(const PrefillCostModel& cost, double budget_ns, int64_t tokens) {
    return static_cast<int64_t>(std::ceil(cost.cost_ns(tokens, 0) / budget_ns));
}

// The policy alone, with the cost model the embedded default model (the `tiny` preset)
// gets when it has no fit, and the default step budget.
TEST(HeadOfLineTest, SchedulerChunksALongPromptAroundADecodingSequence) {
    SchedulerConfig cfg;
    cfg.cost = conservative_cpu_cost_model(prefill_shape(synthetic_preset("tiny").value()));
    ASSERT_TRUE(cfg.validate().is_ok());
    ASSERT_GE(cfg.cost.per_q_ns, 5 * PrefillCostModel{}.per_q_ns / 40)  // not the H800 default
        << cfg.cost.per_q_ns;
    Scheduler sched(cfg, Env::default_env());
    SeqView decoder;  // running, decoding
    decoder.id = 1;
    decoder.num_tokens = 300;
    decoder.num_computed = 300;
    decoder.num_blocks = kv::blocks_for_tokens(301);
    decoder.decoding = true;
    SeqView prompt;  // arrives now
    prompt.id = 2;
    prompt.num_tokens = kLongPrompt;
    bool admitted = false;
    int64_t prefill_steps = 0;
    int64_t max_chunk = 0;
    for (int step = 0; step < 10'000 && prompt.num_computed < kLongPrompt; ++step) {
        std::vector<SeqView> running = {decoder};
        std::vector<SeqView> waiting;
        (admitted ? running : waiting).push_back(prompt);
        ScheduleDecision d = sched.schedule(running, waiting, 1 << 20);
        ASSERT_TRUE(d.preempted.empty() && d.expired.empty());
        bool decoded = false;
        for (const ScheduledSeq& sc : d.scheduled) {
            if (sc.id == decoder.id) {
                EXPECT_EQ(sc.num_new_tokens, 1);
                decoded = true;
                ++decoder.num_computed;
                decoder.num_blocks += sc.num_new_blocks;
            } else {
                EXPECT_LE(cfg.cost.cost_ns(sc.num_new_tokens, prompt.num_computed),
                          cfg.step_budget_ns);
                max_chunk = std::max(max_chunk, sc.num_new_tokens);
                prompt.num_computed += sc.num_new_tokens;
                prompt.num_blocks += sc.num_new_blocks;
                admitted = true;
                ++prefill_steps;
            }
        }
        EXPECT_TRUE(decoded) << "step " << step << ": the decoding sequence got no token";
    }
    EXPECT_EQ(prompt.num_computed, kLongPrompt);
    EXPECT_GE(prefill_steps, min_steps(cfg.cost, cfg.step_budget_ns, kLongPrompt));
    EXPECT_GE(prefill_steps, 2);
    EXPECT_LT(max_chunk, kLongPrompt);
}

// A model small enough to prefill 16k tokens in a test (1 layer, 1 head, small latent).
std::unique_ptr<DeepseekModel> small_model() {
    ModelConfig c = synthetic_preset("tiny-v3").value();
    c.vocab_size = 512;
    c.num_hidden_layers = 1;
    c.num_nextn_predict_layers = 0;
    c.num_attention_heads = 1;
    c.kv_lora_rank = 32;
    c.qk_rope_head_dim = 16;
    c.qk_nope_head_dim = 16;
    c.v_head_dim = 16;
    return DeepseekModel::load(synthetic_memory_model(c, 99), {2}).value();
}

// The engine: the same property end to end, with the cost model it picks itself when
// the checkpoint has no fit (a missing cost-model file) and a budget that makes the
// long prompt take at least 16 chunks.
TEST(HeadOfLineTest, DecodingSequenceGetsATokenInEveryStepOfALongPrefill) {
    std::unique_ptr<DeepseekModel> model = small_model();
    // What the engine picks without a fit: the estimate at the kernels' level.
    const PrefillCostModel cost =
        conservative_cpu_cost_model(prefill_shape(model->config()), kernels::active_isa());
    EngineOptions o;
    o.num_kv_blocks = kv::blocks_for_tokens(kLongPrompt + 64) + 16;
    o.cost_model_path = "/nonexistent/dsinfer_hol_test/" + std::to_string(::getpid()) + ".json";
    o.scheduler.step_budget_ns = cost.cost_ns(kLongPrompt, 0) / 16;
    std::unique_ptr<Engine> engine = Engine::create(model.get(), o, Env::default_env()).value();

    std::map<RequestId, int64_t> tokens;
    auto count = [&](const TokenEvent& ev) {
        if (ev.token >= 0) ++tokens[ev.request_id];
    };
    GenerateRequest decode;
    decode.prompt = {5, 6, 7};
    decode.sampling.max_tokens = 400;
    decode.sampling.ignore_eos = true;
    const RequestId d = engine->add_request(decode, count).value();
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(engine->step().is_ok());  // decoding now
    ASSERT_GT(tokens[d], 0);

    GenerateRequest lng;
    for (int64_t i = 0; i < kLongPrompt; ++i) lng.prompt.push_back(static_cast<int32_t>(i % 500));
    lng.sampling.max_tokens = 1;
    const RequestId l = engine->add_request(lng, count).value();
    int64_t prefill_steps = 0;
    int64_t max_gap_steps = 0;  // steps between two tokens of the decoding sequence
    int64_t gap = 0;
    while (tokens[l] == 0) {
        const int64_t prefilled = engine->stats().computed_prefill_tokens;
        const int64_t before = tokens[d];
        ASSERT_TRUE(engine->step().is_ok());
        prefill_steps += engine->stats().computed_prefill_tokens > prefilled;
        gap = tokens[d] > before ? 0 : gap + 1;
        max_gap_steps = std::max(max_gap_steps, gap);
        ASSERT_LT(tokens[d], decode.sampling.max_tokens) << "decoding ended before the prefill";
    }
    EXPECT_GE(prefill_steps, min_steps(cost, o.scheduler.step_budget_ns, kLongPrompt));
    EXPECT_GE(prefill_steps, 16);
    // A token of the decoding sequence comes back from every step (p100 gap: 0 steps
    // without one).
    EXPECT_EQ(max_gap_steps, 0);
    ASSERT_TRUE(engine->abort(d).is_ok());
    ASSERT_TRUE(engine->run().is_ok());
    ASSERT_TRUE(engine->check_invariants().is_ok());
}

// An abort during a long prefill takes effect at once (finish event inside abort(), blocks
// freed) and no later step computes another token of it.
TEST(HeadOfLineTest, AbortDuringALongPrefillStopsItAtTheNextStep) {
    std::unique_ptr<DeepseekModel> model = small_model();
    const PrefillCostModel cost = conservative_cpu_cost_model(prefill_shape(model->config()));
    EngineOptions o;
    o.num_kv_blocks = kv::blocks_for_tokens(kLongPrompt + 64) + 16;
    o.scheduler.cost = cost;
    o.scheduler.step_budget_ns = cost.cost_ns(kLongPrompt, 0) / 16;
    std::unique_ptr<Engine> engine = Engine::create(model.get(), o, Env::default_env()).value();
    FinishReason reason = FinishReason::kNone;
    GenerateRequest lng;
    for (int64_t i = 0; i < kLongPrompt; ++i) lng.prompt.push_back(static_cast<int32_t>(i % 500));
    lng.sampling.max_tokens = 1;
    const RequestId l = engine->add_request(lng, [&](const TokenEvent& ev) {
                                    if (ev.finished) reason = ev.reason;
                                }).value();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine->step().is_ok());
    const int64_t prefilled = engine->stats().computed_prefill_tokens;
    ASSERT_GT(prefilled, 0);
    ASSERT_LT(prefilled, kLongPrompt);
    ASSERT_TRUE(engine->abort(l).is_ok());
    EXPECT_EQ(reason, FinishReason::kAbort);
    EXPECT_EQ(engine->stats().pool.num_used, 0);
    ASSERT_TRUE(engine->run().is_ok());  // the step already in flight drains
    EXPECT_EQ(engine->stats().computed_prefill_tokens, prefilled);
    ASSERT_TRUE(engine->check_invariants().is_ok());
}

}  // namespace
}  // namespace dsi::engine
