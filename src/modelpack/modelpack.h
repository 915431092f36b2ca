// Model packs: the compact form in which a trained model is committed to the
// repository (dsinfer's embedded default model, issue 17), and its expansion into
// a normal checkpoint (HF directory and/or GGUF).
//
// A pack is one safetensors file, format "dsinfer-default-model/1" (written by
// tools/train/export.py):
//   - every matrix as int8 codes `NAME` [rows, cols] plus one power-of-two scale per
//     32 columns `NAME.qscale` (F8_E8M0): value = code * 2^(e - 127), exact in bf16;
//   - vectors as F32 (norms bf16-valued; e_score_correction_bias any f32);
//   - the vocabulary rule: `vocab.used_ids` (I32, ascending) name the rows stored in
//     `model.embed_tokens.weight` / `lm_head.weight`; every other id of the
//     vocab_size rows gets `model.embed_tokens.other` / `lm_head.other`. The MTP
//     module's embed_tokens / shared_head.head are copies of them (DeepSeek V3).
//   - metadata `format`, `config` (an HF config.json), `recipe` (JSON, free form).
// Every tensor is checked against the config on open; errors name the file and the
// tensor.
//
// Thread model: an opened ModelPack is immutable; values() may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "model/checkpoint_writer.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace dsi {

inline constexpr std::string_view kModelPackFormat = "dsinfer-default-model/1";

class ModelPack {
public:
    static Result<std::unique_ptr<ModelPack>> open(Env* env, const std::string& path);

    const ModelConfig& config() const { return config_; }
    const std::string& recipe_json() const { return recipe_; }
    // 64-bit FNV-1a of the file's bytes (names the expanded copy in a cache).
    uint64_t digest() const { return digest_; }
    // The f32 values of one tensor of deepseek_tensor_specs(config()).
    Result<std::vector<float>> values(const TensorSpec& spec) const;
    TensorValues tensor_values() const;
    // The token ids with rows of their own (ascending); every other id shares one row.
    const std::vector<int32_t>& used_ids() const { return used_ids_; }

private:
    ModelPack(SafetensorsFile file, ModelConfig config);
    Status check();
    Result<std::vector<float>> stored(const std::string& name, int64_t rows, int64_t cols) const;
    Result<std::vector<float>> vocab_rows(const std::string& name, const std::string& other) const;

    SafetensorsFile file_;
    ModelConfig config_;
    std::string recipe_;
    uint64_t digest_ = 0;
    std::vector<int32_t> used_ids_;
};

// Writes the full checkpoint: an HF directory (bf16, the pack's values exactly)
// into `hf_dir`, and when `gguf_path` is not empty a GGUF with `gguf_dtype`
// matrices (F32 / BF16 hold the values exactly); draft_vocab.json beside them.
Status expand_model_pack(Env* env, const ModelPack& pack, const TokenizerFiles& tokenizer,
                         const std::string& hf_dir, const std::string& gguf_path = "",
                         DType gguf_dtype = DType::kBF16);

// draft_vocab.json (model/draft_vocab.h) of the pack's used ids in `hf_dir`: the MTP
// draft vocabulary that speculation picks up beside the checkpoint.
Status write_pack_draft_vocab(Env* env, const ModelPack& pack, const std::string& hf_dir);

// The expanded HF directory of the pack at `pack_path`, under
// `cache_dir`/models/<stem>-<digest>/ (created on first use: written to a temporary
// directory and renamed, so a crash never leaves half a model; a GGUF
// model-bf16.gguf is written beside it). Returns the directory.
Result<std::string> ensure_expanded_pack(Env* env, const std::string& pack_path,
                                         const std::string& tokenizer_dir,
                                         const std::string& cache_dir);

}  // namespace dsi
