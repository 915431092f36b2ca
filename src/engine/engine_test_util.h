// Test helpers shared by the engine's tests: a small in-memory model (reduced
// vocabulary), a harness that collects every completion's tokens and logits, and a
// prefill -> decode hand-over between two engines (issue 18).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kv/swa_pool.h"
#include "kvstore/block_format.h"
#include "kvstore/block_store.h"
#include "kvstore/shm_store.h"
#include "model/causal_lm.h"
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

// The synthetic weights of the engine tests' `preset` (tiny-v3: make_model()'s; V4 presets
// through their own generator), vocabulary 512.
inline std::unique_ptr<WeightSource> test_weights(const std::string& preset) {
    ModelConfig c = synthetic_preset(preset).value();
    c.vocab_size = 512;
    if (c.v4_layout()) return synthetic_v4_memory_model(c, 1234);
    return synthetic_memory_model(c, 1234);
}

// Rank `rank` of an expert-parallel group of `ranks` over test_weights(preset) (the
// forked-rank tests); nullptr (and the reason on stderr) when it cannot load or attach.
inline std::unique_ptr<CausalLm> ep_model(const std::string& group, int rank, int ranks,
                                          const std::string& preset = "tiny-v3") {
    ModelOptions o;
    o.num_threads = 1;
    o.expert_parallel.num_ranks = ranks;
    o.expert_parallel.rank = rank;
    o.expert_parallel.group = group;
    o.expert_parallel.max_tokens_per_call = 8;  // prefills take several MoE rounds
    o.expert_parallel.op_timeout_ms = 20'000;
    o.expert_parallel.idle_timeout_ms = 20'000;
    auto m = load_causal_lm(test_weights(preset), o);
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

// Issue 18 prefill -> decode hand-over between two engines over `model`, without the
// network (serving/kv_handoff.h carries the same export): engine A runs `request` to its
// first token with export_kv; the export goes where a decode engine's KvInbox puts it
// (blocks into decode.store, the SWA state into decode.pool); engine B (decode.options)
// continues with resume_output = that token.
struct HandoffRun {
    std::shared_ptr<const kv::KvExport> exported;
    Completion prefill;  // A's one token
    Completion decode;   // B's tokens after it
    EngineStats decode_stats;

    // The whole generation as one engine streams it.
    Completion joined() const {
        Completion c = prefill;
        c.tokens.insert(c.tokens.end(), decode.tokens.begin(), decode.tokens.end());
        c.logits.insert(c.logits.end(), decode.logits.begin(), decode.logits.end());
        return c;
    }
};

// A decode engine's side of a hand-over: its store tier (an shm store of `slots` blocks
// of `shape`), its SWA pool, and engine options naming both.
struct HandoffDecodeSide {
    std::unique_ptr<kvstore::ShmBlockStore> store;
    std::unique_ptr<kv::SwaStatePool> pool;
    EngineOptions options;
};

inline HandoffDecodeSide decode_side(const StoreBlockShape& shape, const std::string& name,
                                     int64_t slots) {
    HandoffDecodeSide d;
    kvstore::ShmStoreOptions so;
    so.name = name + "_" + std::to_string(::getpid());
    (void)kvstore::ShmBlockStore::unlink(so.name);
    so.num_slots = slots;
    so.slot_bytes = static_cast<int64_t>(
        (kvstore::header_bytes(shape.num_layers()) + shape.block_bytes() + 4095) / 4096 * 4096);
    so.unlink_on_close = true;
    d.store = kvstore::ShmBlockStore::open(so).value();
    d.pool = std::make_unique<kv::SwaStatePool>(int64_t{64} << 20);
    d.options = base_options();
    d.options.kv_store = d.store.get();
    d.options.swa_pool = d.pool.get();
    return d;
}

inline HandoffRun run_handoff(CausalLm* model, GenerateRequest request,
                              const HandoffDecodeSide& decode) {
    HandoffRun run;
    {
        GenerateRequest r = request;
        r.sampling.max_tokens = 1;
        r.export_kv = true;
        Harness a(base_options(), Env::default_env(), model);
        EXPECT_TRUE(a.engine
                        ->add_request(r,
                                      [&](const TokenEvent& ev) {
                                          if (ev.token >= 0) {
                                              run.prefill.tokens.push_back(ev.token);
                                              run.prefill.logits.emplace_back(ev.logits.begin(),
                                                                              ev.logits.end());
                                          }
                                          if (ev.finished) run.exported = ev.kv_export;
                                      })
                        .is_ok());
        a.run_checked();
    }
    if (run.exported == nullptr || run.prefill.tokens.size() != 1) {
        ADD_FAILURE() << "the prefill engine exported nothing";
        return run;
    }
    const kv::KvExport& e = *run.exported;
    for (size_t b = 0; b < e.num_blocks(); ++b) {
        std::vector<std::span<const uint8_t>> layers;
        for (uint32_t l = 0; l < e.num_layers(); ++l) layers.push_back(e.layer(l, b));
        EXPECT_TRUE(decode.store->put(e.info(b), layers).is_ok());
    }
    if (e.swa_state != nullptr) {
        EXPECT_TRUE(
            decode.pool->put(e.swa_state->key, e.swa_state->traffic_class, e.swa_state->bytes)
                .is_ok());
    }
    Harness b(decode.options, Env::default_env(), model);
    request.resume_output = run.prefill.tokens;
    const RequestId id = b.add(std::move(request));
    b.run_checked();
    run.decode = b.out[id][0];
    run.decode_stats = b.engine->stats();
    return run;
}

}  // namespace dsi::engine
