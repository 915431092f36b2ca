// Engine: batch invariance under load, prefix cache, block accounting under random
// aborts, lifecycle and malformed input. Small in-memory models (reduced vocabulary).
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>

#include "engine/engine_test_util.h"
#include "model/synthetic.h"

namespace dsi::engine {
namespace {

GenerateRequest random_request(std::mt19937_64& rng, int max_prompt = 200, int max_new = 8) {
    GenerateRequest r;
    const int len = 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_prompt));
    for (int i = 0; i < len; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 512));
    r.sampling.max_tokens = 2 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_new));
    r.sampling.ignore_eos = true;
    if (rng() % 2) {
        r.sampling.temperature = 0.9;
        r.sampling.top_k = static_cast<int64_t>(rng() % 50);
        r.sampling.seed = rng();
    }
    if (rng() % 4 == 0) r.sampling.frequency_penalty = 0.5;
    return r;
}

// S-ENG-6/7: 20 requests give bitwise the same logits and tokens alone and among 0-31
// random others with random arrivals, chunk boundaries (step budgets), a small pool
// (preemption), async on and off.
TEST(EngineTest, RequestsAreBatchInvariant) {
    std::mt19937_64 rng(42);
    std::vector<GenerateRequest> targets;
    for (int i = 0; i < 20; ++i) targets.push_back(random_request(rng));
    std::vector<Completion> alone;
    for (const GenerateRequest& t : targets) {
        EngineOptions o = base_options();
        o.async = false;
        Harness h(o);
        RequestId id = h.add(t);
        ASSERT_TRUE(h.engine->run().is_ok());
        alone.push_back(h.out[id][0]);
        ASSERT_EQ(alone.back().reason, FinishReason::kLength);
        ASSERT_EQ(alone.back().tokens.size(), static_cast<size_t>(t.sampling.max_tokens));
    }
    int64_t preemptions = 0;
    for (int mix = 0; mix < 5; ++mix) {
        EngineOptions o = base_options();
        o.async = mix % 2 == 0;
        o.num_kv_blocks = 6 + static_cast<int64_t>(rng() % 8);
        o.scheduler.cost.per_q_ns = 1000;
        o.scheduler.step_budget_ns = 1000.0 * (5 + static_cast<double>(rng() % 200));
        Harness h(o);
        // Four targets plus 0-31 random others, arriving at random steps.
        std::vector<std::pair<int, GenerateRequest>> arrivals;
        std::vector<int> target_of;
        for (int k = 0; k < 4; ++k)
            arrivals.push_back({static_cast<int>(rng() % 20), targets[mix * 4 + k]});
        const int others = static_cast<int>(rng() % 32);
        for (int k = 0; k < others; ++k)
            arrivals.push_back({static_cast<int>(rng() % 40), random_request(rng, 200, 100)});
        std::vector<RequestId> ids(arrivals.size(), 0);
        int step = 0;
        size_t added = 0;
        while (added < arrivals.size() || h.engine->has_work()) {
            for (size_t a = 0; a < arrivals.size(); ++a) {
                if (ids[a] == 0 && arrivals[a].first <= step) {
                    ids[a] = h.add(arrivals[a].second);
                    ++added;
                }
            }
            ASSERT_TRUE(h.engine->step().is_ok());
            ++step;
        }
        preemptions += h.engine->stats().preemptions;
        for (int k = 0; k < 4; ++k) {
            const Completion& got = h.out[ids[k]][0];
            const Completion& want = alone[mix * 4 + k];
            EXPECT_EQ(got.tokens, want.tokens) << "mix " << mix << " target " << k;
            EXPECT_TRUE(got.logits == want.logits) << "mix " << mix << " target " << k;
        }
        ASSERT_TRUE(h.engine->check_invariants().is_ok());
        EXPECT_EQ(h.engine->stats().pool.num_used, 0);
    }
    std::printf("preemptions across the mixes: %lld\n", static_cast<long long>(preemptions));
}

