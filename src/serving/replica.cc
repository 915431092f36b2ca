#include "serving/replica.h"

#include <unistd.h>

#include "base/logging.h"
#include "engine/calibrate.h"
#include "kvstore/block_store.h"
#include "kvstore/shm_store.h"
#include "model/draft_vocab.h"
#include "model/weights.h"
#include "serving/data_dir.h"
#include "serving/default_model.h"
#include "serving/model_id.h"

namespace dsi::serving {
namespace {

bool is_gguf_path(const std::string& path) { return path.ends_with(".gguf"); }

// The checkpoint's directory: the model directory, or the folder of a .gguf file.
std::string checkpoint_dir(const std::string& model_path) {
    if (!is_gguf_path(model_path)) {
        return model_path;
    }
    const size_t slash = model_path.rfind('/');
    return slash == std::string::npos ? "." : model_path.substr(0, slash);
}

// Issue 24: the MTP draft vocabulary and the verify-cost curve of variable-length
// verification, both kept beside the checkpoint by default.
Status resolve_speculation_files(Env* env, const std::string& model_path, CausalLm* model,
                                 const ReplicaOptions& options, engine::EngineOptions& eo) {
    spec::SpecConfig& sc = eo.speculative;
    const std::string& dv = options.draft_vocab;
    if (dv == "auto") {
        const std::string beside = checkpoint_dir(model_path) + "/" + kDraftVocabFile;
        sc.draft_vocab_path =
            sc.method == spec::Method::kMtp && env->file_exists(beside) ? beside : "";
    } else if (dv == "none" || dv.empty()) {
        sc.draft_vocab_path.clear();
    } else {
        if (!env->file_exists(dv)) return not_found("--spec-draft-vocab " + dv + " does not exist");
        sc.draft_vocab_path = dv;
    }
    if (!sc.varlen || !sc.enabled() || !options.create_engine) return Status::ok();
    if (!options.verify_cost_path.empty() && !env->file_exists(options.verify_cost_path)) {
        return not_found("--verify-cost " + options.verify_cost_path + " does not exist");
    }
    const std::string path = options.verify_cost_path.empty()
                                 ? engine::verify_cost_path_for(model_path)
                                 : options.verify_cost_path;
    Result<spec::VerifyCostCurve> curve = engine::ensure_verify_cost(env, model, path);
    if (!curve.is_ok()) {
        // A read-only checkpoint directory: profile in memory (the engine does).
        DSI_LOG(kWarning) << "verify cost curve: " << curve.status().to_string();
        return Status::ok();
    }
    eo.verify_cost = std::make_shared<const spec::VerifyCostCurve>(std::move(curve).value());
    return Status::ok();
}

}  // namespace

Replica::~Replica() {
    engine_.reset();  // stops the engine's store threads while the store is alive
    swa_pool_.reset();
    store_.reset();
    model_.reset();
    tokenizer_.reset();
}

Status Replica::reset_engine(engine::EngineOptions options) {
    engine_.reset();
    options.model_id = engine_options_.model_id;
    options.tokenizer = tokenizer_.get();
    options.kv_store = store_.get();
    options.kv_store_uri.clear();
    if (swa_pool_) options.swa_pool = swa_pool_.get();  // the inbox puts states there
    DSI_ASSIGN_OR_RETURN(engine_, engine::Engine::create(model_.get(), options, env_));
    engine_options_ = std::move(options);
    return Status();
}

namespace {

// The hand-over tier: an anonymous shared mapping of this process (the shm store's
// layout, nothing in /dev/shm) in front of the store, sized in whole encoded blocks of
// the model's shape.
Result<std::unique_ptr<kvstore::ShmBlockStore>> open_kv_inbox(const engine::StoreBlockShape& shape,
                                                              int64_t bytes, Env* env) {
    const int64_t block =
        static_cast<int64_t>(kvstore::header_bytes(shape.num_layers()) + shape.block_bytes());
    const int64_t slot = (block + 4095) / 4096 * 4096;
    if (bytes < slot) {
        return invalid_argument("kv inbox of " + std::to_string(bytes) +
                                " bytes holds no block of " + std::to_string(block) + " bytes");
    }
    kvstore::ShmStoreOptions o;
    o.name = "dsinfer-inbox-" + std::to_string(::getpid()) + "-" +
             std::to_string(env->wall_ns() % 1000000007);
    o.num_slots = bytes / slot;
    o.slot_bytes = slot;
    o.anonymous = true;  // in-process only: nothing in /dev/shm, nothing left by a crash
    return kvstore::ShmBlockStore::open(o);
}

}  // namespace

Result<std::unique_ptr<Replica>> open_replica(ReplicaOptions options, Env* env) {
    std::unique_ptr<Replica> r(new Replica());
    r->env_ = env;
    r->model_path_ = options.model_path;
    r->is_default_model_ = options.model_path.empty();
    // The store first: a malformed URI fails before minutes of loading.
    if (!options.kv_store_uri.empty()) {
        Result<std::unique_ptr<kvstore::BlockStore>> store =
            kvstore::open_block_store(options.kv_store_uri);
        if (store.is_ok()) {
            r->store_ = std::move(store).value();
        } else if (store.status().code() == StatusCode::kInvalidArgument) {
            return store.status().with_context("--kv-store " + options.kv_store_uri);
        } else {
            DSI_LOG(kWarning) << "kv store " << options.kv_store_uri
                              << " unavailable, serving without it: " << store.status().to_string();
        }
    }
    if (r->is_default_model_) {
        Result<std::string> tok_dir = find_tokenizer_data_dir(env, options.data_dir);
        if (!tok_dir.is_ok()) {
            return tok_dir.status().with_context("the default model");
        }
        const std::string cache =
            options.cache_dir.empty() ? default_cache_dir() : options.cache_dir;
        Result<std::string> data_dir = find_data_dir(env, options.data_dir);
        const std::string pack =
            data_dir.is_ok() ? *data_dir + "/" + kDefaultModelPack : std::string();
        DSI_ASSIGN_OR_RETURN(r->model_path_, ensure_default_model(env, cache, *tok_dir, pack));
    }
    const std::string& path = r->model_path_;
    r->served_model_name_ = served_model_name(options.model_id, path, r->is_default_model_);
    Result<std::string> fingerprint = checkpoint_fingerprint(env, path);
    if (!fingerprint.is_ok()) {
        return fingerprint.status().with_context("--model");
    }
    r->cache_identity_ = cache_identity(*fingerprint, options.weight_format);

    if (options.load_tokenizer) {
        const std::string tok_dir =
            options.tokenizer_dir.empty() ? checkpoint_dir(path) : options.tokenizer_dir;
        Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::load(env, tok_dir);
        if (!tok.is_ok()) {
            return tok.status().with_context("tokenizer (--tokenizer-dir)");
        }
        r->tokenizer_ = std::move(tok).value();
    }

    Result<std::unique_ptr<WeightSource>> source = open_checkpoint(env, path);
    if (!source.is_ok()) {
        return source.status().with_context("--model");
    }
    r->config_ = (*source)->config();
    if (!options.load_model) return r;
    ModelOptions mo;
    mo.num_threads = options.num_threads > 0 ? options.num_threads : env->num_cpus();
    mo.weight_format = options.weight_format;
    mo.kv_dtype = options.kv_dtype;
    mo.expert_parallel = options.expert_parallel;
    DSI_ASSIGN_OR_RETURN(r->model_, load_causal_lm(std::move(source).value(), mo));

    engine::EngineOptions eo = std::move(options.engine);
    if (!eo.cost_model_path.empty() && !env->file_exists(eo.cost_model_path)) {
        return not_found("--cost-model " + eo.cost_model_path + " does not exist");
    }
    if (eo.cost_model_path.empty()) {
        eo.cost_model_path = engine::cost_model_path_for(path);  // `dsinfer calibrate`
    }
    if (r->is_default_model_ && options.create_engine) {
        // Issue 22 D3: the embedded default calibrates its prefill cost model on first
        // start (a quick grid, kept beside the model); a failure leaves the conservative
        // estimate the engine uses without a fit.
        Result<engine::PrefillCostModel> cost =
            engine::ensure_cost_model(env, r->model_.get(), eo.cost_model_path);
        if (!cost.is_ok()) {
            DSI_LOG(kWarning) << "calibration: " << cost.status().to_string();
        }
    }
    DSI_RETURN_IF_ERROR(resolve_speculation_files(env, path, r->model_.get(), options, eo));
    r->block_shape_ = engine::store_block_shape(*r->model_, eo.yoco_prefill.mode);
    if (options.kv_inbox_bytes > 0 && options.create_engine) {
        if (!r->block_shape_) {
            DSI_LOG(kInfo) << "no KV hand-over inbox: this model's cache has no store tier";
        } else {
            DSI_ASSIGN_OR_RETURN(std::unique_ptr<kvstore::ShmBlockStore> inbox,
                                 open_kv_inbox(*r->block_shape_, options.kv_inbox_bytes, env));
            r->inbox_ = inbox.get();
            if (r->store_) {
                r->store_ = std::make_unique<kvstore::TieredBlockStore>(std::move(inbox),
                                                                        std::move(r->store_));
            } else {
                r->store_ = std::move(inbox);
            }
        }
    }
    if (r->block_shape_ && r->block_shape_->swa_state_bytes > 0 && eo.swa_pool == nullptr &&
        options.create_engine && (r->inbox_ != nullptr || options.own_swa_pool)) {
        // V4 / V4.1: handed-over and pulled states go where the engine's hit rule looks.
        r->swa_pool_ = std::make_unique<kv::SwaStatePool>(eo.swa_pool_bytes);
        eo.swa_pool = r->swa_pool_.get();
    }
    if (r->inbox_ != nullptr && r->block_shape_->swa_state_bytes == 0 &&
        eo.kv_landing == nullptr) {
        // V2/V3: a hand-over is received straight into the engine's pool.
        eo.kv_landing = std::make_shared<engine::KvLanding>(options.kv_landing_ttl);
    }
    r->engine_options_ = eo;
    r->engine_options_.model_id = r->cache_identity_;
    r->engine_options_.tokenizer = r->tokenizer_.get();
    r->engine_options_.kv_store = r->store_.get();
    r->engine_options_.kv_store_uri.clear();
    if (options.create_engine) {
        DSI_RETURN_IF_ERROR(r->reset_engine(r->engine_options_));
    }
    return r;
}

}  // namespace dsi::serving
