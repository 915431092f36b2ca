// Synthetic DeepSeek checkpoints: presets and deterministic random weights.
//
// Each tensor's values depend only on (seed, tensor name), so any subset can be
// generated in any order and every output format (HF bf16, HF FP8, GGUF) is made
// from the same values. Scales keep activations O(1); the lm_head is scaled so the
// next-token distribution is peaked (logit std ~ kSyntheticLogitStd).
// Presets (docs/models.md): "tiny" (V2-style, unit tests), "tiny-v3" (V3-style: q_lora,
// sigmoid + noaux_tc groups, MTP), "small" (DeepSeek-V2-Lite widths, few layers).
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

}  // namespace dsi