TEST(EngineTest, SameSeedSameTokensDifferentSeedsDiffer) {
    GenerateRequest r;
    for (int i = 0; i < 40; ++i) r.prompt.push_back(i * 7 % 512);
    r.sampling.temperature = 1.5;
    r.sampling.max_tokens = 12;
    r.sampling.ignore_eos = true;
    r.sampling.seed = 5;
    Harness h(base_options());
    RequestId a = h.add(r);
    RequestId b = h.add(r);
    r.sampling.seed = 6;
    RequestId c = h.add(r);
    ASSERT_TRUE(h.engine->run().is_ok());
    EXPECT_EQ(h.out[a][0].tokens, h.out[b][0].tokens);
    EXPECT_NE(h.out[a][0].tokens, h.out[c][0].tokens);
}

// A continuation (resume_output, issue 18 failover) of the first k tokens gives exactly
// the remaining tokens of the whole generation -- sampling positions, penalties and
// max_tokens all count the resumed tokens -- for k = 1, 7 and 19 of 20.
TEST(EngineTest, AContinuationGivesTheRestOfTheSameGeneration) {
    GenerateRequest r;
    for (int i = 0; i < 150; ++i) r.prompt.push_back(i * 13 % 512);
    r.sampling.temperature = 1.2;
    r.sampling.top_k = 40;
    r.sampling.frequency_penalty = 0.8;
    r.sampling.max_tokens = 20;
    r.sampling.ignore_eos = true;
    r.sampling.seed = 99;
    Harness whole(base_options());
    const RequestId w = whole.add(r);
    ASSERT_TRUE(whole.engine->run().is_ok());
    const std::vector<int32_t> all = whole.out[w][0].tokens;
    ASSERT_EQ(all.size(), 20u);
    for (size_t k : {1u, 7u, 19u}) {
        GenerateRequest c = r;
        c.resume_output.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k));
        Harness h(base_options());
        const RequestId id = h.add(c);
        ASSERT_TRUE(h.engine->run().is_ok());
        EXPECT_EQ(h.out[id][0].tokens, std::vector<int32_t>(all.begin() + static_cast<std::ptrdiff_t>(k), all.end()))
            << "resumed after " << k;
    }
    // Refused: n > 1, as long as max_tokens, a token outside the vocabulary.
    Harness h(base_options());
    GenerateRequest bad = r;
    bad.resume_output = {1, 2};
    bad.sampling.n = 2;
    EXPECT_FALSE(h.engine->add_request(bad, nullptr).is_ok());
    bad = r;
    bad.resume_output = all;
    EXPECT_FALSE(h.engine->add_request(bad, nullptr).is_ok());
    bad = r;
    bad.resume_output = {1, 1 << 30};
    EXPECT_FALSE(h.engine->add_request(bad, nullptr).is_ok());
}

// A second request sharing a 4-block prefix computes only its suffix, matches the
// cache-off output, and a different cache_salt gets no hit.
TEST(EngineTest, PrefixCacheComputesOnlyTheSuffix) {
    std::mt19937_64 rng(3);
    std::vector<int32_t> prefix(4 * 128 + 10);
    for (auto& t : prefix) t = static_cast<int32_t>(rng() % 512);
    auto with_suffix = [&](int32_t s) {
        GenerateRequest r;
        r.prompt = prefix;
        for (int i = 0; i < 20; ++i) r.prompt.push_back((s + i) % 512);
        r.sampling.max_tokens = 5;
        r.sampling.ignore_eos = true;
        return r;
    };
    EngineOptions o = base_options();
    Harness h(o);
    h.add(with_suffix(1));
    ASSERT_TRUE(h.engine->run().is_ok());
    const int64_t before = h.engine->stats().computed_prefill_tokens;
    RequestId second = h.add(with_suffix(2));
    ASSERT_TRUE(h.engine->run().is_ok());
    EXPECT_EQ(h.engine->stats().computed_prefill_tokens - before, 542 - 512);
    EXPECT_EQ(h.engine->stats().cached_prompt_tokens, 512);
    // Cache off: same output, everything computed.
    o.prefix_cache = false;
    Harness off(o);
    RequestId ref = off.add(with_suffix(2));
    ASSERT_TRUE(off.engine->run().is_ok());
    EXPECT_EQ(h.out[second][0].tokens, off.out[ref][0].tokens);
    EXPECT_TRUE(h.out[second][0].logits == off.out[ref][0].logits);
    EXPECT_EQ(off.engine->stats().computed_prefill_tokens, 542);
    // Another tenant: no hit.
    GenerateRequest other = with_suffix(2);
    other.cache_salt = "tenant-b";
    const int64_t cached = h.engine->stats().cached_prompt_tokens;
    h.add(other);
    ASSERT_TRUE(h.engine->run().is_ok());
    EXPECT_EQ(h.engine->stats().cached_prompt_tokens, cached);
    ASSERT_TRUE(h.engine->check_invariants().is_ok());
}

