#include "model/gguf_names.h"

#include <cmath>

namespace dsi {
namespace {

constexpr const char* kArch = "deepseek2";

std::string key(const char* suffix) { return std::string(kArch) + "." + suffix; }

// "model.layers.<i>.<rest>" -> (i, rest); nullopt otherwise.
std::optional<std::pair<int64_t, std::string>> split_layer(const std::string& name) {
    static const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) != 0) return std::nullopt;
    size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) return std::nullopt;
    const std::string num = name.substr(prefix.size(), dot - prefix.size());
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    return std::make_pair(std::stoll(num), name.substr(dot + 1));
}

}  // namespace

std::optional<GgufTensorRef> gguf_tensor_for_hf_name(const ModelConfig& c,
                                                     const std::string& name) {
    if (name == "model.embed_tokens.weight") return GgufTensorRef{"token_embd.weight"};
    if (name == "model.norm.weight") return GgufTensorRef{"output_norm.weight"};
    if (name == "lm_head.weight") return GgufTensorRef{"output.weight"};
    auto layer = split_layer(name);
    if (!layer) return std::nullopt;
    const auto& [i, rest] = *layer;
    const std::string blk = "blk." + std::to_string(i) + ".";
    struct Row {
        const char* hf;
        const char* gguf;
    };
    static const Row kRows[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
        {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
        {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
        {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
        {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
        {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"mlp.gate.weight", "ffn_gate_inp.weight"},
        {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
        {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
        {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
        {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
        // MTP (nextn) layer.
        {"embed_tokens.weight", "nextn.embed_tokens.weight"},
        {"enorm.weight", "nextn.enorm.weight"},
        {"hnorm.weight", "nextn.hnorm.weight"},
        {"eh_proj.weight", "nextn.eh_proj.weight"},
        {"shared_head.norm.weight", "nextn.shared_head_norm.weight"},
        {"shared_head.head.weight", "nextn.shared_head_head.weight"},
    };
    for (const Row& r : kRows) {
        if (rest == r.hf) return GgufTensorRef{blk + r.gguf};
    }
    // "mlp.experts.<e>.<gate|up|down>_proj.weight" -> slice e of ffn_<kind>_exps.
    static const std::string kExperts = "mlp.experts.";
    if (rest.rfind(kExperts, 0) != 0) return std::nullopt;
    const size_t dot = rest.find('.', kExperts.size());
    if (dot == std::string::npos || dot == kExperts.size()) return std::nullopt;
    const std::string num = rest.substr(kExperts.size(), dot - kExperts.size());
    if (num.size() > 9 || num.find_first_not_of("0123456789") != std::string::npos) {
        return std::nullopt;
    }
    const int64_t e = std::stoll(num);
    if (e >= c.n_routed_experts) return std::nullopt;
    for (const char* kind : {"gate", "up", "down"}) {
        if (rest.substr(dot + 1) == std::string(kind) + "_proj.weight") {
            return GgufTensorRef{blk + "ffn_" + kind + "_exps.weight", e};
        }
    }
    return std::nullopt;
}

Result<ModelConfig> config_from_gguf(const GgufFile& f) {
    DSI_ASSIGN_OR_RETURN(std::string arch, f.get_string("general.architecture"));
    if (arch != kArch) {
        return invalid_argument("general.architecture is '" + arch + "', expected 'deepseek2'");
    }
    ModelConfig c;
    DSI_ASSIGN_OR_RETURN(int64_t num_layers, f.get_i64(key("block_count")));
    DSI_ASSIGN_OR_RETURN(c.hidden_size, f.get_i64(key("embedding_length")));
    DSI_ASSIGN_OR_RETURN(c.intermediate_size, f.get_i64(key("feed_forward_length")));
    DSI_ASSIGN_OR_RETURN(c.num_attention_heads, f.get_i64(key("attention.head_count")));
    DSI_ASSIGN_OR_RETURN(c.kv_lora_rank, f.get_i64(key("attention.kv_lora_rank")));
    if (f.find_kv(key("attention.q_lora_rank"))) {
        DSI_ASSIGN_OR_RETURN(c.q_lora_rank, f.get_i64(key("attention.q_lora_rank")));
    }
    DSI_ASSIGN_OR_RETURN(c.qk_rope_head_dim, f.get_i64(key("rope.dimension_count")));
    // MLA files (key_length_mla present) keep the per-head sizes there.
    int64_t key_length = 0, value_length = 0;
    if (f.find_kv(key("attention.key_length_mla"))) {
        DSI_ASSIGN_OR_RETURN(key_length, f.get_i64(key("attention.key_length_mla")));
        DSI_ASSIGN_OR_RETURN(value_length, f.get_i64(key("attention.value_length_mla")));
    } else {
        DSI_ASSIGN_OR_RETURN(key_length, f.get_i64(key("attention.key_length")));
        DSI_ASSIGN_OR_RETURN(value_length, f.get_i64(key("attention.value_length")));
    }
    c.qk_nope_head_dim = key_length - c.qk_rope_head_dim;
    c.v_head_dim = value_length;
    DSI_ASSIGN_OR_RETURN(double eps, f.get_f64(key("attention.layer_norm_rms_epsilon")));
    c.rms_norm_eps = eps;
    DSI_ASSIGN_OR_RETURN(double theta, f.get_f64(key("rope.freq_base")));
    c.rope_theta = theta;
    if (f.find_kv(key("context_length"))) {
        DSI_ASSIGN_OR_RETURN(c.max_position_embeddings, f.get_i64(key("context_length")));
    }
    DSI_ASSIGN_OR_RETURN(c.first_k_dense_replace, f.get_i64(key("leading_dense_block_count")));
    if (f.find_kv(key("expert_count"))) {
        DSI_ASSIGN_OR_RETURN(c.n_routed_experts, f.get_i64(key("expert_count")));
        DSI_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.get_i64(key("expert_used_count")));
        DSI_ASSIGN_OR_RETURN(c.n_shared_experts, f.get_i64(key("expert_shared_count")));
        DSI_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.get_i64(key("expert_feed_forward_length")));
        DSI_ASSIGN_OR_RETURN(double scale, f.get_f64(key("expert_weights_scale")));
        c.routed_scaling_factor = scale;
        if (f.find_kv(key("expert_weights_norm"))) {
            DSI_ASSIGN_OR_RETURN(c.norm_topk_prob, f.get_bool(key("expert_weights_norm")));
        }
        uint32_t gating = 1;  // llama.cpp: 1 softmax, 2 sigmoid; absent means softmax
        if (f.find_kv(key("expert_gating_func"))) {
            DSI_ASSIGN_OR_RETURN(gating, f.get_u32(key("expert_gating_func")));
        }
        if (gating != 1 && gating != 2) {
            return invalid_argument(key("expert_gating_func") + " = " + std::to_string(gating) +
                                    " (expected 1 softmax or 2 sigmoid)");
        }
        c.scoring_func = gating == 2 ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
        if (f.find_kv(key("expert_group_count"))) {
            DSI_ASSIGN_OR_RETURN(c.n_group, f.get_i64(key("expert_group_count")));
            DSI_ASSIGN_OR_RETURN(c.topk_group, f.get_i64(key("expert_group_used_count")));
        }
    }
    if (f.find_kv(key("nextn_predict_layers"))) {
        DSI_ASSIGN_OR_RETURN(c.num_nextn_predict_layers, f.get_i64(key("nextn_predict_layers")));
    }
    // block_count includes the MTP layers (as llama.cpp's converter writes it).
    c.num_hidden_layers = num_layers - c.num_nextn_predict_layers;
    // The bias tensor decides noaux_tc; sigmoid scoring means the V3 family.
    const bool has_bias = f.find_tensor("blk." + std::to_string(c.first_k_dense_replace) +
                                        ".exp_probs_b.bias") != nullptr;
    if (c.scoring_func == ScoringFunc::kSigmoid || has_bias) {
        c.architecture = "DeepseekV3ForCausalLM";
        c.family = ModelFamily::kDeepseekV3;
        c.topk_method = has_bias ? TopkMethod::kNoauxTc : TopkMethod::kGreedy;
    } else {
        c.architecture = "DeepseekV2ForCausalLM";
        c.family = ModelFamily::kDeepseekV2;
        c.topk_method = c.n_group > 1 ? TopkMethod::kGroupLimitedGreedy : TopkMethod::kGreedy;
    }
    if (f.find_kv(key("rope.scaling.type"))) {
        DSI_ASSIGN_OR_RETURN(std::string type, f.get_string(key("rope.scaling.type")));
        if (type == "yarn") {
            c.rope_scaling.yarn = true;
            DSI_ASSIGN_OR_RETURN(c.rope_scaling.factor, f.get_f64(key("rope.scaling.factor")));
            DSI_ASSIGN_OR_RETURN(c.rope_scaling.original_max_position_embeddings,
                                 f.get_i64(key("rope.scaling.original_context_length")));
            double log_mul = 0.0;
            if (f.find_kv(key("rope.scaling.yarn_log_multiplier"))) {
                DSI_ASSIGN_OR_RETURN(log_mul, f.get_f64(key("rope.scaling.yarn_log_multiplier")));
            }
            // llama.cpp stores 0.1 * mscale_all_dim; DeepSeek configs have mscale ==
            // mscale_all_dim, which makes the cos/sin factor 1.
            c.rope_scaling.mscale_all_dim = log_mul / 0.1;
            c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim;
            if (f.find_kv(key("rope.scaling.yarn_beta_fast"))) {
                DSI_ASSIGN_OR_RETURN(c.rope_scaling.beta_fast, f.get_f64(key("rope.scaling.yarn_beta_fast")));
            }
            if (f.find_kv(key("rope.scaling.yarn_beta_slow"))) {
                DSI_ASSIGN_OR_RETURN(c.rope_scaling.beta_slow, f.get_f64(key("rope.scaling.yarn_beta_slow")));
            }
        } else if (type != "none") {
            return invalid_argument(key("rope.scaling.type") + " '" + type + "' is not supported");
        }
    }
    const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
    if (embd == nullptr || embd->shape.size() != 2) {
        return invalid_argument("missing or malformed tensor 'token_embd.weight'");
    }
    c.vocab_size = embd->shape[0];
    if (f.find_kv("tokenizer.ggml.bos_token_id")) {
        DSI_ASSIGN_OR_RETURN(c.bos_token_id, f.get_i64("tokenizer.ggml.bos_token_id"));
    }
    if (f.find_kv("tokenizer.ggml.eos_token_id")) {
        DSI_ASSIGN_OR_RETURN(c.eos_token_id, f.get_i64("tokenizer.ggml.eos_token_id"));
    }
    c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
    DSI_RETURN_IF_ERROR(c.validate());
    return c;
}

std::vector<std::pair<std::string, GgufValue>> gguf_metadata_for_config(const ModelConfig& c,
                                                                        const std::string& name) {
    std::vector<std::pair<std::string, GgufValue>> kv;
    auto u32 = [&](const char* k, int64_t v) { kv.emplace_back(key(k), static_cast<uint32_t>(v)); };
    auto f32 = [&](const char* k, double v) { kv.emplace_back(key(k), static_cast<float>(v)); };
    kv.emplace_back("general.architecture", std::string(kArch));
    kv.emplace_back("general.name", name);
    u32("block_count", c.num_hidden_layers + c.num_nextn_predict_layers);
    u32("context_length", c.max_position_embeddings);
    u32("embedding_length", c.hidden_size);
    u32("feed_forward_length", c.intermediate_size);
    u32("attention.head_count", c.num_attention_heads);
    u32("attention.head_count_kv", 1);
    f32("rope.freq_base", c.rope_theta);
    f32("attention.layer_norm_rms_epsilon", c.rms_norm_eps);
    u32("expert_used_count", c.num_experts_per_tok);
    u32("leading_dense_block_count", c.first_k_dense_replace);
    u32("vocab_size", c.vocab_size);
    if (c.q_lora_rank > 0) u32("attention.q_lora_rank", c.q_lora_rank);
    u32("attention.kv_lora_rank", c.kv_lora_rank);
    // MLA layout: the cache holds kv_lora + rope per token; per-head sizes in *_mla.
    u32("attention.key_length", c.kv_lora_rank + c.qk_rope_head_dim);
    u32("attention.value_length", c.kv_lora_rank);
    u32("attention.key_length_mla", c.qk_head_dim());
    u32("attention.value_length_mla", c.v_head_dim);
    u32("expert_feed_forward_length", c.moe_intermediate_size);
    u32("expert_count", c.n_routed_experts);
    u32("expert_shared_count", c.n_shared_experts);
    f32("expert_weights_scale", c.routed_scaling_factor);
    kv.emplace_back(key("expert_weights_norm"), c.norm_topk_prob);
    u32("expert_gating_func", c.scoring_func == ScoringFunc::kSigmoid ? 2 : 1);
    if (c.n_group > 1) {
        u32("expert_group_count", c.n_group);
        u32("expert_group_used_count", c.topk_group);
    }
    u32("rope.dimension_count", c.qk_rope_head_dim);
    if (c.rope_scaling.yarn) {
        kv.emplace_back(key("rope.scaling.type"), std::string("yarn"));
        f32("rope.scaling.factor", c.rope_scaling.factor);
        u32("rope.scaling.original_context_length", c.rope_scaling.original_max_position_embeddings);
        f32("rope.scaling.yarn_log_multiplier", 0.1 * c.rope_scaling.mscale_all_dim);
    }
    if (c.num_nextn_predict_layers > 0) u32("nextn_predict_layers", c.num_nextn_predict_layers);
    return kv;
}

}  // namespace dsi
