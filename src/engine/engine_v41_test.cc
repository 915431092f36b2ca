// The engine serving DeepSeek V4.1 (issue 16, deliverable 1) through the CausalLm seam:
// the model's cache groups in the block pool, its state slot per running sequence, and
// greedy output equal, token for token and logit for logit, to DeepseekV41Model's own
// forward pass (prompt in one chunk, then one token at a time) under chunked prefill
// and continuous batching, async and inline.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "kv/swa_pool.h"
#include "model/deepseek_v41.h"
#include "model/synthetic.h"

namespace dsi::engine {
namespace {

DeepseekV41Model& v41_model() {
    static std::unique_ptr<DeepseekV41Model> m = [] {
        ModelConfig c = synthetic_preset("tiny-v41").value();
        c.sliding_window = 8;  // prompts of tens of tokens wrap every window ring
        c.vocab_size = 512;
        c.v41.dspark_noise_token_id = 500;
        c.v41.image_token_id = 501;
        DeepseekV41Model::Options o;
        o.num_threads = 2;
        o.kv_dtype = kernels::KvDtype::kE4m3;
        auto r = DeepseekV41Model::load(synthetic_v4_memory_model(c, 7), o);
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        return std::move(r).value();
    }();
    return *m;
}

std::vector<int32_t> make_prompt(int64_t n, uint32_t seed) { return random_prompt(n, seed, 500); }

// Greedy decoding on the model's own cache: prompt in one chunk, then token by token.
Completion reference(const std::vector<int32_t>& prompt, int64_t max_tokens) {
    DeepseekV41Model& m = v41_model();
    const int64_t vocab = m.config().vocab_size;
    auto cache = m.new_kv_cache(static_cast<int64_t>(prompt.size()) + max_tokens);
    SequenceStep st{prompt, 0, cache.get(), false};
    BatchOutput out;
    Completion c;
    EXPECT_TRUE(m.forward_batch(std::span(&st, 1), out).is_ok());
    int64_t pos = static_cast<int64_t>(prompt.size());
    for (int64_t i = 0; i < max_tokens; ++i) {
        c.logits.emplace_back(out.logits.begin(), out.logits.begin() + vocab);
        const int32_t tok = static_cast<int32_t>(
            std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin());
        c.tokens.push_back(tok);
        if (i + 1 == max_tokens) break;
        const int32_t in[1] = {tok};
        SequenceStep next{in, pos++, cache.get(), false};
        EXPECT_TRUE(m.forward_batch(std::span(&next, 1), out).is_ok());
    }
    return c;
}

TEST(EngineV41Test, GreedyOutputEqualsTheModelsOwnForward) {
    const KvLayout l = v41_model().kv_layout();
    ASSERT_EQ(l.groups.size(), 4u);  // c2, c2_index, c1, c1_index
    EXPECT_FALSE(l.prefix_reusable);
    const int64_t lengths[] = {1, 9, 40, 70};
    std::vector<Completion> want;
    for (size_t i = 0; i < std::size(lengths); ++i) {
        want.push_back(reference(make_prompt(lengths[i], static_cast<uint32_t>(i)), 6));
    }
    for (bool async : {true, false}) {
        EngineOptions o = base_options();
        o.async = async;
        o.scheduler.max_batched_tokens = 24;  // chunked prefill, several sequences a step
        Harness h(o, Env::default_env(), &v41_model());
        std::vector<RequestId> ids;
        for (size_t i = 0; i < std::size(lengths); ++i) {
            if (i == 2) {  // continuous batching: the rest arrive while these run
                for (int s = 0; s < 3 && h.engine->has_work(); ++s)
                    ASSERT_TRUE(h.engine->step().is_ok());
            }
            GenerateRequest r;
            r.prompt = make_prompt(lengths[i], static_cast<uint32_t>(i));
            r.sampling.temperature = 0;
            r.sampling.max_tokens = 6;
            r.sampling.ignore_eos = true;
            ids.push_back(h.add(std::move(r)));
        }
        h.run_checked();
        for (size_t i = 0; i < ids.size(); ++i) {
            const Completion& got = h.out[ids[i]][0];
            ASSERT_EQ(got.tokens, want[i].tokens) << lengths[i] << (async ? " async" : " inline");
            for (size_t k = 0; k < want[i].logits.size(); ++k) {
                ASSERT_EQ(got.logits[k], want[i].logits[k]) << lengths[i] << " token " << k;
            }
        }
        EXPECT_EQ(h.engine->stats().state_slots_in_use, 0);
        EXPECT_EQ(h.engine->stats().pool.num_used, 0);
    }
}

// The state slot is position-addressed (window rings, the ratio-2 pending pair, the Engram
// token ring), so the engine's SWA state cache (docs/swa_cache.md, exact replay) serves
// V4.1 prefixes: a hit at S-KV-10's length gives the cold output bitwise.
TEST(EngineV41Test, PrefixHitFromAStoredStateGivesTheColdOutput) {
    const std::vector<int32_t> base = make_prompt(420, 77);
    auto head = [&](int64_t n) { return std::vector<int32_t>(base.begin(), base.begin() + n); };
    struct Case {
        int64_t len, hit;
    };
    const Case cases[] = {{261, 0}, {262, 128}, {400, 256}};
    std::vector<Completion> want;
    for (const Case& c : cases) want.push_back(reference(head(c.len), 3));
    kv::SwaStatePool pool(int64_t{1} << 30);
    EngineOptions o = base_options();
    o.scheduler.max_batched_tokens = 48;  // chunked prefill
    o.swa_pool = &pool;
    Harness h(o, Env::default_env(), &v41_model());
    auto run_one = [&](const std::vector<int32_t>& prompt, int64_t max_tokens) {
        const int64_t before = h.engine->stats().cached_prompt_tokens;
        GenerateRequest r;
        r.prompt = prompt;
        r.sampling.temperature = 0;
        r.sampling.max_tokens = max_tokens;
        r.sampling.ignore_eos = true;
        const RequestId id = h.add(std::move(r));
        h.run_checked();
        return std::make_pair(h.out[id][0], h.engine->stats().cached_prompt_tokens - before);
    };
    for (int64_t n : {129, 257}) run_one(head(n), 1);  // states at 128 and 256
    EXPECT_EQ(pool.stats().num_entries, 2);
    for (size_t i = 0; i < std::size(cases); ++i) {
        auto [got, cached] = run_one(head(cases[i].len), 3);
        EXPECT_EQ(cached, cases[i].hit) << cases[i].len;
        ASSERT_EQ(got.tokens, want[i].tokens) << cases[i].len;
        for (size_t k = 0; k < want[i].logits.size(); ++k) {
            ASSERT_EQ(got.logits[k], want[i].logits[k]) << cases[i].len << " token " << k;
        }
    }
    EXPECT_EQ(h.engine->stats().swa_states_restored, 2);  // the hits of 262 and 400
}

// Issue 18, the V4.1 hand-over: the same pieces as V4's (docs/cluster.md) carry its four
// cache groups and its state slot (stored whole): a second engine continues from the
// prefill's store position P with the model's own tokens and logits, a full hit.
TEST(EngineV41Test, AHandedOverPrefillContinuesOnAnotherEngineFromItsState) {
    const std::optional<StoreBlockShape> shape = store_block_shape(v41_model());
    ASSERT_TRUE(shape.has_value());
    int64_t store_layers = 0;  // every cache group's layers
    for (const KvGroupLayout& g : v41_model().kv_layout().groups) store_layers += g.num_layers;
    ASSERT_EQ(shape->num_layers(), static_cast<uint32_t>(store_layers));
    for (int64_t len : {256, 300}) {  // P = 128 (one unit below the blocks), 256
        const std::string what = "prompt of " + std::to_string(len);
        const std::vector<int32_t> prompt = make_prompt(len, static_cast<uint32_t>(len));
        const int64_t p = (len - 1) / 128 * 128;
        GenerateRequest r;
        r.prompt = prompt;
        r.sampling.temperature = 0;
        r.sampling.max_tokens = 4;
        r.sampling.ignore_eos = true;
        const HandoffRun run = run_handoff(
            &v41_model(), r, decode_side(*shape, "dsi_v41_handoff_" + std::to_string(len), 8));
        ASSERT_NE(run.exported, nullptr) << what;
        EXPECT_EQ(static_cast<int64_t>(run.exported->num_blocks()) * 128, p) << what;
        ASSERT_NE(run.exported->swa_state, nullptr) << what;
        EXPECT_EQ(run.exported->swa_state->bytes.size(), shape->swa_state_bytes) << what;
        const Completion got = run.joined();
        const Completion want = reference(prompt, 4);
        ASSERT_EQ(got.tokens, want.tokens) << what;
        for (size_t k = 0; k < want.logits.size(); ++k) {
            ASSERT_EQ(got.logits[k], want.logits[k]) << what << " token " << k;
        }
        const kv::SwaCacheClassCounters t = run.decode_stats.swa.total();
        EXPECT_EQ(t.swa_exact_hits, 1) << what;
        EXPECT_EQ(t.replays, 0) << what;
        EXPECT_EQ(run.decode_stats.cached_prompt_tokens, p) << what;
    }
}

}  // namespace
}  // namespace dsi::engine