// EngineOptions::on_step: a record per step with each sequence's tokens and the context
// before them: the prompt in one chunk at 0, then one token a step after it; a second
// prompt sharing 512 tokens of prefix starts at its cache hit.
TEST(EngineTest, StepRecordsNameTokensAndContext) {
    std::vector<int32_t> prompt = random_prompt(4 * 128 + 10, 7, 500);
    std::vector<StepRecord> records;
    EngineOptions o = base_options();
    o.on_step = [&records](const StepRecord& r) { records.push_back(r); };
    Harness h(o);
    GenerateRequest r;
    r.prompt = prompt;
    r.sampling.max_tokens = 4;
    r.sampling.ignore_eos = true;
    h.add(r);
    ASSERT_TRUE(h.engine->run().is_ok());
    ASSERT_GE(records.size(), 4u);
    const std::vector<std::pair<int64_t, int64_t>> want = {{522, 0}, {1, 522}, {1, 523}, {1, 524}};
    for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(records[i].items.size(), 1u) << i;
        EXPECT_EQ(records[i].items[0].q, want[i].first) << i;
        EXPECT_EQ(records[i].items[0].c, want[i].second) << i;
        EXPECT_GE(records[i].end_ns, records[i].start_ns);
        EXPECT_GE(records[i].cpu_ns, 0);  // Linux has a thread CPU clock
    }
    EXPECT_EQ(static_cast<int64_t>(records.size()), h.engine->stats().steps);
    records.clear();
    r.prompt.resize(4 * 128 + 5);
    for (int i = 0; i < 20; ++i) r.prompt.push_back(2 + i);
    h.add(r);
    ASSERT_TRUE(h.engine->run().is_ok());
    ASSERT_FALSE(records.empty());
    ASSERT_EQ(records[0].items.size(), 1u);
    EXPECT_EQ(records[0].items[0].c, 512);  // the cached blocks
    EXPECT_EQ(records[0].items[0].q, 4 * 128 + 5 + 20 - 512);
}

TEST(EngineTest, NCompletionsShareThePromptBlocks) {
    GenerateRequest r;
    for (int i = 0; i < 300; ++i) r.prompt.push_back(i % 512);
    r.sampling.n = 3;
    r.sampling.temperature = 1.0;
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    Harness h(base_options());
    RequestId id = h.add(r);
    ASSERT_TRUE(h.engine->run().is_ok());
    ASSERT_EQ(h.out[id].size(), 3u);
    EXPECT_NE(h.out[id][0].tokens, h.out[id][1].tokens);
    EXPECT_EQ(h.engine->stats().cached_prompt_tokens, 2 * 256);
    EXPECT_EQ(h.engine->stats().num_finished, 1);
}

