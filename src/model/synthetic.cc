#include "model/synthetic.h"

#include <cmath>

#include "base/env.h"
#include "tensor/dtype.h"

namespace dsi {
namespace {

uint64_t name_hash(std::string_view s) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (char c : s) {
        h ^= static_cast<uint8_t>(c);
        h *= 1099511628211ULL;
    }
    return h;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The name whose values a tensor shares (MTP embed/head are copies of the main ones,
// as in DeepSeek V3's checkpoint).
std::string value_source_name(const ModelConfig& c, const std::string& name) {
    const std::string mtp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    if (name == mtp + "embed_tokens.weight") return "model.embed_tokens.weight";
    if (name == mtp + "shared_head.head.weight") return "lm_head.weight";
    return name;
}

// Standard deviation and mean of a tensor's raw values.
void tensor_distribution(const ModelConfig& c, const TensorSpec& spec, double& mean,
                         double& std) {
    const std::string& n = spec.name;
    mean = 0.0;
    if (ends_with(n, "norm.weight") || ends_with(n, "layernorm.weight")) {
        mean = 1.0;
        std = 0.1;
    } else if (n == "model.embed_tokens.weight") {
        std = 1.0;
    } else if (n == "lm_head.weight") {
        std = kSyntheticLogitStd / std::sqrt(static_cast<double>(c.hidden_size));
    } else if (ends_with(n, "e_score_correction_bias")) {
        std = 0.05;
    } else {
        std = 1.0 / std::sqrt(static_cast<double>(spec.shape.back()));
    }
}

std::vector<float> raw_values(const ModelConfig& c, const TensorSpec& spec, uint64_t seed) {
    TensorSpec src = spec;
    src.name = value_source_name(c, spec.name);
    double mean, std;
    tensor_distribution(c, src, mean, std);
    SplitMix64 rng(seed ^ name_hash(src.name));
    std::vector<float> v(static_cast<size_t>(shape_numel(spec.shape)));
    for (float& x : v) x = static_cast<float>(mean + std * rng.next_normal());
    return v;
}

}  // namespace

std::vector<std::string> synthetic_preset_names() { return {"tiny", "tiny-v3", "small"}; }

Result<ModelConfig> synthetic_preset(std::string_view name) {
    ModelConfig c;
    // The real DeepSeek V3 tokenizer: 129280 embedding rows, bos 0, eos 1.
    c.vocab_size = 129280;
    c.bos_token_id = 0;
    c.eos_token_id = 1;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.rope_scaling.yarn = true;
    c.rope_scaling.factor = 40.0;
    c.rope_scaling.beta_fast = 32.0;
    c.rope_scaling.beta_slow = 1.0;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.max_position_embeddings = 163840;
    if (name == "tiny") {
        c.architecture = "DeepseekV2ForCausalLM";
        c.family = ModelFamily::kDeepseekV2;
        c.hidden_size = 128;
        c.intermediate_size = 256;
        c.moe_intermediate_size = 64;
        // 26 layers: llama.cpp's deepseek2 loader takes "no q_lora" (V2-Lite) only
        // for 26- or 27-layer models, and tiny cross-checks that path.
        c.num_hidden_layers = 26;
        c.num_attention_heads = 4;
        c.q_lora_rank = 0;
        c.kv_lora_rank = 64;
        c.qk_nope_head_dim = 32;
        c.qk_rope_head_dim = 16;
        c.v_head_dim = 32;
        c.n_routed_experts = 8;
        c.n_shared_experts = 1;
        c.num_experts_per_tok = 2;
        c.topk_method = TopkMethod::kGreedy;
        c.scoring_func = ScoringFunc::kSoftmax;
        c.norm_topk_prob = false;
        c.routed_scaling_factor = 1.0;
        c.first_k_dense_replace = 1;
        c.rope_scaling.mscale = 0.707;
        c.rope_scaling.mscale_all_dim = 0.707;
    } else if (name == "tiny-v3") {
        c.architecture = "DeepseekV3ForCausalLM";
        c.family = ModelFamily::kDeepseekV3;
        c.hidden_size = 256;
        c.intermediate_size = 512;
        c.moe_intermediate_size = 128;
        c.num_hidden_layers = 3;
        c.num_attention_heads = 4;
        c.q_lora_rank = 192;
        c.kv_lora_rank = 128;
        c.qk_nope_head_dim = 32;
        c.qk_rope_head_dim = 32;
        c.v_head_dim = 32;
        c.n_routed_experts = 16;
        c.n_shared_experts = 1;
        c.num_experts_per_tok = 4;
        c.n_group = 4;
        c.topk_group = 2;
        c.topk_method = TopkMethod::kNoauxTc;
        c.scoring_func = ScoringFunc::kSigmoid;
        c.norm_topk_prob = true;
        c.routed_scaling_factor = 2.5;
        c.first_k_dense_replace = 1;
        c.num_nextn_predict_layers = 1;
        c.rope_scaling.mscale = 1.0;
        c.rope_scaling.mscale_all_dim = 1.0;
        c.fp8 = true;
        c.fp8_scale_ue8m0 = false;
    } else if (name == "small") {
        // DeepSeek-V2-Lite widths with 3 layers (1 dense + 2 MoE). V2-Lite has no
        // q_lora, but llama.cpp only accepts that for 26/27-layer models, so this
        // preset uses DeepSeek-V2's q_lora_rank 1536 to stay loadable by llama.cpp
        // for side-by-side benchmarks.
        c.architecture = "DeepseekV2ForCausalLM";
        c.family = ModelFamily::kDeepseekV2;
        c.hidden_size = 2048;
        c.intermediate_size = 10944;
        c.moe_intermediate_size = 1408;
        c.num_hidden_layers = 3;
        c.num_attention_heads = 16;
        c.q_lora_rank = 1536;
        c.kv_lora_rank = 512;
        c.qk_nope_head_dim = 128;
        c.qk_rope_head_dim = 64;
        c.v_head_dim = 128;
        c.n_routed_experts = 64;
        c.n_shared_experts = 2;
        c.num_experts_per_tok = 6;
        c.topk_method = TopkMethod::kGreedy;
        c.scoring_func = ScoringFunc::kSoftmax;
        c.norm_topk_prob = false;
        c.routed_scaling_factor = 1.0;
        c.first_k_dense_replace = 1;
        c.rope_scaling.mscale = 0.707;
        c.rope_scaling.mscale_all_dim = 0.707;
    } else {
        std::string names;
        for (const std::string& n : synthetic_preset_names()) names += (names.empty() ? "" : ", ") + n;
        return invalid_argument("unknown preset '" + std::string(name) + "' (presets: " + names + ")");
    }
    DSI_RETURN_IF_ERROR(c.validate());
    return c;
}

Fp8Matrix synthetic_fp8(const ModelConfig& c, const TensorSpec& spec, uint64_t seed) {
    DSI_CHECK(c.fp8 && spec.quantizable && spec.shape.size() == 2, spec.name);
    const int64_t rows = spec.shape[0];
    const int64_t cols = spec.shape[1];
    const int64_t br = c.fp8_block_rows;
    const int64_t bc = c.fp8_block_cols;
    const int64_t srows = (rows + br - 1) / br;
    const int64_t scols = (cols + bc - 1) / bc;
    std::vector<float> v = raw_values(c, spec, seed);
    Fp8Matrix m;
    m.codes.resize(v.size());
    m.scale_inv.resize(static_cast<size_t>(srows * scols));
    for (int64_t bi = 0; bi < srows; ++bi) {
        for (int64_t bj = 0; bj < scols; ++bj) {
            float amax = 1e-4f;
            for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
                for (int64_t q = bj * bc; q < std::min(cols, (bj + 1) * bc); ++q) {
                    amax = std::fmax(amax, std::fabs(v[r * cols + q]));
                }
            }
            float s = amax / 448.0f;
            // ue8m0: a power of two; otherwise a bf16 value, so codes * scale is exact in f32.
            s = c.fp8_scale_ue8m0 ? e8m0_to_f32(f32_to_e8m0_ceil(s))
                                  : bf16_to_f32(f32_to_bf16(s * 1.01f));
            m.scale_inv[bi * scols + bj] = s;
            for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
                for (int64_t q = bj * bc; q < std::min(cols, (bj + 1) * bc); ++q) {
                    m.codes[r * cols + q] = f32_to_e4m3(v[r * cols + q] / s);
                }
            }
        }
    }
    return m;
}

