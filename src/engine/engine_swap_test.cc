// Preemption by swapping KV blocks to host memory (kv::HostSwapSpace + engine), and the
// batch-invariant switch: outputs bitwise equal to runs without preemption, no
// deadlock or starvation, no leak of host slots, abort of a swapped-out request.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace dsi::engine {
namespace {

GenerateRequest long_request(double temperature) {
    GenerateRequest r;
    r.prompt.assign(60, 4);
    r.sampling.max_tokens = 100;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = temperature;
    r.sampling.seed = 3;
    return r;
}

// Two 160-token sequences in a 2-block pool: the newer is preempted again and again.
// Swapped or recomputed, both give bitwise the tokens and logits of a run alone.
TEST(EngineSwapTest, SwapAndRecomputeGiveTheSameOutputAsNoPreemption) {
    const GenerateRequest r = long_request(0.8);
    Harness alone(base_options());
    const RequestId a = alone.add(r);
    ASSERT_TRUE(alone.engine->run().is_ok());
    ASSERT_EQ(alone.out[a][0].tokens.size(), 100u);
    for (bool async : {false, true}) {
        for (int64_t swap_bytes : {int64_t{0}, int64_t{1} << 30}) {
            EngineOptions o = base_options();
            o.num_kv_blocks = 2;
            o.async = async;
            o.swap_space_bytes = swap_bytes;
            Harness h(o);
            const RequestId x = h.add(r);
            const RequestId y = h.add(r);
            h.run_checked();
            const EngineStats st = h.engine->stats();
            const std::string what = std::string("async ") + (async ? "on" : "off") +
                                     (swap_bytes ? ", swap" : ", recompute");
            EXPECT_GT(st.preemptions, 0) << what;
            if (swap_bytes > 0) {
                EXPECT_EQ(st.preemptions_swapped, st.preemptions) << what;
                EXPECT_EQ(st.swapped_in_blocks, st.swapped_out_blocks) << what;
            } else {
                EXPECT_EQ(st.preemptions_swapped, 0) << what;
            }
            EXPECT_EQ(st.swap_slots_held, 0) << what;
            for (RequestId id : {x, y}) {
                EXPECT_EQ(h.out[id][0].reason, FinishReason::kLength) << what;
                EXPECT_EQ(h.out[id][0].tokens, alone.out[a][0].tokens) << what;
                EXPECT_TRUE(h.out[id][0].logits == alone.out[a][0].logits) << what;
            }
        }
    }
}

// Many requests of random sizes in a small pool with a host space too small for every
// victim (so both swap and recompute happen), random aborts: every survivor finishes
// with all its tokens (no deadlock, no starvation), targets match their runs alone
// bitwise, and block and host-slot accounting holds after every step.
TEST(EngineSwapTest, MixedSwapAndRecomputeUnderLoad) {
    std::mt19937_64 rng(5);
    const int64_t slot_bytes = shared_model().kv_num_layers() * 128 *
                               shared_model().kv_row_floats() * static_cast<int64_t>(sizeof(float));
    int64_t swapped = 0, recomputed = 0;
    for (int round = 0; round < 2; ++round) {
        EngineOptions o = base_options();
        o.num_kv_blocks = 6;
        o.swap_space_bytes = slot_bytes;  // victims past 127 rows are recomputed
        o.async = round == 0;
        o.scheduler.cost.base_ns = 0;
        o.scheduler.cost.per_q_ns = 1000;
        o.scheduler.step_budget_ns = 1000.0 * (20 + static_cast<double>(rng() % 200));
        Harness h(o);
        std::vector<std::pair<RequestId, GenerateRequest>> reqs;
        for (int k = 0; k < 10; ++k) {
            GenerateRequest r;
            const int len = 1 + static_cast<int>(rng() % 250);
            for (int i = 0; i < len; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 512));
            r.sampling.max_tokens = 30 + static_cast<int64_t>(rng() % 100);
            r.sampling.ignore_eos = true;
            r.sampling.temperature = rng() % 2 ? 0.9 : 0.0;
            r.sampling.seed = rng();
            reqs.push_back({h.add(r), r});
        }
        std::vector<RequestId> aborted;
        int64_t step = 0;
        while (h.engine->has_work()) {
            ASSERT_TRUE(h.engine->step().is_ok());
            Status inv = h.engine->check_invariants();
            ASSERT_TRUE(inv.is_ok()) << inv.to_string();
            if (++step % 25 == 0 && aborted.size() < 2) {
                const RequestId id = reqs[rng() % reqs.size()].first;
                if (h.engine->abort(id).is_ok()) aborted.push_back(id);
            }
        }
        const EngineStats st = h.engine->stats();
        swapped += st.preemptions_swapped;
        recomputed += st.preemptions - st.preemptions_swapped;
        EXPECT_EQ(st.swap_slots_held, 0);
        EXPECT_EQ(st.pool.num_used, 0);
        for (const auto& [id, r] : reqs) {
            if (std::find(aborted.begin(), aborted.end(), id) != aborted.end()) continue;
            ASSERT_EQ(h.out[id][0].reason, FinishReason::kLength) << "round " << round;
            ASSERT_EQ(static_cast<int64_t>(h.out[id][0].tokens.size()), r.sampling.max_tokens);
        }
        // Three of them against a run alone (bitwise logits).
        for (int k = 0; k < 3; ++k) {
            const auto& [id, r] = reqs[static_cast<size_t>(k) * 3 + 1];
            if (std::find(aborted.begin(), aborted.end(), id) != aborted.end()) continue;
            Harness alone(base_options());
            const RequestId a = alone.add(r);
            ASSERT_TRUE(alone.engine->run().is_ok());
            EXPECT_EQ(h.out[id][0].tokens, alone.out[a][0].tokens) << "round " << round;
            EXPECT_TRUE(h.out[id][0].logits == alone.out[a][0].logits) << "round " << round;
        }
    }
    std::printf("preemptions: %lld swapped, %lld recomputed\n", static_cast<long long>(swapped),
                static_cast<long long>(recomputed));
    EXPECT_GT(swapped, 0);
    EXPECT_GT(recomputed, 0);
}

