// Test helpers shared by the engine's tests: a small in-memory model (reduced
// vocabulary) and a harness that collects every completion's tokens and logits.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/deepseek.h"
#include "model/synthetic.h"

namespace dsi::engine {

inline std::unique_ptr<DeepseekModel> make_model(int layers = 0) {
    ModelConfig c = synthetic_preset("tiny-v3").value();
    c.vocab_size = 512;
    if (layers > 0) c.num_hidden_layers = layers;
    auto m = DeepseekModel::load(synthetic_memory_model(c, 1234), {2});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return std::move(m).value();
}

inline DeepseekModel& shared_model() {
    static std::unique_ptr<DeepseekModel> m = make_model();
    return *m;
}

// Rank `rank` of an expert-parallel group of `ranks` over make_model()'s weights (the
// forked-rank tests); nullptr (and the reason on stderr) when it cannot load or attach.
inline std::unique_ptr<DeepseekModel> ep_model(const std::string& group, int rank, int ranks) {
    ModelConfig c = synthetic_preset("tiny-v3").value();
    c.vocab_size = 512;
    DeepseekModel::Options o;
    o.num_threads = 1;
    o.expert_parallel.num_ranks = ranks;
    o.expert_parallel.rank = rank;
    o.expert_parallel.group = group;
    o.expert_parallel.max_tokens_per_call = 8;  // prefills take several MoE rounds
    o.expert_parallel.op_timeout_ms = 20'000;
    o.expert_parallel.idle_timeout_ms = 20'000;
    auto m = DeepseekModel::load(synthetic_memory_model(c, 1234), o);
    if (!m.is_ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, m.status().to_string().c_str());
        return nullptr;
    }
    return std::move(m).value();
}

// n random token ids in [2, 2 + range).
inline std::vector<int32_t> random_prompt(int64_t n, uint32_t seed, uint32_t range) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t& t : p) t = 2 + static_cast<int32_t>(rng() % range);
    return p;
}

struct Completion {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
    FinishReason reason = FinishReason::kNone;
};

inline EngineOptions base_options() {
    EngineOptions o;
    o.num_kv_blocks = 64;
    o.record_logits = true;
    o.scheduler.step_budget_ns = 1e12;
    return o;
}

struct Harness {
    std::unique_ptr<Engine> engine;
    std::map<RequestId, std::map<int32_t, Completion>> out;

    explicit Harness(EngineOptions o, Env* env = Env::default_env(),
                     CausalLm* model = &shared_model()) {
        engine = Engine::create(model, std::move(o), env).value();
    }
    RequestId add(GenerateRequest r) {
        Result<RequestId> id = engine->add_request(std::move(r), [this](const TokenEvent& ev) {
            Completion& c = out[ev.request_id][ev.index];
            if (ev.token >= 0) {
                c.tokens.push_back(ev.token);
                c.logits.emplace_back(ev.logits.begin(), ev.logits.end());
            }
            if (ev.finished) c.reason = ev.reason;
        });
        EXPECT_TRUE(id.is_ok()) << id.status().to_string();
        return id.value();
    }
    // Steps to the end, checking the block and swap invariants after every step.
    void run_checked() {
        while (engine->has_work()) {
            ASSERT_TRUE(engine->step().is_ok());
            Status inv = engine->check_invariants();
            ASSERT_TRUE(inv.is_ok()) << inv.to_string();
        }
    }
};

}  // namespace dsi::engine