TEST(EngineTest, StopIdsMaxTokensAndMinTokens) {
    GenerateRequest r;
    r.prompt = {5, 6, 7};
    r.sampling.max_tokens = 8;
    r.sampling.ignore_eos = true;
    Harness h(base_options());
    RequestId a = h.add(r);
    ASSERT_TRUE(h.engine->run().is_ok());
    const std::vector<int32_t> greedy = h.out[a][0].tokens;
    ASSERT_EQ(greedy.size(), 8u);
    r.sampling.stop_token_ids = {greedy[2]};
    RequestId b = h.add(r);
    r.sampling.min_tokens = 3;
    r.sampling.stop_token_ids = {greedy[0]};
    RequestId c = h.add(r);
    ASSERT_TRUE(h.engine->run().is_ok());
    EXPECT_EQ(h.out[b][0].reason, FinishReason::kStop);
    // Stops at the first occurrence of the stop id (kept in the output).
    const auto first = std::find(greedy.begin(), greedy.end(), greedy[2]) - greedy.begin();
    EXPECT_EQ(h.out[b][0].tokens.size(), static_cast<size_t>(first + 1));
    EXPECT_GE(h.out[c][0].tokens.size(), 3u);
    EXPECT_EQ(h.out[a][0].reason, FinishReason::kLength);
}

TEST(EngineTest, MalformedInputAndLimits) {
    EngineOptions o = base_options();
    o.num_kv_blocks = 4;
    o.max_model_len = 600;
    Harness h(o);
    auto code = [&](GenerateRequest r) {
        return h.engine->add_request(std::move(r), nullptr).status().code();
    };
    GenerateRequest r;
    EXPECT_EQ(code(r), StatusCode::kInvalidArgument);  // empty prompt
    r.prompt = {1, 512};
    EXPECT_EQ(code(r), StatusCode::kInvalidArgument);  // outside the vocabulary
    r.prompt = {1, 2};
    r.sampling.top_p = 2;
    EXPECT_EQ(code(r), StatusCode::kInvalidArgument);
    r.sampling = {};
    r.sampling.stop = {"x"};
    EXPECT_EQ(code(r), StatusCode::kInvalidArgument);  // no tokenizer
    r.sampling = {};
    r.prompt.assign(590, 3);
    r.sampling.max_tokens = 20;
    EXPECT_EQ(code(r), StatusCode::kOutOfRange);  // over max_model_len
    r.prompt.assign(520, 3);
    r.sampling.max_tokens = 1;
    EXPECT_EQ(code(r), StatusCode::kResourceExhausted);  // 5 blocks > pool of 4
    EXPECT_EQ(h.engine->abort(12345).code(), StatusCode::kNotFound);
    EXPECT_FALSE(Engine::create(
                     &shared_model(),
                     [] {
                         EngineOptions bad;
                         bad.scheduler.max_running_seqs = 0;
                         return bad;
                     }(),
                     Env::default_env())
                     .is_ok());
}

TEST(EngineTest, AbortFreesBlocksAtOnce) {
    EngineOptions o = base_options();
    o.scheduler.cost.per_q_ns = 1000;
    o.scheduler.step_budget_ns = 64'000;  // 64-token chunks
    Harness h(o);
    GenerateRequest r;
    r.prompt.assign(400, 9);
    r.sampling.max_tokens = 50;
    RequestId id = h.add(r);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.engine->step().is_ok());
    EXPECT_GT(h.engine->stats().pool.num_used, 0);
    ASSERT_TRUE(h.engine->abort(id).is_ok());
    EXPECT_EQ(h.out[id][0].reason, FinishReason::kAbort);
    EXPECT_EQ(h.engine->stats().pool.num_used, 0);
    EXPECT_EQ(h.engine->abort(id).code(), StatusCode::kNotFound);
    ASSERT_TRUE(h.engine->run().is_ok());
    ASSERT_TRUE(h.engine->check_invariants().is_ok());
}

TEST(EngineTest, DeadlineFinishesOnTheEngineClock) {
    FakeClockEnv clock(0);
    Harness h(base_options(), &clock);
    GenerateRequest r;
    r.prompt = {1, 2, 3};
    r.sampling.max_tokens = 100;
    r.sampling.ignore_eos = true;
    r.deadline_ns = 1000;
    RequestId id = h.add(r);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(h.engine->step().is_ok());
    clock.advance_ns(2000);
    ASSERT_TRUE(h.engine->run().is_ok());
    EXPECT_EQ(h.out[id][0].reason, FinishReason::kDeadline);
    EXPECT_LT(h.out[id][0].tokens.size(), 100u);
}

