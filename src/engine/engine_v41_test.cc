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

// One greedy request to the end; its completion and the prompt tokens it got cached.
std::pair<Completion, int64_t> run_one(Harness& h, const std::vector<int32_t>& prompt,
                                       int64_t max_tokens, bool agent = false) {
    const int64_t before = h.engine->stats().cached_prompt_tokens;
    GenerateRequest r;
    r.prompt = prompt;
    r.agent_traffic = agent;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    const RequestId id = h.add(std::move(r));
    h.run_checked();
    return {h.out[id][0], h.engine->stats().cached_prompt_tokens - before};
}

void expect_same(const Completion& got, const Completion& want, const std::string& what) {
    ASSERT_EQ(got.tokens, want.tokens) << what;
    for (size_t k = 0; k < want.logits.size(); ++k) {
        ASSERT_EQ(got.logits[k], want.logits[k]) << what << " token " << k;
    }
}

std::vector<int32_t> head_of(int64_t n) {
    static const std::vector<int32_t> base = make_prompt(720, 77);
    return std::vector<int32_t>(base.begin(), base.begin() + n);
}

// The state slot is position-addressed (window rings, the ratio-2 pending pair, the Engram
// token ring), so the engine's SWA state cache (docs/swa_cache.md) serves V4.1 prefixes:
// a hit at S-KV-10's length gives the cold output bitwise. In both YOCO modes: off keeps
// the whole slot (exact); compact keeps only S-KV-8's stored region (the lengths, the
// Engram ids, the encoder windows) and rebuilds the decoder windows from the prompt's
// last keep tokens, which with the tests' 8-token window is exact too.
TEST(EngineV41Test, PrefixHitFromAStoredStateGivesTheColdOutput) {
    struct Case {
        int64_t len, hit;
    };
    const Case cases[] = {{261, 0}, {262, 128}, {400, 256}};
    std::vector<Completion> want;
    for (const Case& c : cases) want.push_back(reference(head_of(c.len), 3));
    const KvLayout layout = v41_model().kv_layout();
    int64_t stored_floats = 0;
    for (const auto& [b, e] : layout.swa_stored_ranges) stored_floats += e - b;
    ASSERT_GT(stored_floats, 0);
    ASSERT_LT(stored_floats, layout.state_floats);
    for (auto mode : {kv::YocoTruncationMode::kCompact, kv::YocoTruncationMode::kOff}) {
        const std::string name(kv::yoco_truncation_mode_name(mode));
        kv::SwaStatePool pool(int64_t{1} << 30);
        EngineOptions o = base_options();
        o.scheduler.max_batched_tokens = 48;  // chunked prefill
        o.swa_pool = &pool;
        o.yoco_prefill.mode = mode;
        Harness h(o, Env::default_env(), &v41_model());
        for (int64_t n : {129, 257}) run_one(h, head_of(n), 1);  // states at 128 and 256
        EXPECT_EQ(pool.stats().num_entries, 2);
        // S-KV-8: compact keeps the stored region only (+ the 8-byte seal).
        const int64_t floats =
            mode == kv::YocoTruncationMode::kCompact ? stored_floats : layout.state_floats;
        EXPECT_EQ(pool.stats().bytes, 2 * (floats * 4 + 8)) << name;
        for (size_t i = 0; i < std::size(cases); ++i) {
            auto [got, cached] = run_one(h, head_of(cases[i].len), 3);
            EXPECT_EQ(cached, cases[i].hit) << cases[i].len << " " << name;
            expect_same(got, want[i], std::to_string(cases[i].len) + " " + name);
        }
        EXPECT_EQ(h.engine->stats().swa_states_restored, 2);  // the hits of 262 and 400
    }
}

