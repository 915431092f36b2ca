#include "modelpack/modelpack.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/logging.h"
#include "model/draft_vocab.h"
#include "tensor/dtype.h"

namespace dsi {
namespace {

constexpr int64_t kBlock = 32;  // columns per power-of-two scale

// Which vocabulary-rule pair serves an embedding / head tensor of the full model
// (the MTP copies included); empty for every other tensor.
std::pair<std::string, std::string> vocab_rule(const ModelConfig& c, const std::string& name) {
    const std::string mtp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    if (name == "model.embed_tokens.weight" || name == mtp + "embed_tokens.weight") {
        return {"model.embed_tokens.weight", "model.embed_tokens.other"};
    }
    if (name == "lm_head.weight" || name == mtp + "shared_head.head.weight") {
        return {"lm_head.weight", "lm_head.other"};
    }
    return {};
}

uint64_t fnv1a(std::string_view bytes) {
    uint64_t h = 1469598103934665603ULL;
    for (char ch : bytes) {
        h ^= static_cast<uint8_t>(ch);
        h *= 1099511628211ULL;
    }
    return h;
}

}  // namespace

ModelPack::ModelPack(SafetensorsFile file, ModelConfig config)
    : file_(std::move(file)), config_(std::move(config)) {}

Result<std::unique_ptr<ModelPack>> ModelPack::open(Env* env, const std::string& path) {
    DSI_ASSIGN_OR_RETURN(std::string bytes, env->read_file(path));
    const uint64_t digest = fnv1a(bytes);
    DSI_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(env, path));
    const auto& meta = file.metadata();
    auto it = meta.find("format");
    if (it == meta.end() || it->second != kModelPackFormat) {
        return invalid_argument(path + ": not a model pack (metadata format must be '" +
                                std::string(kModelPackFormat) + "')");
    }
    it = meta.find("config");
    if (it == meta.end()) return invalid_argument(path + ": metadata has no config");
    Result<ModelConfig> config = parse_hf_config(it->second);
    if (!config.is_ok()) return config.status().with_context(path + ": config");
    if (config->fp8) return invalid_argument(path + ": a model pack config must not be FP8");
    it = meta.find("recipe");
    std::string recipe = it == meta.end() ? "{}" : it->second;
    std::unique_ptr<ModelPack> pack(new ModelPack(std::move(file), std::move(config).value()));
    pack->digest_ = digest;
    pack->recipe_ = std::move(recipe);
    DSI_RETURN_IF_ERROR(pack->check());
    return pack;
}

Status ModelPack::check() {
    const std::string& path = file_.path();
    const SafetensorsEntry* ids = file_.find("vocab.used_ids");
    if (ids == nullptr || ids->dtype != DType::kI32 || ids->shape.size() != 1) {
        return invalid_argument(path + ": vocab.used_ids must be a 1-D I32 tensor");
    }
    TensorView v = file_.view(*ids);
    used_ids_.resize(static_cast<size_t>(ids->shape[0]));
    std::memcpy(used_ids_.data(), v.data.data(), used_ids_.size() * 4);
    for (size_t i = 0; i < used_ids_.size(); ++i) {
        if (used_ids_[i] < 0 || used_ids_[i] >= config_.vocab_size ||
            (i > 0 && used_ids_[i] <= used_ids_[i - 1])) {
            return invalid_argument(path + ": vocab.used_ids must ascend within [0, vocab_size)");
        }
    }
    // Every tensor of the full model must be derivable; values() re-checks shapes.
    for (const TensorSpec& spec : deepseek_tensor_specs(config_)) {
        auto [rows_name, other] = vocab_rule(config_, spec.name);
        const std::string name = rows_name.empty() ? spec.name : rows_name;
        if (file_.find(name) == nullptr) {
            return not_found(path + ": missing tensor " + name);
        }
        if (!other.empty() && file_.find(other) == nullptr) {
            return not_found(path + ": missing tensor " + other);
        }
    }
    return Status::ok();
}

// A stored tensor as f32: int8 codes with e8m0 scales (matrices) or F32 (vectors).
Result<std::vector<float>> ModelPack::stored(const std::string& name, int64_t rows,
                                             int64_t cols) const {
    const std::string where = file_.path() + ": " + name;
    DSI_ASSIGN_OR_RETURN(TensorView t, file_.view(name));
    std::vector<float> out(static_cast<size_t>(rows * cols));
    if (t.dtype == DType::kF32) {
        if (t.numel() != rows * cols) return invalid_argument(where + ": wrong size");
        std::memcpy(out.data(), t.data.data(), out.size() * 4);
        return out;
    }
    if (t.dtype != DType::kI8 || t.shape != std::vector<int64_t>{rows, cols} || cols % kBlock) {
        return invalid_argument(where + ": expected I8 [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "] (cols % 32 == 0) or F32");
    }
    DSI_ASSIGN_OR_RETURN(TensorView s, file_.view(name + ".qscale"));
    if (s.dtype != DType::kE8M0 || s.shape != std::vector<int64_t>{rows, cols / kBlock}) {
        return invalid_argument(where + ".qscale: expected F8_E8M0 [rows, cols / 32]");
    }
    const auto* codes = reinterpret_cast<const int8_t*>(t.data.data());
    for (int64_t i = 0; i < rows * cols; ++i) {
        const float scale = e8m0_to_f32(s.data[static_cast<size_t>(i / kBlock)]);
        out[static_cast<size_t>(i)] = static_cast<float>(codes[i]) * scale;
    }
    return out;
}

