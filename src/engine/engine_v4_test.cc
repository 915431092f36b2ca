// The engine serving DeepSeek V4 (issue 15): per-sequence state in the engine's cache
// structures (compressed-KV cache groups in the block pool, one state slot per running
// sequence) and output equal, token for token and logit for logit, to DeepseekV4Model's
// own forward pass on a V4State (the whole prompt in one chunk, then one token at a
// time, the sequence alone) -- under chunked prefill, continuous batching, async and
// inline steps, preemption (always by recompute), aborts and n > 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "engine/calibrate.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "model/deepseek_v4.h"
#include "model/synthetic.h"

namespace dsi::engine {
namespace {

ModelConfig tiny_v4() {
    ModelConfig c = synthetic_preset("tiny-v4").value();
    c.vocab_size = 512;
    return c;
}

DeepseekV4Model& v4_model() {
    static std::unique_ptr<DeepseekV4Model> m = [] {
        DeepseekV4Model::Options o;
        o.num_threads = 2;
        auto r = DeepseekV4Model::load(synthetic_v4_memory_model(tiny_v4(), 7), o);
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        return std::move(r).value();
    }();
    return *m;
}

std::vector<int32_t> make_prompt(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t& t : p) t = 2 + static_cast<int32_t>(rng() % 500);
    return p;
}

int32_t argmax(const float* row, int64_t n) {
    return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// Greedy decoding on the model's own state: prompt in one chunk, then token by token.
Completion reference(const std::vector<int32_t>& prompt, int64_t max_tokens) {
    DeepseekV4Model& m = v4_model();
    const int64_t vocab = m.config().vocab_size;
    auto st = m.new_state(static_cast<int64_t>(prompt.size()) + max_tokens);
    V4Output out;
    Completion c;
    EXPECT_TRUE(m.forward(prompt, 0, *st, false, out).is_ok());
    int64_t pos = static_cast<int64_t>(prompt.size());
    for (int64_t i = 0; i < max_tokens; ++i) {
        c.logits.emplace_back(out.logits.begin(), out.logits.begin() + vocab);
        const int32_t tok = argmax(out.logits.data(), vocab);
        c.tokens.push_back(tok);
        if (i + 1 == max_tokens) break;
        const int32_t in[1] = {tok};
        EXPECT_TRUE(m.forward(in, pos++, *st, false, out).is_ok());
    }
    return c;
}

GenerateRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
    GenerateRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    return r;
}

void expect_same(const Completion& got, const Completion& want, const std::string& what) {
    ASSERT_EQ(got.tokens, want.tokens) << what;
    ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
    for (size_t i = 0; i < want.logits.size(); ++i) {
        ASSERT_EQ(got.logits[i], want.logits[i]) << what << ": logits of output token " << i;
    }
}

// Prompt lengths around the window (128), the ratio-4 groups, the ratio-128 group and
// the indexer's top-k (16 of up to 75 entries at 300 tokens).
const int64_t kLengths[] = {1, 5, 127, 129, 260, 300};

TEST(EngineV4Test, LayoutGivesCacheGroupsAndStateSlots) {
    const KvLayout l = v4_model().kv_layout();
    ASSERT_EQ(l.groups.size(), 3u);  // tiny-v4 has ratio 4 and ratio 128 layers
    EXPECT_EQ(l.groups[0].name, "c4");
    EXPECT_EQ(l.groups[0].tokens_per_entry, 4);
    EXPECT_EQ(l.groups[1].name, "c4_index");
    EXPECT_EQ(l.groups[2].name, "c128");
    EXPECT_EQ(l.groups[2].tokens_per_entry, 128);
    EXPECT_GT(l.state_floats, v4_model().config().sliding_window * v4_model().config().head_dim);
    EXPECT_FALSE(l.prefix_reusable);
    EXPECT_FALSE(l.not_reusable_reason.empty());
}

TEST(EngineV4Test, GreedyOutputEqualsTheModelsOwnForward) {
    std::vector<Completion> want;
    for (size_t i = 0; i < std::size(kLengths); ++i) {
        want.push_back(reference(make_prompt(kLengths[i], static_cast<uint32_t>(i)), 10));
    }
    for (bool async : {true, false}) {
        EngineOptions o = base_options();
        o.async = async;
        o.scheduler.max_batched_tokens = 48;  // chunked prefill, several sequences a step
        Harness h(o, Env::default_env(), &v4_model());
        std::vector<RequestId> ids;
        // Continuous batching: half the requests arrive while the others run.
        for (size_t i = 0; i < std::size(kLengths); ++i) {
            if (i == std::size(kLengths) / 2) {
                for (int s = 0; s < 5 && h.engine->has_work(); ++s) {
                    ASSERT_TRUE(h.engine->step().is_ok());
                    ASSERT_TRUE(h.engine->check_invariants().is_ok());
                }
            }
            ids.push_back(h.add(greedy(make_prompt(kLengths[i], static_cast<uint32_t>(i)), 10)));
        }
        h.run_checked();
        for (size_t i = 0; i < ids.size(); ++i) {
            expect_same(h.out[ids[i]][0], want[i],
                        "prompt of " + std::to_string(kLengths[i]) + (async ? " async" : " inline"));
            EXPECT_EQ(h.out[ids[i]][0].reason, FinishReason::kLength);
        }
        const EngineStats s = h.engine->stats();
        EXPECT_GT(s.steps, 10);
        EXPECT_EQ(s.cached_prompt_tokens, 0);
        EXPECT_EQ(s.state_slots_in_use, 0);
        EXPECT_EQ(s.pool.num_used, 0);
    }
}

TEST(EngineV4Test, PreemptionRecomputesAndGivesTheSameOutput) {
    // 8 blocks for 4 sequences that need 3 each at the end: newer ones are preempted.
    EngineOptions o = base_options();
    o.num_kv_blocks = 8;
    o.scheduler.max_batched_tokens = 96;
    Harness h(o, Env::default_env(), &v4_model());
    std::vector<RequestId> ids;
    std::vector<Completion> want;
    for (uint32_t i = 0; i < 4; ++i) {
        std::vector<int32_t> p = make_prompt(200 + 20 * i, 100 + i);
        want.push_back(reference(p, 80));
        ids.push_back(h.add(greedy(p, 80)));
    }
    h.run_checked();
    for (size_t i = 0; i < ids.size(); ++i) expect_same(h.out[ids[i]][0], want[i], "preempted");
    const EngineStats s = h.engine->stats();
    EXPECT_GT(s.preemptions, 0);
    EXPECT_EQ(s.preemptions_swapped, 0);  // state slots cannot be restored from blocks
    EXPECT_EQ(s.state_slots_in_use, 0);
}

TEST(EngineV4Test, AbortFreesStateSlotsAndBlocks) {
    for (bool async : {true, false}) {
        EngineOptions o = base_options();
        o.async = async;
        o.scheduler.max_batched_tokens = 400;  // both admitted in the first step
        Harness h(o, Env::default_env(), &v4_model());
        const RequestId a = h.add(greedy(make_prompt(300, 1), 50));
        const RequestId b = h.add(greedy(make_prompt(40, 2), 50));
        for (int s = 0; s < 4; ++s) ASSERT_TRUE(h.engine->step().is_ok());
        EXPECT_EQ(h.engine->stats().state_slots_in_use, 2);
        ASSERT_TRUE(h.engine->abort(a).is_ok());
        EXPECT_EQ(h.engine->stats().state_slots_in_use, 1);
        ASSERT_TRUE(h.engine->check_invariants().is_ok());
        EXPECT_EQ(h.engine->abort(a).code(), StatusCode::kNotFound);
        // A request that arrives now takes the freed slot and still matches the reference.
        const std::vector<int32_t> p = make_prompt(150, 3);
        const RequestId c = h.add(greedy(p, 6));
        h.run_checked();
        EXPECT_EQ(h.out[a][0].reason, FinishReason::kAbort);
        EXPECT_EQ(h.out[b][0].reason, FinishReason::kLength);
        expect_same(h.out[c][0], reference(p, 6), "after an abort");
        const EngineStats s = h.engine->stats();
        EXPECT_EQ(s.state_slots_in_use, 0);
        EXPECT_EQ(s.pool.num_used, 0);
    }
}

TEST(EngineV4Test, NoPrefixHitsAndSiblingsMatchTheReference) {
    EngineOptions o = base_options();
    o.prefix_cache = true;  // asked for, but V4 prefixes are not reusable: turned off
    Harness h(o, Env::default_env(), &v4_model());
    const std::vector<int32_t> p = make_prompt(260, 9);
    const RequestId a = h.add(greedy(p, 5));
    h.run_checked();
    GenerateRequest r = greedy(p, 5);
    r.sampling.n = 2;
    const RequestId b = h.add(std::move(r));
    h.run_checked();
    const Completion want = reference(p, 5);
    expect_same(h.out[a][0], want, "first");
    expect_same(h.out[b][0], want, "second, completion 0");
    expect_same(h.out[b][1], want, "second, completion 1");
    const EngineStats s = h.engine->stats();
    EXPECT_EQ(s.cached_prompt_tokens, 0);
    EXPECT_EQ(s.pool.hit_blocks, 0);
    EXPECT_EQ(s.pool.published, 0);
}

TEST(EngineV4Test, StateSlotsBoundRunningSequences) {
    const int64_t slot_bytes = v4_model().kv_layout().state_floats * 4;
    EngineOptions o = base_options();
    o.num_kv_blocks = 0;
    o.kv_cache_bytes = slot_bytes * 6;  // half of it: 3 slots
    Harness h(o, Env::default_env(), &v4_model());
    EXPECT_EQ(h.engine->stats().state_slots, 3);
    std::vector<RequestId> ids;
    std::vector<std::vector<int32_t>> prompts;
    for (uint32_t i = 0; i < 5; ++i) {
        prompts.push_back(make_prompt(30 + i, 50 + i));
        ids.push_back(h.add(greedy(prompts.back(), 4)));
    }
    while (h.engine->has_work()) {
        ASSERT_TRUE(h.engine->step().is_ok());
        ASSERT_LE(h.engine->stats().state_slots_in_use, 3);
        ASSERT_TRUE(h.engine->check_invariants().is_ok());
    }
    for (size_t i = 0; i < ids.size(); ++i) expect_same(h.out[ids[i]][0], reference(prompts[i], 4), "capped");

    EngineOptions tiny = base_options();
    tiny.num_kv_blocks = 0;
    tiny.kv_cache_bytes = slot_bytes;  // not even one slot in half of it
    auto e = Engine::create(&v4_model(), tiny, Env::default_env());
    ASSERT_FALSE(e.is_ok());
    EXPECT_NE(e.status().message().find("state slot"), std::string::npos);
}

// calibrate on a model whose steps must continue their sequence: the prefix of each
// timed chunk is recomputed (untimed) before every repetition.
TEST(EngineV4Test, CalibrationProfilesAStatefulModel) {
    const int64_t q[] = {8, 16};
    const int64_t c[] = {0, 130};
    Result<std::vector<CalibrationPoint>> pts = profile_prefill(&v4_model(), q, c, 2);
    ASSERT_TRUE(pts.is_ok()) << pts.status().to_string();
    ASSERT_EQ(pts->size(), 4u);
    for (const CalibrationPoint& p : *pts) EXPECT_GE(p.ns, 0.0);
    // The conservative estimate knows V4's terms (compressed entries per prefix token).
    const PrefillShape shape = prefill_shape(v4_model().config());
    EXPECT_GT(shape.dense_flops_per_token, 0);
    EXPECT_GT(shape.attention_flops_per_pair, 0);
    EXPECT_GT(shape.kv_bytes_per_token, 0);
}

}  // namespace
}  // namespace dsi::engine
