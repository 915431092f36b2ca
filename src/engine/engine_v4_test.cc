// The engine serving DeepSeek V4 (issue 15): per-sequence state in the engine's cache
// structures (compressed-KV cache groups in the block pool, one state slot per running
// sequence) and output equal, token for token and logit for logit, to DeepseekV4Model's
// own forward pass on a V4State (the whole prompt in one chunk, then one token at a
// time, the sequence alone) -- under chunked prefill, continuous batching, async and
// inline steps, preemption (always by recompute), aborts and n > 1.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "engine/calibrate.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "kv/block_key.h"
#include "kv/swa_pool.h"
#include "kvstore/redis_test_server.h"
#include "kvstore/store_key.h"
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
    return random_prompt(n, seed, 500);
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

TEST(EngineV4Test, NoPrefixHitsBelowTheCapAndSiblingsMatchTheReference) {
    EngineOptions o = base_options();
    o.prefix_cache = true;  // V4: through the SWA state cache; 260 < 262 allows no hit
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
    EXPECT_EQ(s.swa.total().block_hits, 0);
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

// ---- Prefix caching through the SWA state cache (issue 16, docs/swa_cache.md) ----------

// The key of the state at `position` of `tokens` under the engine's default salt.
kv::SwaStateKey state_key(const std::vector<int32_t>& tokens, int64_t position) {
    const kv::BlockKey salt = kv::make_salt("model", "");
    const std::vector<kv::BlockKey> keys = kv::chain_keys(
        std::span<const int32_t>(tokens).first(static_cast<size_t>(position)), salt);
    return kv::swa_state_key(keys, position);
}

// One request alone; returns its output and how many prompt tokens it took from the cache.
std::pair<Completion, int64_t> run_one(Harness& h, const std::vector<int32_t>& prompt,
                                       int64_t max_tokens) {
    const int64_t before = h.engine->stats().cached_prompt_tokens;
    const RequestId id = h.add(greedy(prompt, max_tokens));
    h.run_checked();
    return {h.out[id][0], h.engine->stats().cached_prompt_tokens - before};
}

std::vector<int32_t> head(const std::vector<int32_t>& v, int64_t n) {
    return {v.begin(), v.begin() + n};
}

// Requests that share a prefix with earlier ones start from the stored state at S-KV-10's
// hit and give the cold output bitwise, at lengths around the cap (262) and the units;
// chunked prefill (the chunk cut at the store position) and async or inline steps.
TEST(EngineV4Test, PrefixHitFromAStoredStateGivesTheColdOutput) {
    const std::vector<int32_t> base = make_prompt(720, 77);
    struct Case {
        int64_t len, hit;
    };
    // Warm-up stores states at 128, 256, 384, 512 and 640 (prefill of len - 1 rounded
    // down); L1 = min(block hit, largest unit <= L - 134).
    const Case cases[] = {{127, 0},   {128, 0},   {129, 0},   {261, 0},   {262, 128},
                          {263, 128}, {300, 128}, {520, 384}, {647, 512}, {700, 512}};
    std::vector<Completion> want;
    for (const Case& c : cases) want.push_back(reference(head(base, c.len), 4));
    // Async with chunked prefill, and inline with whole prompts.
    const std::pair<bool, int64_t> configs[] = {{true, 48}, {false, 4096}};
    for (const auto& [async, chunk] : configs) {
        kv::SwaStatePool pool(int64_t{1} << 30);
        EngineOptions o = base_options();
        o.async = async;
        o.scheduler.max_batched_tokens = chunk;
        o.swa_pool = &pool;
        Harness h(o, Env::default_env(), &v4_model());
        for (int64_t n : {129, 257, 385, 513, 641}) run_one(h, head(base, n), 1);
        for (int64_t p : {128, 256, 384, 512, 640}) {
            ASSERT_TRUE(pool.contains(state_key(base, p))) << "state at " << p;
        }
        ASSERT_EQ(pool.stats().num_entries, 5);
        const EngineStats warm = h.engine->stats();
        EXPECT_EQ(warm.swa_states_stored, 5);
        EXPECT_EQ(warm.swa_captures, 5);
        for (size_t i = 0; i < std::size(cases); ++i) {
            const Case& c = cases[i];
            const std::string what = "L = " + std::to_string(c.len) +
                                     (async ? " async" : " inline") + " chunk " +
                                     std::to_string(chunk);
            auto [got, cached] = run_one(h, head(base, c.len), 4);
            expect_same(got, want[i], what);
            EXPECT_EQ(cached, c.hit) << what;
        }
        // Every hit found its state at L1: the six cases with a hit, and the warm-ups
        // of 385, 513 and 641 tokens (at 128, 256 and 384).
        const EngineStats s = h.engine->stats();
        const kv::SwaCacheClassCounters t = s.swa.total();
        EXPECT_EQ(t.swa_exact_hits, 6 + 3);
        EXPECT_EQ(t.replays, 0);
        EXPECT_EQ(t.hit_tokens, (128 * 3 + 384 + 512 * 2) + (128 + 256 + 384));
        EXPECT_EQ(t.requests, 5 + static_cast<int64_t>(std::size(cases)));
        EXPECT_EQ(s.swa_states_restored, 6 + 3);
        EXPECT_EQ(s.swa_states_rejected, 0);
        EXPECT_EQ(t.pool_bytes, pool.stats().bytes);
        EXPECT_GT(t.pool_bytes, 0);
        EXPECT_EQ(s.state_slots_in_use, 0);
    }
}

// Without the state at L1 the hit starts at L1 - 128 (S-KV-10 catch-up, re-run exactly);
// without that one either, V4 replays exactly from the newest older state (else 0). A
// damaged state is refused at admission: a miss, never a wrong continuation.
TEST(EngineV4Test, MissingOrDamagedStatesFallBackAndKeepTheColdOutput) {
    const std::vector<int32_t> base = make_prompt(600, 78);
    kv::SwaStatePool pool(int64_t{1} << 30);
    EngineOptions o = base_options();
    o.scheduler.max_batched_tokens = 100;
    o.swa_pool = &pool;
    Harness h(o, Env::default_env(), &v4_model());
    for (int64_t n : {129, 257, 385}) run_one(h, head(base, n), 1);
    const kv::SwaCacheClassCounters warm = h.engine->stats().swa.total();
    const std::vector<int32_t> p = head(base, 520);  // L1 = 384
    const Completion want = reference(p, 5);
    struct Step {
        int64_t evict;  // state evicted before the request (0: none)
        int64_t hit;    // where the request starts
        const char* what;
    };
    // Each request stores its own prefill state at 512 (useless below L - 134) and
    // leaves the others as they were.
    const Step steps[] = {{384, 256, "catch-up from L1 - 128"},
                          {256, 128, "exact replay from an older state"},
                          {128, 0, "no state left: a miss"}};
    int64_t fallback = 0;
    for (const Step& st : steps) {
        ASSERT_TRUE(pool.erase(state_key(base, st.evict))) << st.what;
        const EngineStats before = h.engine->stats();
        auto [got, cached] = run_one(h, p, 5);
        expect_same(got, want, st.what);
        EXPECT_EQ(cached, st.hit) << st.what;
        const EngineStats after = h.engine->stats();
        const kv::SwaCacheClassCounters d = after.swa.total();
        const kv::SwaCacheClassCounters b = before.swa.total();
        EXPECT_EQ(d.block_hits - b.block_hits, 1) << st.what;
        EXPECT_EQ(d.block_hit_tokens - b.block_hit_tokens, 384) << st.what;
        fallback += st.hit < 256 ? 256 - st.hit : 0;
        EXPECT_EQ(after.swa_fallback_tokens, fallback) << st.what;
    }
    const kv::SwaCacheClassCounters t = h.engine->stats().swa.total();
    EXPECT_EQ(t.swa_hits - warm.swa_hits, 1);  // the catch-up
    EXPECT_EQ(t.catch_up_tokens - warm.catch_up_tokens, 128);
    EXPECT_EQ(t.replays - warm.replays, 2);
    EXPECT_EQ(t.replay_tokens - warm.replay_tokens, 256);

    // A damaged state (one byte of its slot copy flipped) is a miss and leaves the pool.
    for (int64_t n : {129, 257, 385}) run_one(h, head(base, n), 1);
    const kv::SwaStateKey key = state_key(base, 384);
    Result<std::shared_ptr<const kv::SwaState>> st = pool.get(key);
    ASSERT_TRUE(st.is_ok());
    std::vector<uint8_t> bytes = (*st)->bytes;
    bytes[bytes.size() / 2] ^= 0x40;
    ASSERT_TRUE(pool.put(key, kvstore::TrafficClass::kChatbot, std::move(bytes)).is_ok());
    const int64_t rejected = h.engine->stats().swa_states_rejected;
    auto [got, cached] = run_one(h, p, 5);
    expect_same(got, want, "damaged state");
    EXPECT_EQ(cached, 0);
    EXPECT_EQ(h.engine->stats().swa_states_rejected, rejected + 1);
    EXPECT_FALSE(pool.contains(key));
}

// Decode takes a copy at each 128-token boundary it crosses; the latest is stored at
// request end and serves the next turn (prompt + output + more).
TEST(EngineV4Test, DecodeCopiesServeTheNextTurn) {
    kv::SwaStatePool pool(int64_t{1} << 30);
    EngineOptions o = base_options();
    o.swa_pool = &pool;
    Harness h(o, Env::default_env(), &v4_model());
    const std::vector<int32_t> first = make_prompt(120, 79);  // < 129: no prefill state
    auto [out, cached0] = run_one(h, first, 150);              // decode crosses 128 and 256
    EXPECT_EQ(cached0, 0);
    std::vector<int32_t> next = first;
    next.insert(next.end(), out.tokens.begin(), out.tokens.end());  // 270 tokens
    ASSERT_EQ(h.engine->stats().swa_captures, 2);
    EXPECT_TRUE(pool.contains(state_key(next, 256)));   // the latest copy, stored at the end
    EXPECT_FALSE(pool.contains(state_key(next, 128)));  // superseded, never stored
    const std::vector<int32_t> more = make_prompt(150, 80);
    next.insert(next.end(), more.begin(), more.end());  // 420: L1 = min(384, 256)
    auto [got, cached] = run_one(h, next, 6);
    expect_same(got, reference(next, 6), "next turn");
    EXPECT_EQ(cached, 256);
    EXPECT_EQ(h.engine->stats().swa.total().swa_exact_hits, 1);
}

// V4 blocks (every cache group's layers) through a store at `uri`: engine A warms it
// (states at 128 and 384 in `pool`, blocks 0-2 written behind); B, a fresh engine whose
// pool still holds the states (the pool outlived A: the test owns it), fetches blocks
// 0-2 and starts at 384; C, a restart (a fresh pool: no state survives), fetches
// nothing (the rule falls back to 0). Every output is the cold one, bitwise.
void store_round_trip(const std::string& uri, const std::vector<int32_t>& base,
                      kv::SwaStatePool& pool) {
    EngineOptions o = base_options();
    o.swa_pool = &pool;
    o.kv_store_uri = uri;
    {
        Harness a(o, Env::default_env(), &v4_model());
        run_one(a, head(base, 129), 1);
        run_one(a, head(base, 385), 1);
        EXPECT_EQ(a.engine->stats().store_blocks_offered, 3);
    }  // the write-behind drains here
    const std::vector<int32_t> p = head(base, 520);  // L1 = 384: the state is there
    const Completion want = reference(p, 3);
    {
        Harness b(o, Env::default_env(), &v4_model());
        auto [got, cached] = run_one(b, p, 3);
        expect_same(got, want, uri + ": fresh engine, blocks from the store");
        EXPECT_EQ(cached, 384);
        const EngineStats s = b.engine->stats();
        EXPECT_EQ(s.store_hit_blocks, 3);
        EXPECT_EQ(s.swa_states_restored, 1);
        EXPECT_EQ(s.store_blocks_offered, 1);  // block 3; fetched ones are not written back
    }
    {
        kv::SwaStatePool fresh(int64_t{1} << 30);
        EngineOptions oc = o;
        oc.swa_pool = &fresh;
        Harness c(oc, Env::default_env(), &v4_model());
        auto [got, cached] = run_one(c, p, 3);
        expect_same(got, want, uri + ": restart");
        EXPECT_EQ(cached, 0);
        EXPECT_EQ(c.engine->stats().store_lookups, 0);  // no block is worth fetching
    }
}

// Through file://; then a damaged block ends the fetched chain and the hit falls back to
// an older state.
TEST(EngineV4Test, BlocksThroughAFileStoreHitWithAStoredState) {
    namespace fs = std::filesystem;
    const fs::path dir =
        fs::temp_directory_path() / ("dsi_engine_v4_store_" + std::to_string(::getpid()) + "_" +
                                     std::to_string(std::random_device{}()));
    fs::create_directories(dir);
    const std::vector<int32_t> base = make_prompt(720, 90);
    kv::SwaStatePool pool(int64_t{1} << 30);
    const std::string uri = "file://" + dir.string();
    store_round_trip(uri, base, pool);
    // Damage block 2: the fetched chain is blocks 0-1; L1 = 256 has no state, 128 has:
    // start at 128 (catch-up), block 1 let go.
    const std::vector<kv::BlockKey> keys =
        kv::chain_keys(std::span<const int32_t>(base).first(384), kv::make_salt("model", ""));
    const std::string hex = kvstore::to_hex(kvstore::StoreKey{keys[2].lo, keys[2].hi});
    const fs::path file = dir / "blocks" / hex.substr(0, 2) / (hex + ".blk");
    ASSERT_TRUE(fs::exists(file));
    {
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(fs::file_size(file) - 100));
        f.put('\x5a');
    }
    {
        EngineOptions o = base_options();
        o.swa_pool = &pool;
        o.kv_store_uri = uri;
        Harness d(o, Env::default_env(), &v4_model());
        const std::vector<int32_t> p = head(base, 700);  // L1 = 512: state (from B) at 512
        auto [got, cached] = run_one(d, p, 3);
        expect_same(got, reference(p, 3), "damaged block");
        EXPECT_EQ(cached, 128);
        const EngineStats s = d.engine->stats();
        EXPECT_GT(s.store_miss_blocks, 0);
        EXPECT_EQ(s.swa.total().catch_up_tokens, 128);
    }
    fs::remove_all(dir);
}

