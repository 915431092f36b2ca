// A replica: one model served by one engine, built from one options struct. Every
// command that runs a model (`serve`, `generate`, `bench offline`, `calibrate`) opens it
// here, so a setting means the same thing everywhere (docs/serving.md).
//
// open_replica() resolves the checkpoint (the embedded default when none is given:
// serving/default_model.h), loads the tokenizer and the model, derives the two names
// of the model id rule (serving/model_id.h), opens the KV store tier from its URI, loads
// the prefill cost model fitted by `dsinfer calibrate` beside the checkpoint
// (engine::cost_model_path_for) and creates the engine over all of it.
//
// Ownership and destruction order: the Replica owns tokenizer, model, store and engine;
// the engine goes first (its write-behind and fetch threads stop and drain while the
// store is still there), then the store, then the model, then the tokenizer. Anything
// that borrows the engine (server::EngineService) must be gone before the Replica.
//
// Thread model: open_replica and the accessors run on the caller's thread; the engine's
// own rules (engine/engine.h) apply to engine().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/env.h"
#include "base/status.h"
#include "engine/engine.h"
#include "kv/swa_pool.h"
#include "kv/yoco_prefill.h"
#include "model/causal_lm.h"
#include "tokenizer/tokenizer.h"

namespace dsi::kvstore {
class BlockStore;
}

namespace dsi::serving {

struct ReplicaOptions {
    // Checkpoint: HF directory or .gguf file; "" = the embedded default model, created
    // under cache_dir from the tokenizer files in data_dir.
    std::string model_path;
    std::string model_id;        // served model name; "" = from the path (model_id.h)
    std::string tokenizer_dir;   // "" = the checkpoint's directory
    std::string cache_dir;       // "" = default_cache_dir()
    std::string data_dir;        // "" = found beside the binary (data_dir.h)
    bool load_tokenizer = true;  // false: no tokenizer (token-id benchmarks, calibrate)
    // false: the checkpoint's config and tokenizer only, no weights, no engine (the
    // router: it encodes and renders but runs no model).
    bool load_model = true;

    // Model (ModelOptions, model/causal_lm.h: V2/V3 or V4 from the checkpoint).
    int num_threads = 0;  // 0: every core
    std::string weight_format = "auto";
    std::string kv_dtype = "f32";
    // This process as one rank of an expert-parallel group (model/expert_parallel.h);
    // num_ranks 1: off.
    ExpertParallelOptions expert_parallel;

    // Engine. open_replica fills engine.model_id (the cache identity), engine.tokenizer,
    // engine.cost_model_path (when empty: the calibrate fit beside the checkpoint, used
    // when it exists; when given, the file must exist) and engine.kv_store; the rest is
    // used as given.
    bool create_engine = true;
    engine::EngineOptions engine;
    // Speculation's files beside the checkpoint (issue 24). draft_vocab: a
    // dsinfer-draft-vocab-v1 file | "auto" (draft_vocab.json beside the checkpoint when
    // drafting with MTP and the file exists) | "none"/"" (whole vocabulary); sets
    // engine.speculative.draft_vocab_path. verify_cost_path (with
    // engine.speculative.varlen): the curve file, "" = dsinfer_verify_cost.json beside the
    // checkpoint, profiled and written there when missing; sets engine.verify_cost.
    std::string draft_vocab = "auto";
    std::string verify_cost_path;
    // KV block store below the pool (kvstore::open_block_store): "" = none. A malformed
    // URI fails open_replica; a store that cannot be reached is logged and left out
    // (serving goes on without it, as every later store failure is a miss).
    std::string kv_store_uri;
    // Issue 18, decode engines of a disaggregated cluster: bytes of an in-process shm
    // tier (kvstore::ShmBlockStore, LRU) in front of the store, where a KvInbox puts the
    // blocks prefill engines hand over (0: none). Ignored for models without a store
    // tier (engine::store_block_shape is nullopt) and without an engine. V4 / V4.1: the
    // replica then also owns the engine's SWA state pool (engine.swa_pool_bytes), where
    // the inbox puts the handed-over states (swa_pool()).
    int64_t kv_inbox_bytes = 0;
    // With an inbox (V2/V3): how long a hand-over landed in the engine's pool is held for
    // its continuation (engine::KvLanding's ttl).
    std::chrono::milliseconds kv_landing_ttl{10'000};
    // Issue 18, every engine of a cluster: the replica owns the engine's SWA state pool
    // for a V4 / V4.1 model (as with an inbox), so what it holds can be announced to the
    // routers' SWA directory and pulled by other engines (swa_pool()).
    bool own_swa_pool = false;
    // V4.1 (CED) decoder bounded replay (S-SWA, kv/yoco_prefill.h): checked at start
    // (to_replica_options) and again with the draft count by Engine::create for a V4.1
    // model; copied into engine.yoco_prefill.
    kv::YocoPrefillSettings yoco_prefill;
};

class Replica {
public:
    ~Replica();
    Replica(const Replica&) = delete;
    Replica& operator=(const Replica&) = delete;

