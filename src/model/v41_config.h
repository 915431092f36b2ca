// V41TextConfig: the part of a DeepSeek-V4.1-Flash config.json that sizes its
// per-sequence SWA state (architectures ["DeepseekV41ForCausalLM"], model_type
// deepseek_v41, the fields under `text_config`; reference deepseek_v4.md §7.1-7.3).
// It is not the V4.1 model (issue 16, deliverable 1): `dsinfer plan` reads it to print
// the SWA slot (S-KV-8) until the model's own config lands, which should absorb it.
//
// CED layout (§7.2): the causal encoder is the layers before the decoder's only KV
// source, max(kv_source_layer_ids) (layers 0-19 of 40); its SWA is the stored region.
// The decoder layers and the DSpark draft layers keep SWA that is rebuilt by bounded
// replay, never stored; the ratio-2 compressors of the encoder's Full layers keep one
// pending token (f32 kv + score rows of head_dim), also dropped.
// Thread model: plain value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsi {

struct V41TextConfig {
    std::string architecture;  // architectures[0]
    int64_t num_hidden_layers = 0;
    int64_t head_dim = 0;
    int64_t sliding_window = 0;
    int64_t num_nextn_predict_layers = 0;  // DSpark draft layers
    std::vector<int64_t> compress_ratios;  // main layers, then draft layers
    std::vector<int64_t> kv_source_layer_ids;

    // Layers before the first decoder layer (max(kv_source_layer_ids)).
    int64_t encoder_layers() const;
    // One SWA row as MXFP8 over all head_dim values: e4m3 + one ue8m0 scale per 32.
    int64_t swa_row_bytes() const { return head_dim + head_dim / 32; }
    // The encoder KV sources' partial compressor groups: (ratio - 1) pending tokens of
    // f32 kv and score rows of head_dim each.
    int64_t partial_state_bytes() const;
    // INVALID_ARGUMENT naming the field.
    Status validate() const;
};

// Whether `json_text` is a V4.1 config (architectures[0] "DeepseekV41ForCausalLM" or
// model_type "deepseek_v41"); false for anything else, malformed text included.
bool is_v41_config(std::string_view json_text);
// The fields above from text_config; INVALID_ARGUMENT for a missing or bad field.
Result<V41TextConfig> parse_v41_config(std::string_view json_text);

}  // namespace dsi