// Block accounting: many random requests (shared prefixes, random sizes) with random
// aborts; the invariant routine holds throughout and at the end every block is free
// or cached.
TEST(EngineTest, BlockAccountingUnderRandomAborts) {
    static std::unique_ptr<DeepseekModel> small = make_model(1);
    std::mt19937_64 rng(11);
    EngineOptions o = base_options();
    o.record_logits = false;
    o.num_kv_blocks = 24;
    o.scheduler.cost.per_q_ns = 1000;
    o.scheduler.step_budget_ns = 300'000;
    Harness h(o, Env::default_env(), small.get());
    std::vector<std::vector<int32_t>> prefixes(4);
    for (auto& p : prefixes) {
        p.resize(128 + rng() % 40);
        for (auto& t : p) t = static_cast<int32_t>(rng() % 512);
    }
    const int kRequests = 10'000;
    std::vector<RequestId> live;
    int added = 0;
    int64_t steps = 0;
    while (added < kRequests || h.engine->has_work()) {
        for (int k = 0; k < 8 && added < kRequests; ++k, ++added) {
            GenerateRequest r;
            if (rng() % 3) r.prompt = prefixes[rng() % prefixes.size()];
            const int extra = 1 + static_cast<int>(rng() % 24);
            for (int i = 0; i < extra; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 512));
            r.sampling.max_tokens = 1 + static_cast<int64_t>(rng() % 2);
            r.sampling.n = rng() % 10 == 0 ? 2 : 1;
            r.sampling.temperature = 0.7;
            r.sampling.seed = rng();
            live.push_back(h.add(std::move(r)));
        }
        // Abort a few at random (some already finished: NOT_FOUND is fine).
        for (int k = 0; k < 3 && !live.empty(); ++k) {
            const size_t i = rng() % live.size();
            Status s = h.engine->abort(live[i]);
            ASSERT_TRUE(s.is_ok() || s.code() == StatusCode::kNotFound);
            live[i] = live.back();
            live.pop_back();
        }
        ASSERT_TRUE(h.engine->step().is_ok());
        if (++steps % 64 == 0) {
            Status inv = h.engine->check_invariants();
            ASSERT_TRUE(inv.is_ok()) << inv.to_string();
        }
    }
    ASSERT_TRUE(h.engine->check_invariants().is_ok());
    EngineStats st = h.engine->stats();
    EXPECT_EQ(st.pool.num_used, 0);
    EXPECT_EQ(st.pool.num_free + st.pool.num_cached, 24);
    EXPECT_EQ(st.num_finished, kRequests);
    EXPECT_GT(st.cached_prompt_tokens, 0);
}

}  // namespace
}  // namespace dsi::engine

namespace dsi::engine {
namespace {

TEST(EngineTest, PreemptionByRecomputeGivesTheSameTokens) {
    GenerateRequest r;
    r.prompt.assign(100, 4);
    r.sampling.max_tokens = 200;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = 0.8;
    EngineOptions o = base_options();
    Harness alone(o);
    RequestId a = alone.add(r);
    ASSERT_TRUE(alone.engine->run().is_ok());
    for (bool async : {false, true}) {
        o.num_kv_blocks = 3;  // one sequence of 300 tokens needs all 3
        o.async = async;
        o.swap_space_bytes = 0;  // recompute only (swapping: engine_swap_test)
        Harness h(o);
        RequestId x = h.add(r);
        RequestId y = h.add(r);
        ASSERT_TRUE(h.engine->run().is_ok());
        EXPECT_GT(h.engine->stats().preemptions, 0);
        EXPECT_EQ(h.out[x][0].tokens, alone.out[a][0].tokens);
        EXPECT_EQ(h.out[y][0].tokens, alone.out[a][0].tokens);
        EXPECT_TRUE(h.out[y][0].logits == alone.out[a][0].logits);
    }
}

}  // namespace
}  // namespace dsi::engine