// S-SWA encoder side through the engine: no SWA state is ever kept (a pool too small for
// one), so a prompt of 700 after one of 520 finds the blocks of [0, 512) and no state
// (kReplay). compact: the sequence pins those blocks, replays [384, 512) with truncated
// attention and computes from 512; off: it falls back to 0. With the tests' 8-token
// window the truncated replay rebuilds the windows exactly, so both give the cold output
// bitwise, and the blocks the replay read are still whole for a third request.
TEST(EngineV41Test, ASwaMissIsServedByBoundedReplay) {
    const Completion want = reference(head_of(700), 3);
    for (auto mode : {kv::YocoTruncationMode::kCompact, kv::YocoTruncationMode::kOff}) {
        const std::string name(kv::yoco_truncation_mode_name(mode));
        const bool compact = mode == kv::YocoTruncationMode::kCompact;
        kv::SwaStatePool pool(16);  // refuses every state
        EngineOptions o = base_options();
        o.scheduler.max_batched_tokens = 256;
        o.swa_pool = &pool;
        o.yoco_prefill.mode = mode;
        Harness h(o, Env::default_env(), &v41_model());
        run_one(h, head_of(520), 1);
        EXPECT_EQ(pool.stats().num_entries, 0);
        for (int round = 0; round < 2; ++round) {
            const EngineStats before = h.engine->stats();
            // The second round as agent traffic: the per-class counters follow it.
            auto [got, cached] = run_one(h, head_of(700), 3, round == 1);
            const EngineStats after = h.engine->stats();
            expect_same(got, want, name + " round " + std::to_string(round));
            const kv::SwaCacheClassCounters b = before.swa.total(), a = after.swa.total();
            EXPECT_EQ(a.replays - b.replays, 1) << name;
            EXPECT_EQ(a.replay_tokens - b.replay_tokens, 128) << name;
            EXPECT_EQ(a.hit_tokens - b.hit_tokens, 384) << name;  // S-KV-10: L1 - 128
            EXPECT_EQ(cached, compact ? 512 : 0) << name;
            EXPECT_EQ(after.computed_prefill_tokens - before.computed_prefill_tokens,
                      compact ? 700 - 512 + 128 : 700)
                << name;
            EXPECT_EQ(after.swa_fallback_tokens - before.swa_fallback_tokens, compact ? 0 : 384)
                << name;
            // CED compact prefill: the decoder ran over the last 140 prompt tokens only.
            EXPECT_EQ(after.yoco_decoder_tokens - before.yoco_decoder_tokens, compact ? 140 : 0)
                << name;
            const auto cls = static_cast<size_t>(round == 1 ? kvstore::TrafficClass::kAgent
                                                            : kvstore::TrafficClass::kChatbot);
            EXPECT_EQ(
                after.yoco_by_class[cls].decoder_tokens - before.yoco_by_class[cls].decoder_tokens,
                compact ? 140 : 0)
                << name;
            EXPECT_EQ(after.yoco_by_class[cls].decoder_skipped_tokens -
                          before.yoco_by_class[cls].decoder_skipped_tokens,
                      compact ? 700 - 512 - 140 : 0)
                << name;
            EXPECT_EQ(after.yoco_by_class[1 - cls].decoder_tokens,
                      before.yoco_by_class[1 - cls].decoder_tokens)
                << name;
            EXPECT_EQ(after.swa.by_class[cls].replays - before.swa.by_class[cls].replays, 1)
                << name;
        }
    }
}

// Keep tokens must cover the window plus every draft a step can roll back (S-SWA);
// checked at create for a V4.1 model, with the draft count when speculating.
TEST(EngineV41Test, KeepTokensBelowWindowPlusRollbackFailsAtCreate) {
    auto create = [](int64_t keep, bool speculate, kv::YocoTruncationMode mode) {
        EngineOptions o = base_options();
        o.yoco_prefill.keep_tokens = keep;
        o.yoco_prefill.mode = mode;
        if (speculate) {
            o.speculative.method = spec::Method::kNgram;
            o.speculative.num_tokens = 5;
        }
        return Engine::create(&v41_model(), std::move(o), Env::default_env()).status();
    };
    const Status few = create(127, false, kv::YocoTruncationMode::kCompact);
    EXPECT_EQ(few.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(few.message().find("keep"), std::string::npos) << few.to_string();
    EXPECT_TRUE(create(128, false, kv::YocoTruncationMode::kCompact).is_ok());
    const Status drafts = create(132, true, kv::YocoTruncationMode::kCompact);
    EXPECT_EQ(drafts.code(), StatusCode::kInvalidArgument) << drafts.to_string();
    // 133 covers 128 + 5: what refuses it is the state's missing rollback, not keep.
    EXPECT_EQ(create(133, true, kv::YocoTruncationMode::kCompact).code(),
              StatusCode::kFailedPrecondition);
    EXPECT_TRUE(create(5, false, kv::YocoTruncationMode::kOff).is_ok());  // off keeps all
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
