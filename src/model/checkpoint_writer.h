// Writers for synthetic checkpoints in the real formats (`dsinfer make-model`).
//
// Both writers take the same deterministic values (model/synthetic.h), so an HF
// directory and a GGUF file written from one (config, seed) hold the same weights:
// HF bf16 = GGUF F32/BF16 exactly; HF FP8 = codes * scale_inv = GGUF F32 exactly.
// Thread model: single-threaded functions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "base/env.h"
#include "base/status.h"
#include "model/config.h"
#include "model/weights.h"
#include "tensor/dtype.h"

namespace dsi {

struct TokenizerFiles {
    std::string tokenizer_json;         // contents of tokenizer.json
    std::string tokenizer_config_json;  // contents of tokenizer_config.json
};
// Reads tokenizer.json and tokenizer_config.json from `dir`.
Result<TokenizerFiles> read_tokenizer_files(Env* env, const std::string& dir);

// Writes config.json, *.safetensors (bf16, or FP8 e4m3 + f32 weight_scale_inv when
// config.fp8; shards of at most `max_shard_bytes` with an index), generation_config.json
// and the tokenizer files into `dir`.
Status write_hf_checkpoint(Env* env, const ModelConfig& config, uint64_t seed,
                           const TokenizerFiles& tokenizer, const std::string& dir,
                           uint64_t max_shard_bytes = 2ull << 30);

// Writes a llama.cpp `deepseek2` GGUF with matrices in `matrix_dtype` (F32, F16, BF16
// or Q8_0; norms, biases and the router stay F32) and the tokenizer metadata llama.cpp
// needs (gpt2 BPE, pre-tokenizer deepseek-v3, vocabulary padded to vocab_size).
// `expert_dtype` (default: matrix_dtype) is the type of the merged routed-expert
// tensors (ffn_{gate,up,down}_exps): any of those, or MXFP4 (SPEC S-ENG-9, quantised
// with llama.cpp's reference rounding).
// `attn_kv_b_dtype` (default: see below) is the type of the per-head attn_k_b and
// attn_v_b. By default attn_k_b is F32 in an F32 file and BF16 otherwise (llama.cpp's
// AMX variant aborts on a Q8_0/F16 attn_k_b, docs/gguf_deepseek2.md section 8) and
// attn_v_b has matrix_dtype. The Q8_0 agreement test passes F32: dsinfer rebuilds kv_b
// in f32 from these two, so f32 on both sides keeps that product out of the comparison.
Status write_gguf_checkpoint(Env* env, const ModelConfig& config, uint64_t seed,
                             const TokenizerFiles& tokenizer, DType matrix_dtype,
                             const std::string& path,
                             std::optional<DType> expert_dtype = std::nullopt,
                             std::optional<DType> attn_kv_b_dtype = std::nullopt);

// The f32 values of one tensor of deepseek_tensor_specs(config), for writers fed
// from something other than the synthetic generator (a trained model's packed
// artifact, modelpack/). HF output rounds them to bf16 (exact when they are bf16
// values); GGUF output stores them in the requested types.
using TensorValues = std::function<Result<std::vector<float>>(const TensorSpec&)>;

// As above with the weights from `values`. HF: bf16 (e_score_correction_bias f32);
// INVALID_ARGUMENT for an FP8 config (FP8 codes come only from the synthetic path).
Status write_hf_checkpoint(Env* env, const ModelConfig& config, const TensorValues& values,
                           const TokenizerFiles& tokenizer, const std::string& dir,
                           uint64_t max_shard_bytes = 2ull << 30);
Status write_gguf_checkpoint(Env* env, const ModelConfig& config, const TensorValues& values,
                             const TokenizerFiles& tokenizer, DType matrix_dtype,
                             const std::string& path,
                             std::optional<DType> expert_dtype = std::nullopt,
                             std::optional<DType> attn_kv_b_dtype = std::nullopt);

}  // namespace dsi
