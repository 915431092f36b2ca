// The memory plan of a checkpoint (`dsinfer plan`): weight bytes by stored format,
// KV bytes per token by layer kind, per-sequence state bytes, and the total at a given
// context, from the config alone (model/weights.h tensor specs), so a bare config.json
// (the real DeepSeek-V4-Flash's included) can be planned without its weights.
//
// Two KV layouts are planned, both what the engine allocates: --kv-dtype f32 ("dsinfer":
// f32 rows; V4 state slot) and --kv-dtype e4m3 ("compact"; V2/V3: e4m3 with one scale
// per 16 values; V4: the FP8 layout of reference
// deepseek_v4.md §4.2 — 584-byte entries of 448 e4m3 + 64 bf16 + 8 scale bytes,
// 68-byte MXFP4 indexer keys).
// Thread model: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"

namespace dsi {

struct MemoryPlan {
    struct WeightFormat {
        std::string format;  // "bf16", "f32", "fp8-e4m3 (+ue8m0 128x128)", "fp4-e2m1 (+ue8m0/32)", ...
        int64_t tensors = 0;
        int64_t bytes = 0;  // data + scales
    };
    struct LayerKind {
        std::string kind;  // "mla", "window", "ratio-4 + indexer", "ratio-128"
        int64_t layers = 0;
        // Context-proportional bytes per token, summed over the kind's layers.
        double dsinfer_bytes_per_token = 0;
        double compact_bytes_per_token = 0;
        // Fixed bytes per sequence (window rings, compressor accumulators), summed.
        int64_t dsinfer_state_bytes = 0;
        int64_t compact_state_bytes = 0;
    };
    std::string architecture;
    std::vector<WeightFormat> weights;
    int64_t weight_bytes = 0;
    std::vector<LayerKind> kinds;
    int64_t context = 0;
    // One sequence of `context` tokens: per-token entries (whole groups only) + state.
    int64_t dsinfer_kv_bytes = 0;
    int64_t compact_kv_bytes = 0;
    // V4 only, for the SWA state slot (S-KV-8, kv/swa_rules.h SwaSlotShape): one window
    // row in the compact layout, and every compressor's partial-window accumulators of
    // one sequence (f32; the same in both layouts).
    int64_t compact_window_row_bytes = 0;
    int64_t accumulator_bytes = 0;
};

// REQUIRES: config.validate() is ok; context >= 1.
MemoryPlan plan_memory(const ModelConfig& config, int64_t context);

// The plan as text; `available_bytes` (0: unknown) decides the "fits" line.
std::string format_memory_plan(const MemoryPlan& plan, int64_t available_bytes);

}  // namespace dsi
