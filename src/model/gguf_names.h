// The llama.cpp `deepseek2` GGUF layout: tensor names, metadata keys, and their
// mapping to Hugging Face names and ModelConfig (docs/gguf_deepseek2.md has the
// table and its sources). Thread model: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/gguf.h"

namespace dsi {

struct GgufTensorRef {
    std::string gguf_name;
    int64_t expert = -1;  // >= 0: a slice of a merged [experts, rows, cols] tensor
    // >= 0: column half `col_half` of a [rows, 2 * cols] tensor that concatenates two
    // matrices along their inputs (V4's MTP nextn.eh_proj = [e_proj | h_proj]).
    int col_half = -1;
};

// The GGUF tensor holding HF tensor `hf_name` (nullopt: no GGUF counterpart).
// kv_b_proj maps to attn_kv_b; files that only have attn_k_b/attn_v_b are handled
// by the loader.
std::optional<GgufTensorRef> gguf_tensor_for_hf_name(const ModelConfig& config,
                                                     const std::string& hf_name);

// ModelConfig from deepseek2.* metadata. Errors name the key.
Result<ModelConfig> config_from_gguf(const GgufFile& file);

// The deepseek2.* (and general.*) metadata for `config`, tokenizer keys excluded.
std::vector<std::pair<std::string, GgufValue>> gguf_metadata_for_config(const ModelConfig& config,
                                                                        const std::string& name);

}  // namespace dsi