std::vector<float> synthetic_tensor(const ModelConfig& c, const TensorSpec& spec, uint64_t seed) {
    if (c.fp8 && spec.quantizable) {
        Fp8Matrix m = synthetic_fp8(c, spec, seed);
        const int64_t cols = spec.shape[1];
        const int64_t scols = (cols + c.fp8_block_cols - 1) / c.fp8_block_cols;
        std::vector<float> v(m.codes.size());
        for (size_t i = 0; i < v.size(); ++i) {
            const int64_t r = static_cast<int64_t>(i) / cols;
            const int64_t q = static_cast<int64_t>(i) % cols;
            v[i] = e4m3_to_f32(m.codes[i]) *
                   m.scale_inv[(r / c.fp8_block_rows) * scols + q / c.fp8_block_cols];
        }
        return v;
    }
    std::vector<float> v = raw_values(c, spec, seed);
    if (spec.name.find("e_score_correction_bias") == std::string::npos) {
        for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    }
    return v;
}

std::unique_ptr<MemoryWeightSource> synthetic_memory_model(const ModelConfig& c, uint64_t seed) {
    auto src = std::make_unique<MemoryWeightSource>(c);
    for (const TensorSpec& spec : deepseek_tensor_specs(c)) {
        src->add(spec.name, spec.shape, synthetic_tensor(c, spec, seed));
    }
    return src;
}

}  // namespace dsi