Result<std::vector<float>> ModelPack::vocab_rows(const std::string& name,
                                                 const std::string& other) const {
    const int64_t V = config_.vocab_size;
    const int64_t H = config_.hidden_size;
    const int64_t n = static_cast<int64_t>(used_ids_.size());
    DSI_ASSIGN_OR_RETURN(std::vector<float> rows, stored(name, n, H));
    DSI_ASSIGN_OR_RETURN(std::vector<float> rest, stored(other, 1, H));
    std::vector<float> out(static_cast<size_t>(V * H));
    for (int64_t id = 0; id < V; ++id) std::copy_n(rest.data(), H, out.data() + id * H);
    for (int64_t i = 0; i < n; ++i) {
        std::copy_n(rows.data() + i * H, H, out.data() + static_cast<int64_t>(used_ids_[i]) * H);
    }
    return out;
}

Result<std::vector<float>> ModelPack::values(const TensorSpec& spec) const {
    auto [rows_name, other] = vocab_rule(config_, spec.name);
    if (!rows_name.empty()) return vocab_rows(rows_name, other);
    const int64_t rows = spec.shape.size() == 2 ? spec.shape[0] : 1;
    const int64_t cols = spec.shape.back();
    return stored(spec.name, rows, cols);
}

TensorValues ModelPack::tensor_values() const {
    return [this](const TensorSpec& spec) { return values(spec); };
}

Status write_pack_draft_vocab(Env* env, const ModelPack& pack, const std::string& hf_dir) {
    // The ids the model was trained on: every other id shares one "other" row, so an
    // MTP draft outside them is never the model's best guess (issue 24).
    return env->write_file(hf_dir + "/" + kDraftVocabFile,
                           draft_vocab_to_json(pack.used_ids(), "vocab.used_ids of the model pack"));
}

Status expand_model_pack(Env* env, const ModelPack& pack, const TokenizerFiles& tokenizer,
                         const std::string& hf_dir, const std::string& gguf_path,
                         DType gguf_dtype) {
    DSI_RETURN_IF_ERROR(
        write_hf_checkpoint(env, pack.config(), pack.tensor_values(), tokenizer, hf_dir));
    DSI_RETURN_IF_ERROR(env->write_file(hf_dir + "/recipe.json", pack.recipe_json() + "\n"));
    DSI_RETURN_IF_ERROR(write_pack_draft_vocab(env, pack, hf_dir));
    if (!gguf_path.empty()) {
        DSI_RETURN_IF_ERROR(write_gguf_checkpoint(env, pack.config(), pack.tensor_values(),
                                                  tokenizer, gguf_dtype, gguf_path));
    }
    return Status::ok();
}

Result<std::string> ensure_expanded_pack(Env* env, const std::string& pack_path,
                                         const std::string& tokenizer_dir,
                                         const std::string& cache_dir) {
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<ModelPack> pack, ModelPack::open(env, pack_path));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(pack->digest()));
    std::string stem = std::filesystem::path(pack_path).stem().string();
    const std::string dir = cache_dir + "/models/" + stem + "-" + std::string(hex, 12);
    if (env->file_exists(dir + "/config.json")) {
        // Expanded before draft vocabularies existed: add it (best effort).
        if (!env->file_exists(dir + "/" + kDraftVocabFile)) {
            Status s = write_pack_draft_vocab(env, *pack, dir);
            if (!s.is_ok()) {
                DSI_LOG(kWarning) << "draft vocabulary: " << s.to_string();
            }
        }
        return dir;
    }
    Result<TokenizerFiles> tok = read_tokenizer_files(env, tokenizer_dir);
    if (!tok.is_ok()) return tok.status().with_context("tokenizer files for the default model");
    const std::string tmp = dir + ".tmp" + std::to_string(env->random_seed() % 100000);
    DSI_RETURN_IF_ERROR(env->create_dirs(tmp));
    Status s = expand_model_pack(env, *pack, *tok, tmp, tmp + "/model-bf16.gguf");
    std::error_code ec;
    if (!s.is_ok()) {
        std::filesystem::remove_all(tmp, ec);
        return s;
    }
    std::filesystem::rename(tmp, dir, ec);
    if (ec && !env->file_exists(dir + "/config.json")) {
        return internal_error("rename " + tmp + " -> " + dir + ": " + ec.message());
    }
    if (ec) std::filesystem::remove_all(tmp, ec);  // another process won the race
    return dir;
}

}  // namespace dsi