TEST(EngineV4Test, BlocksThroughARedisStoreHitWithAStoredState) {
    if (!kvstore::testing::have_redis_server()) GTEST_SKIP() << "no redis-server";
    kvstore::testing::RedisTestServer server;
    ASSERT_TRUE(server.ready());
    kv::SwaStatePool pool(int64_t{1} << 30);
    store_round_trip("redis://127.0.0.1:" + std::to_string(server.port()) + "?timeout_ms=500",
                     make_prompt(720, 91), pool);
}

// A pool too small for one state refuses it: nothing is stored, nothing hits.
TEST(EngineV4Test, AnSwaPoolThatHoldsNoStateGivesNoHits) {
    EngineOptions o = base_options();
    o.swa_pool_bytes = 1024;
    Harness h(o, Env::default_env(), &v4_model());
    const std::vector<int32_t> base = make_prompt(400, 81);
    run_one(h, head(base, 257), 1);
    auto [got, cached] = run_one(h, base, 3);
    expect_same(got, reference(base, 3), "small pool");
    EXPECT_EQ(cached, 0);
    EXPECT_EQ(h.engine->stats().swa_states_stored, 0);
}

// Issue 18, the V4 hand-over (docs/cluster.md): the prefill engine exports blocks [0, P)
// of every cache group and the SWA state at its store position P; put where a decode
// engine's inbox puts them (its store tier and SWA pool), they let a second engine
// continue the generation (resume_output = the first token) from P -- a full hit past
// S-KV-10's cap, which a continuation may take, nothing replayed -- with the tokens and
// logits of the model running it whole. A new request of the same tokens gets no such hit.
TEST(EngineV4Test, AHandedOverPrefillContinuesOnAnotherEngineFromItsState) {
    const std::optional<StoreBlockShape> shape = store_block_shape(v4_model());
    ASSERT_TRUE(shape.has_value());
    // 300: P = 256; 384 = 3 x 128: P = 256, one unit below its last block; 647: P = 640.
    for (int64_t len : {300, 384, 647}) {
        const std::string what = "prompt of " + std::to_string(len);
        const std::vector<int32_t> prompt = make_prompt(len, static_cast<uint32_t>(60 + len));
        const int64_t p = (len - 1) / 128 * 128;
        const HandoffDecodeSide decode =
            decode_side(*shape, "dsi_v4_handoff_" + std::to_string(len), 16);
        const HandoffRun run = run_handoff(&v4_model(), greedy(prompt, 6), decode);
        ASSERT_NE(run.exported, nullptr) << what;
        const kv::KvExport& e = *run.exported;
        EXPECT_EQ(static_cast<int64_t>(e.num_blocks()) * 128, p) << what;
        EXPECT_EQ(e.layer_block_bytes, shape->layer_block_bytes) << what;
        ASSERT_NE(e.swa_state, nullptr) << what;
        EXPECT_EQ(e.swa_state->key.position, p) << what;
        EXPECT_EQ(e.swa_state->bytes.size(), shape->swa_state_bytes) << what;
        EXPECT_EQ(e.bytes(), e.num_blocks() * shape->block_bytes() + shape->swa_state_bytes);

        expect_same(run.joined(), reference(prompt, 6), what);
        const EngineStats& s = run.decode_stats;
        const kv::SwaCacheClassCounters t = s.swa.total();
        EXPECT_EQ(t.swa_hits, 1) << what;
        EXPECT_EQ(t.swa_exact_hits, 1) << what;
        EXPECT_EQ(t.hit_tokens, p) << what;
        EXPECT_EQ(t.replays, 0) << what;
        EXPECT_EQ(t.catch_up_tokens, 0) << what;
        EXPECT_EQ(s.swa_fallback_tokens, 0) << what;
        EXPECT_EQ(s.swa_states_restored, 1) << what;
        EXPECT_EQ(s.store_hit_blocks, p / 128) << what;
        EXPECT_EQ(s.cached_prompt_tokens, p) << what;
        if (len != 300) continue;
        // Not a continuation: S-KV-10's cap (L1 <= 301 - 134) leaves no state to start at.
        Harness h(decode.options, Env::default_env(), &v4_model());
        std::vector<int32_t> longer = prompt;
        longer.push_back(run.prefill.tokens[0]);
        auto [got, cached] = run_one(h, longer, 2);
        expect_same(got, reference(longer, 2), "a new request of the continued tokens");
        EXPECT_EQ(cached, 0);
    }
}

}  // namespace
}  // namespace dsi::engine
