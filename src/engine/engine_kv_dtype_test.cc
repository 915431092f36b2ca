// The engine with each KV cache dtype (SPEC S-ENG-9): the paged pool's block size
// follows the dtype, and a request gives bitwise the same logits cold, from the prefix
// cache, and as the model's forward pass over a contiguous cache.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine.h"
#include "model/deepseek.h"
#include "model/synthetic.h"

namespace dsi::engine {
namespace {

std::unique_ptr<DeepseekModel> model_with(const char* kv_dtype) {
    ModelConfig c = synthetic_preset("tiny-v3").value();
    c.vocab_size = 512;
    DeepseekModel::Options o;
    o.num_threads = 2;
    o.kv_dtype = kv_dtype;
    auto m = DeepseekModel::load(synthetic_memory_model(c, 1234), o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return std::move(m).value();
}

class EngineKvDtype : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineKvDtype, PagedAndPrefixCachedBitwiseEqualToModel) {
    auto model = model_with(GetParam());
    // A pool of 8 f32-sized blocks holds more blocks of a smaller dtype.
    const int64_t f32_block_bytes = model->kv_num_layers() * 128 *
                                    (model->config().kv_lora_rank +
                                     model->config().qk_rope_head_dim) * 4;
    EngineOptions o;
    o.kv_cache_bytes = 8 * f32_block_bytes;
    o.record_logits = true;
    o.async = false;
    o.scheduler.step_budget_ns = 1e12;
    auto engine = Engine::create(model.get(), o, Env::default_env()).value();
    const int64_t want_blocks = 8 * (model->config().kv_lora_rank +
                                     model->config().qk_rope_head_dim) / model->kv_row_floats();
    EXPECT_EQ(engine->stats().pool.num_blocks, want_blocks);

    std::mt19937 rng(5);
    GenerateRequest r;
    for (int i = 0; i < 300; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 512));
    r.sampling.max_tokens = 3;
    r.sampling.ignore_eos = true;
    std::map<RequestId, std::vector<std::vector<float>>> logits;
    auto add = [&](const GenerateRequest& req) {
        Result<RequestId> id = engine->add_request(req, [&](const TokenEvent& ev) {
            if (ev.token >= 0) logits[ev.request_id].emplace_back(ev.logits.begin(), ev.logits.end());
        });
        EXPECT_TRUE(id.is_ok());
        return id.value();
    };
    const RequestId cold = add(r);
    ASSERT_TRUE(engine->run().is_ok());
    const RequestId warm = add(r);  // same prompt: its two full blocks come from the cache
    ASSERT_TRUE(engine->run().is_ok());
    EXPECT_EQ(engine->stats().cached_prompt_tokens, 256);
    ASSERT_EQ(logits[cold].size(), 3u);
    EXPECT_EQ(logits[warm], logits[cold]);
    EXPECT_TRUE(engine->check_invariants().is_ok());

    // The model alone over a contiguous cache of the same dtype.
    auto cache = model->new_kv_cache(400);
    ForwardOutput out;
    ASSERT_TRUE(model->forward(r.prompt, 0, *cache, false, out).is_ok());
    EXPECT_EQ(out.logits, logits[cold][0]);
}

INSTANTIATE_TEST_SUITE_P(All, EngineKvDtype, ::testing::Values("f32", "bf16", "e4m3"));

}  // namespace
}  // namespace dsi::engine
