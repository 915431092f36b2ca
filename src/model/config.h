// ModelConfig: the hyper-parameters of a DeepSeek-family model, read from a Hugging
// Face config.json (DeepseekV41ForCausalLM with text_config, DeepseekV4ForCausalLM,
// DeepseekV3ForCausalLM, DeepseekV2ForCausalLM)
// or from GGUF metadata, plus the quantities derived from them (YaRN frequencies,
// softmax scale). V4's hybrid attention (sliding window, compressed KV, indexer,
// hyper-connections, hash routing) has its own block of fields below; docs/models.md.
//
// The architecture registry is a table from `architectures[0]` to a family; new
// families (V4 hybrid attention) add a row. Thread model: plain value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/v41_config.h"

namespace dsi {

enum class ModelFamily : uint8_t { kDeepseekV2, kDeepseekV3, kDeepseekV4, kDeepseekV41 };

// kSqrtSoftplus: sqrt(softplus(logit)) (DeepSeek V4).
enum class ScoringFunc : uint8_t { kSoftmax, kSigmoid, kSqrtSoftplus };
enum class TopkMethod : uint8_t { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct RopeScaling {
    bool yarn = false;  // false: plain RoPE
    double factor = 1.0;
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    double mscale = 1.0;
    double mscale_all_dim = 0.0;
    int64_t original_max_position_embeddings = 4096;
};

struct ModelConfig {
    std::string architecture;  // architectures[0]
    ModelFamily family = ModelFamily::kDeepseekV3;

    int64_t vocab_size = 0;
    int64_t hidden_size = 0;
    int64_t intermediate_size = 0;      // dense MLP
    int64_t moe_intermediate_size = 0;  // per routed expert
    int64_t num_hidden_layers = 0;
    int64_t num_attention_heads = 0;
    int64_t q_lora_rank = 0;  // 0: a single q_proj (V2-Lite)
    int64_t kv_lora_rank = 0;
    int64_t qk_nope_head_dim = 0;
    int64_t qk_rope_head_dim = 0;
    int64_t v_head_dim = 0;

    int64_t n_routed_experts = 0;
    int64_t n_shared_experts = 0;
    int64_t num_experts_per_tok = 0;
    int64_t n_group = 1;
    int64_t topk_group = 1;
    TopkMethod topk_method = TopkMethod::kGreedy;
    ScoringFunc scoring_func = ScoringFunc::kSoftmax;
    bool norm_topk_prob = false;
    double routed_scaling_factor = 1.0;
    int64_t first_k_dense_replace = 0;
    int64_t moe_layer_freq = 1;
    int64_t num_nextn_predict_layers = 0;

    double rms_norm_eps = 1e-6;
    double rope_theta = 10000.0;
    RopeScaling rope_scaling;
    int64_t max_position_embeddings = 4096;
    int64_t bos_token_id = 0;
    int64_t eos_token_id = 1;
    bool tie_word_embeddings = false;

    // FP8 checkpoints (quantization_config): block size of weight_scale_inv and
    // whether the scales are powers of two (ue8m0).
    bool fp8 = false;
    int64_t fp8_block_rows = 128;
    int64_t fp8_block_cols = 128;
    bool fp8_scale_ue8m0 = false;

    // ---- DeepSeek V4 (family kDeepseekV4) only; reference deepseek_v4.md §1 ----
    // MQA with one shared KV head of head_dim values (K = V); the last
    // qk_rope_head_dim of them carry RoPE (qk_nope_head_dim = head_dim - rope).
    int64_t head_dim = 0;
    int64_t num_key_value_heads = 1;
    // Grouped low-rank output projection: heads split into o_groups groups, each
    // projected to o_lora_rank by its slice of wo_a, then wo_b maps back to hidden.
    int64_t o_groups = 0;
    int64_t o_lora_rank = 0;
    int64_t sliding_window = 0;
    // One entry per layer, then one per MTP layer: 0 (window only), 4 (compressed
    // with an indexer) or 128 (compressed, all entries attended).
    std::vector<int64_t> compress_ratios;
    double compress_rope_theta = 0.0;  // compressed layers' RoPE base (with YaRN)
    int64_t index_n_heads = 0;
    int64_t index_head_dim = 0;
    int64_t index_topk = 0;
    int64_t num_hash_layers = 0;  // first layers route by token id (ffn.gate.tid2eid)
    double swiglu_limit = 0.0;    // 0: no clamp
    int64_t hc_mult = 0;          // hyper-connection streams
    int64_t hc_sinkhorn_iters = 0;
    double hc_eps = 0.0;
    bool expert_fp4 = false;  // expert_dtype "fp4": routed experts e2m1 + ue8m0 per 32

    // ---- DeepSeek V4.1 (family kDeepseekV41) only: model/v41_config.h ----
    V41Fields v41;

    bool is_v4() const { return family == ModelFamily::kDeepseekV4; }
    bool is_v41() const { return family == ModelFamily::kDeepseekV41; }
    // V4's checkpoint conventions (names without "model.", "<x>.scale" F8_E8M0, FP4
    // experts as I8 pairs, V4 fields above): V4 and V4.1.
    bool v4_layout() const { return is_v4() || is_v41(); }
    // compress_ratios[layer] (layer may be an MTP layer's index). REQUIRES: v4_layout().
    int64_t compress_ratio(int64_t layer) const {
        return compress_ratios[static_cast<size_t>(layer)];
    }
    // RoPE inverse frequencies of a V4 layer: rope_theta without YaRN for
    // window-only layers, compress_rope_theta with YaRN for compressed ones.
    std::vector<double> v4_rope_inv_freq(int64_t layer) const;

    int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
    bool is_moe_layer(int64_t layer) const {
        return n_routed_experts > 0 && layer >= first_k_dense_replace &&
               layer % moe_layer_freq == 0;
    }
    // Attention softmax scale: qk_head_dim^-0.5, times mscale^2 with the YaRN
    // mscale_all_dim correction (as the HF DeepSeek V2/V3 attention defines it).
    double softmax_scale() const;
    // The multiplier on cos/sin: yarn_get_mscale(factor, mscale) /
    // yarn_get_mscale(factor, mscale_all_dim) (1.0 for V3 and V2-Lite).
    double rope_attention_factor() const;
    // Per-pair inverse frequencies (qk_rope_head_dim / 2 of them), YaRN-blended.
    std::vector<double> rope_inv_freq() const;
    // The same for an explicit base and with or without the YaRN blend.
    std::vector<double> rope_inv_freq(double theta, bool yarn) const;

    // Checks ranges and cross-field consistency; errors name the field.
    Status validate() const;

private:
    // The fields V4 and V4.1 share; then each family's own.
    Status validate_v4_shared() const;
    Status validate_v4() const;
    Status validate_v41() const;  // v41_config.cc
};

// Parses an HF config.json. Unknown architectures are INVALID_ARGUMENT naming the
// supported ones.
Result<ModelConfig> parse_hf_config(std::string_view json_text);
// Writes a config.json that parse_hf_config reads back to the same config.
std::string to_hf_config_json(const ModelConfig& config);

std::string_view topk_method_name(TopkMethod m);
std::string_view scoring_func_name(ScoringFunc f);

}  // namespace dsi
