// Scheduler policy with a fake clock and a simple cost model.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

namespace dsi::engine {
namespace {

SchedulerConfig linear_config(double budget_ns) {
    SchedulerConfig c;
    c.step_budget_ns = budget_ns;
    c.cost = {};
    c.cost.base_ns = 0;
    c.cost.per_q_ns = 1000;  // 1 us per new token
    c.cost.per_c_ns = 0;
    c.cost.per_qc_ns = 1;  // attention against the prefix
    c.cost.per_qq_ns = 0;
    return c;
}

SeqView waiting(int64_t id, int64_t tokens) {
    SeqView v;
    v.id = id;
    v.num_tokens = tokens;
    return v;
}

SeqView decoding(int64_t id, int64_t computed) {
    SeqView v;
    v.id = id;
    v.num_tokens = computed;
    v.num_computed = computed;
    v.num_blocks = blocks_for_tokens(computed);
    v.num_exclusive_blocks = v.num_blocks;
    v.decoding = true;
    return v;
}

TEST(SchedulerTest, ChunkIsTheLargestThatFitsTheBudget) {
    FakeClockEnv env;
    SchedulerConfig cfg = linear_config(100'000);
    Scheduler s(cfg, &env);
    std::vector<SeqView> w = {waiting(1, 1000)};
    ScheduleDecision d = s.schedule({}, w, 100);
    ASSERT_EQ(d.scheduled.size(), 1u);
    EXPECT_EQ(d.scheduled[0].num_new_tokens, 100);
    EXPECT_TRUE(d.scheduled[0].admit);
    EXPECT_EQ(d.scheduled[0].num_new_blocks, 1);
    // A sequence with a computed prefix gets less (q*c term): the solver's answer.
    SeqView r = waiting(2, 5000);
    r.num_computed = 2000;
    r.num_blocks = blocks_for_tokens(2000);
    std::vector<SeqView> run = {r};
    d = s.schedule(run, {}, 100);
    ASSERT_EQ(d.scheduled.size(), 1u);
    const int64_t q = d.scheduled[0].num_new_tokens;
    EXPECT_EQ(q, cfg.cost.max_chunk_tokens(100'000, 2000, 3000));
    EXPECT_LE(cfg.cost.cost_ns(q, 2000), 100'000);
    EXPECT_GT(cfg.cost.cost_ns(q + 1, 2000), 100'000);
    EXPECT_LT(q, 100);
}

// The base is a step's fixed part, paid once: with the medium preset's fitted shape
// (base 250 ms, 2.5 ms a token, 2 s budget, here in us) 64 decoders still leave room to
// admit prompts; charged per sequence, the decoders alone would spend 16 s.
TEST(SchedulerTest, BaseIsChargedOncePerStep) {
    FakeClockEnv env;
    SchedulerConfig cfg = linear_config(2'000'000);
    cfg.cost.base_ns = 250'000;
    cfg.cost.per_q_ns = 2'500;
    cfg.cost.per_qc_ns = 0;
    Scheduler s(cfg, &env);
    std::vector<SeqView> run;
    for (int64_t i = 0; i < 60; ++i) run.push_back(decoding(i, 100));
    std::vector<SeqView> w;
    for (int64_t i = 0; i < 8; ++i) w.push_back(waiting(100 + i, 32));
    ScheduleDecision d = s.schedule(run, w, 1000);
    // 60 decodes: 250 ms + 60 x 2.5 ms = 400 ms; then 32-token prompts at 80 ms each: the
    // running limit (64) admits 4 of the 8.
    ASSERT_EQ(d.scheduled.size(), 64u);
    for (size_t i = 60; i < 64; ++i) {
        EXPECT_TRUE(d.scheduled[i].admit);
        EXPECT_EQ(d.scheduled[i].num_new_tokens, 32);
    }
    EXPECT_DOUBLE_EQ(d.cost_ns, 250'000 + 2'500.0 * (60 + 4 * 32));
    // The budget binds with the base counted once: 1,750 ms left after the base buys
    // 700 tokens, so a lone 1,000-token prompt gets a first chunk of 700.
    std::vector<SeqView> big = {waiting(7, 1000)};
    d = s.schedule({}, big, 1000);
    ASSERT_EQ(d.scheduled.size(), 1u);
    EXPECT_EQ(d.scheduled[0].num_new_tokens, 700);
    // After one decoder (base + 2.5 ms) the prompt gets what the base left: 699 tokens.
    std::vector<SeqView> one = {decoding(1, 100)};
    d = s.schedule(one, big, 1000);
    ASSERT_EQ(d.scheduled.size(), 2u);
    EXPECT_EQ(d.scheduled[1].num_new_tokens, 699);
    EXPECT_DOUBLE_EQ(d.cost_ns, 250'000 + 2'500.0 * 700);
}

TEST(SchedulerTest, ChunkCappedAtS_LBLimitAndBatchTokens) {
    FakeClockEnv env;
    SchedulerConfig cfg = linear_config(1e15);
    cfg.max_batched_tokens = 1 << 20;
    Scheduler s(cfg, &env);
    std::vector<SeqView> w = {waiting(1, 100'000)};
    ScheduleDecision d = s.schedule({}, w, 10'000);
    ASSERT_EQ(d.scheduled.size(), 1u);
    EXPECT_EQ(d.scheduled[0].num_new_tokens, kMaxPrefillChunkTokens);
    cfg.max_batched_tokens = 300;
    Scheduler s2(cfg, &env);
    d = s2.schedule({}, w, 10'000);
    EXPECT_EQ(d.scheduled[0].num_new_tokens, 300);
}

TEST(SchedulerTest, DecodeFirstThenPrefillWithWhatIsLeft) {
    FakeClockEnv env;
    Scheduler s(linear_config(50'000), &env);
    std::vector<SeqView> run = {decoding(1, 10), decoding(2, 20)};
    std::vector<SeqView> w = {waiting(3, 1000)};
    ScheduleDecision d = s.schedule(run, w, 100);
    ASSERT_EQ(d.scheduled.size(), 3u);
    EXPECT_EQ(d.scheduled[0].id, 1);
    EXPECT_EQ(d.scheduled[1].id, 2);
    EXPECT_EQ(d.scheduled[0].num_new_tokens, 1);
    // 50 us - (1 us + 10 ns) - (1 us + 20 ns) leaves room for 47 tokens.
    EXPECT_EQ(d.scheduled[2].num_new_tokens, 47);
}

TEST(SchedulerTest, TinyBudgetStillMakesProgress) {
    FakeClockEnv env;
    Scheduler s(linear_config(10), &env);
    std::vector<SeqView> w = {waiting(1, 1000), waiting(2, 10)};
    ScheduleDecision d = s.schedule({}, w, 100);
    ASSERT_EQ(d.scheduled.size(), 1u);
    EXPECT_EQ(d.scheduled[0].num_new_tokens, 1);
}

TEST(SchedulerTest, FifoAdmissionNoOvertakingAndRunningLimit) {
    FakeClockEnv env;
    SchedulerConfig cfg = linear_config(1e12);
    cfg.max_running_seqs = 2;
    Scheduler s(cfg, &env);
    // Head needs 8 blocks, only 2 available: it gets a partial chunk; the rest wait.
    std::vector<SeqView> w = {waiting(1, 1000), waiting(2, 10), waiting(3, 10)};
    ScheduleDecision d = s.schedule({}, w, 2);
    ASSERT_EQ(d.scheduled.size(), 1u);
    EXPECT_EQ(d.scheduled[0].num_new_tokens, 256);
    // With room, admission stops at max_running_seqs.
    d = s.schedule({}, w, 100);
    EXPECT_EQ(d.scheduled.size(), 2u);
    // No blocks at all: nothing is admitted, nobody overtakes the head.
    d = s.schedule({}, w, 0);
    EXPECT_TRUE(d.scheduled.empty());
}

TEST(SchedulerTest, AdmissionUsesThePrefixHit) {
    FakeClockEnv env;
    Scheduler s(linear_config(1e12), &env);
    SeqView w = waiting(1, 600);
    w.num_cached_tokens = 512;
    w.num_cached_unreferenced_blocks = 4;
    std::vector<SeqView> ws = {w};
    ScheduleDecision d = s.schedule({}, ws, 5);
    ASSERT_EQ(d.scheduled.size(), 1u);
    EXPECT_EQ(d.scheduled[0].num_new_tokens, 88);
    EXPECT_EQ(d.scheduled[0].num_new_blocks, 1);
    // Pinning 4 unreferenced blocks leaves too few for the suffix.
    d = s.schedule({}, ws, 4);
    EXPECT_TRUE(d.scheduled.empty());
}

TEST(SchedulerTest, PreemptsNewestToLetOldestDecode) {
    FakeClockEnv env;
    Scheduler s(linear_config(1e12), &env);
    // Three decoding sequences, each at a block boundary: each needs a new block.
    std::vector<SeqView> run = {decoding(1, 128), decoding(2, 256), decoding(3, 128)};
    ScheduleDecision d = s.schedule(run, {}, 0);
    // 1 takes 3's single block; 2 then takes nothing (only newer victims: none left).
    ASSERT_EQ(d.preempted.size(), 1u);
    EXPECT_EQ(d.preempted[0], 3);
    ASSERT_EQ(d.scheduled.size(), 1u);
    EXPECT_EQ(d.scheduled[0].id, 1);
    EXPECT_EQ(d.scheduled[0].num_new_blocks, 1);
}

TEST(SchedulerTest, PrefillOfOldestPreemptsNewerToAvoidDeadlock) {
    FakeClockEnv env;
    Scheduler s(linear_config(1e12), &env);
    // Both half-way through a prefill, pool full: without preemption nobody moves.
    SeqView a = waiting(1, 512);
    a.num_computed = 256;
    a.num_blocks = a.num_exclusive_blocks = 2;
    SeqView b = a;
    b.id = 2;
    std::vector<SeqView> run = {a, b};
    ScheduleDecision d = s.schedule(run, {}, 0);
    ASSERT_EQ(d.preempted.size(), 1u);
    EXPECT_EQ(d.preempted[0], 2);
    ASSERT_EQ(d.scheduled.size(), 1u);
    EXPECT_EQ(d.scheduled[0].id, 1);
    EXPECT_EQ(d.scheduled[0].num_new_tokens, 256);
}

TEST(SchedulerTest, DeadlinesExpireOnTheInjectedClock) {
    FakeClockEnv env(1000);
    Scheduler s(linear_config(1e12), &env);
    SeqView r = decoding(1, 10);
    r.deadline_ns = 2000;
    SeqView w = waiting(2, 10);
    w.deadline_ns = 1500;
    std::vector<SeqView> run = {r}, ws = {w};
    EXPECT_TRUE(s.schedule(run, ws, 10).expired.empty());
    env.advance_ns(600);
    ScheduleDecision d = s.schedule(run, ws, 10);
    EXPECT_EQ(d.expired, std::vector<int64_t>({2}));
    env.advance_ns(1000);
    d = s.schedule(run, ws, 10);
    EXPECT_EQ(d.expired, std::vector<int64_t>({1, 2}));
    EXPECT_TRUE(d.scheduled.empty());
}

TEST(SchedulerTest, ConfigValidation) {
    SchedulerConfig c;
    EXPECT_TRUE(c.validate().is_ok());
    c.max_running_seqs = 0;
    EXPECT_FALSE(c.validate().is_ok());
    c = {};
    c.step_budget_ns = 0;
    EXPECT_FALSE(c.validate().is_ok());
}

}  // namespace
}  // namespace dsi::engine