    const std::string& model_path() const { return model_path_; }  // resolved
    bool is_default_model() const { return is_default_model_; }
    const std::string& served_model_name() const { return served_model_name_; }
    const std::string& cache_identity() const { return cache_identity_; }
    // Null when ReplicaOptions::load_tokenizer is false.
    const Tokenizer* tokenizer() const { return tokenizer_.get(); }
    // Null when ReplicaOptions::load_model is false.
    CausalLm* model() const { return model_.get(); }
    // The checkpoint's config (also without a model).
    const ModelConfig& config() const { return config_; }
    // Null when ReplicaOptions::create_engine is false.
    engine::Engine* engine() const { return engine_.get(); }
    // Null: no store (none asked for, or unreachable at start).
    kvstore::BlockStore* kv_store() const { return store_.get(); }
    // The hand-over tier (ReplicaOptions::kv_inbox_bytes), part of kv_store(); null
    // when none. Its blocks' shape: kv_block_shape().
    kvstore::BlockStore* kv_inbox() const { return inbox_; }
    const std::optional<engine::StoreBlockShape>& kv_block_shape() const { return block_shape_; }
    // The engine's SWA state pool when the replica owns it (a V4 / V4.1 model with an
    // inbox, ReplicaOptions::kv_inbox_bytes, or own_swa_pool); null otherwise.
    // Thread-safe.
    kv::SwaStatePool* swa_pool() const { return swa_pool_.get(); }
    // Where hand-overs land in the engine's own pool (engine/kv_landing.h): made with
    // an inbox for a V2/V3 model (engine_options().kv_landing); null otherwise.
    // Thread-safe; survives reset_engine (the new engine attaches).
    engine::KvLanding* kv_landing() const { return engine_options_.kv_landing.get(); }
    // The options the engine was created with (after resolution).
    const engine::EngineOptions& engine_options() const { return engine_options_; }

    // Destroys the engine (if any) and creates a fresh one over the same model, store
    // and tokenizer, e.g. engine_options() with async flipped (benchmarks). The model id,
    // tokenizer and store fields of `options` are taken from this replica.
    Status reset_engine(engine::EngineOptions options);

private:
    friend Result<std::unique_ptr<Replica>> open_replica(ReplicaOptions options, Env* env);
    Replica() = default;

    Env* env_ = nullptr;
    std::string model_path_;
    bool is_default_model_ = false;
    std::string served_model_name_;
    std::string cache_identity_;
    engine::EngineOptions engine_options_;
    ModelConfig config_;
    // Declaration order is construction order; the destructor releases in reverse
    // (engine, SWA pool, store, model, tokenizer) explicitly.
    std::unique_ptr<Tokenizer> tokenizer_;
    std::unique_ptr<CausalLm> model_;
    std::unique_ptr<kvstore::BlockStore> store_;
    kvstore::BlockStore* inbox_ = nullptr;  // inside store_
    std::optional<engine::StoreBlockShape> block_shape_;
    std::unique_ptr<kv::SwaStatePool> swa_pool_;  // with a V4 inbox; survives reset_engine
    std::unique_ptr<engine::Engine> engine_;
};

// INVALID_ARGUMENT for bad options (a malformed store URI, a bad KV dtype or weight
// format), NOT_FOUND for a missing checkpoint or tokenizer, and whatever loading the
// checkpoint reports; each error says which setting it is about.
Result<std::unique_ptr<Replica>> open_replica(ReplicaOptions options, Env* env);

}  // namespace dsi::serving