TEST(EngineSwapTest, AbortOfASwappedOutRequestFreesItsHostSpace) {
    const GenerateRequest r = long_request(0.0);
    for (bool async : {false, true}) {
        EngineOptions o = base_options();
        o.num_kv_blocks = 2;
        o.async = async;
        Harness h(o);
        const RequestId x = h.add(r);
        const RequestId y = h.add(r);
        int steps = 0;
        while (h.engine->stats().swap_slots_held == 0) {
            ASSERT_TRUE(h.engine->has_work());
            ASSERT_TRUE(h.engine->step().is_ok());
            ASSERT_LT(++steps, 1000) << "no swap-out happened";
        }
        // Only the newer request is ever preempted (the oldest always progresses).
        ASSERT_TRUE(h.engine->abort(y).is_ok());
        EXPECT_EQ(h.out[y][0].reason, FinishReason::kAbort);
        EXPECT_EQ(h.engine->stats().swap_slots_held, 0);
        Status inv = h.engine->check_invariants();
        ASSERT_TRUE(inv.is_ok()) << inv.to_string();
        h.run_checked();
        EXPECT_EQ(h.out[x][0].tokens.size(), 100u);
        EXPECT_EQ(h.engine->stats().pool.num_used, 0);
    }
}

// S-ENG-6 switch: with batch_invariant on (the default, set explicitly here), a request's
// logits are bitwise the same alone and batched with others at different positions.
TEST(EngineSwapTest, BatchInvariantSwitchOnGivesBatchIndependentOutputs) {
    EXPECT_TRUE(EngineOptions().batch_invariant);
    GenerateRequest target = long_request(0.7);
    target.sampling.max_tokens = 12;
    EngineOptions o = base_options();
    o.batch_invariant = true;
    Harness alone(o);
    const RequestId a = alone.add(target);
    ASSERT_TRUE(alone.engine->run().is_ok());
    std::mt19937_64 rng(9);
    for (int batch : {1, 5, 12}) {
        Harness h(o);
        for (int k = 0; k < batch; ++k) {
            GenerateRequest other;
            const int len = 1 + static_cast<int>(rng() % 150);
            for (int i = 0; i < len; ++i) other.prompt.push_back(static_cast<int32_t>(rng() % 512));
            other.sampling.max_tokens = 1 + static_cast<int64_t>(rng() % 20);
            h.add(other);
        }
        const RequestId t = h.add(target);
        ASSERT_TRUE(h.engine->run().is_ok());
        EXPECT_EQ(h.out[t][0].tokens, alone.out[a][0].tokens) << batch;
        EXPECT_TRUE(h.out[t][0].logits == alone.out[a][0].logits) << batch;
    }
}

}  // namespace
}  // namespace dsi::engine
