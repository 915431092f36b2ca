// Synthetic DeepSeek checkpoints: presets and deterministic random weights.
//
// Each tensor's values depend only on (seed, tensor name), so any subset can be
// generated in any order and every output format (HF bf16, HF FP8, GGUF) is made
// from the same values. Scales keep activations O(1); the lm_head is scaled so the
// next-token distribution is peaked (logit std ~ kSyntheticLogitStd).
// Presets (docs/models.md): "tiny" (V2-style, unit tests), "tiny-v3" (V3-style: q_lora,
// sigmoid + noaux_tc groups, MTP), "small" (DeepSeek-V2-Lite widths, few layers),
// "medium" (the benchmark shape: V2 widths, 30 layers, 16 routed experts; docs/models.md).
// Thread model: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsi {

inline constexpr double kSyntheticLogitStd = 6.0;

std::vector<std::string> synthetic_preset_names();
Result<ModelConfig> synthetic_preset(std::string_view name);

// FP8 e4m3 codes with f32 block scales (weight_scale_inv), as DeepSeek ships them.
struct Fp8Matrix {
    std::vector<uint8_t> codes;   // [rows, cols]
    std::vector<float> scale_inv;  // [ceil(rows/br), ceil(cols/bc)]
};

// The master values of one tensor (f32). With fp8 = true (config.fp8), quantizable
// matrices come back already on the FP8 grid: exactly codes * scale_inv, with
// scale_inv a power of two (ue8m0) or a bf16 value, so f32 holds them exactly.
// Otherwise values are rounded to bf16.
std::vector<float> synthetic_tensor(const ModelConfig& config, const TensorSpec& spec,
                                    uint64_t seed);
// REQUIRES: config.fp8 and spec.quantizable and a 2-D shape.
Fp8Matrix synthetic_fp8(const ModelConfig& config, const TensorSpec& spec, uint64_t seed);

// All tensors in memory (small configs only: tests).
std::unique_ptr<MemoryWeightSource> synthetic_memory_model(const ModelConfig& config,
                                                           uint64_t seed);

// ---- DeepSeek V4 (presets "tiny-v4", "small-v4") ----

// One V4 tensor as the official checkpoint stores it (model/weights.h V4Storage) and
// its exact f32 values. FP8: e4m3 codes + ue8m0 scale bytes per 128x128 block; FP4:
// e2m1 pairs [rows, cols/2] (low nibble = even element) + ue8m0 scale bytes [rows,
// cols/32]; I64: tid2eid (distinct experts per token).
struct V4SyntheticTensor {
    DType dtype = DType::kBF16;     // what the HF checkpoint stores (kI8 for FP4)
    std::vector<int64_t> stored_shape;
    std::vector<uint8_t> codes;     // FP8 / FP4 codes
    std::vector<uint8_t> scales;    // e8m0 bytes (FP8 / FP4 only)
    std::vector<int64_t> scale_shape;
    std::vector<int32_t> ints;      // tid2eid (written as I64)
    std::vector<float> values;      // exact values (dequantised codes, bf16-rounded, ints)
};
V4SyntheticTensor synthetic_v4_tensor(const ModelConfig& config, const V4TensorSpec& spec,
                                      uint64_t seed);
std::unique_ptr<MemoryWeightSource> synthetic_v4_memory_model(const ModelConfig& config,
                                                              uint64_t seed);
// FP4 e2m1 with one ue8m0 scale per 32 (DeepSeek V4 experts): code of the nearest
// e2m1 value to x / scale (ties to the even code); scale = 2^ceil(log2(amax / 6)).
uint8_t f32_to_e2m1(float x);
float e2m1_to_f32(uint8_t code);

}  // namespace dsi
