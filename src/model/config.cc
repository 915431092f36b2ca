#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <utility>

#include "model/internal/config_json.h"

namespace dsi {
namespace {

using internal::field_error;
using internal::parse_v4_fields;
using internal::positive_field;
using internal::read_opt;
using internal::read_req;
using nlohmann::json;

// The architecture registry: architectures[0] -> family. A new family adds a row.
struct ArchitectureRow {
    std::string_view name;
    ModelFamily family;
};
constexpr ArchitectureRow kArchitectures[] = {
    {"DeepseekV3ForCausalLM", ModelFamily::kDeepseekV3},
    {"DeepseekV2ForCausalLM", ModelFamily::kDeepseekV2},
    {"DeepseekV4ForCausalLM", ModelFamily::kDeepseekV4},
    {"DeepseekV41ForCausalLM", ModelFamily::kDeepseekV41},
};

double yarn_get_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * std::log(scale) + 1.0;
}

// rope_scaling (YaRN or none) into c.rope_scaling.
Status read_rope_scaling(const json& j, ModelConfig& c) {
    if (!j.contains("rope_scaling") || !j["rope_scaling"].is_object()) return Status::ok();
    const json& rs = j["rope_scaling"];
    std::string type;
    if (rs.contains("type")) DSI_RETURN_IF_ERROR(read_opt(rs, "type", type));
    if (rs.contains("rope_type")) DSI_RETURN_IF_ERROR(read_opt(rs, "rope_type", type));
    if (type == "yarn") {
        c.rope_scaling.yarn = true;
        DSI_RETURN_IF_ERROR(read_opt(rs, "factor", c.rope_scaling.factor));
        DSI_RETURN_IF_ERROR(read_opt(rs, "beta_fast", c.rope_scaling.beta_fast));
        DSI_RETURN_IF_ERROR(read_opt(rs, "beta_slow", c.rope_scaling.beta_slow));
        DSI_RETURN_IF_ERROR(read_opt(rs, "mscale", c.rope_scaling.mscale));
        DSI_RETURN_IF_ERROR(read_opt(rs, "mscale_all_dim", c.rope_scaling.mscale_all_dim));
        DSI_RETURN_IF_ERROR(read_opt(rs, "original_max_position_embeddings",
                                     c.rope_scaling.original_max_position_embeddings));
    } else if (!type.empty() && type != "default") {
        return invalid_argument("config.json: unsupported rope_scaling type '" + type + "'");
    }
    return Status::ok();
}

// quantization_config (FP8 block scales) into c.
Status read_quantization(const json& j, ModelConfig& c) {
    if (!j.contains("quantization_config") || !j["quantization_config"].is_object()) {
        return Status::ok();
    }
    const json& q = j["quantization_config"];
    std::string method;
    DSI_RETURN_IF_ERROR(read_opt(q, "quant_method", method));
    if (method != "fp8") {
        return invalid_argument("config.json: unsupported quant_method '" + method + "'");
    }
    c.fp8 = true;
    std::vector<int64_t> block;
    DSI_RETURN_IF_ERROR(read_opt(q, "weight_block_size", block));
    if (!block.empty()) {
        if (block.size() != 2 || block[0] <= 0 || block[1] <= 0) {
            return invalid_argument("config.json: weight_block_size must be [rows, cols] > 0");
        }
        c.fp8_block_rows = block[0];
        c.fp8_block_cols = block[1];
    }
    std::string fmt;
    DSI_RETURN_IF_ERROR(read_opt(q, "scale_fmt", fmt));
    c.fp8_scale_ue8m0 = fmt == "ue8m0";
    return Status::ok();
}

// Fields every family reads the same way: norms, RoPE base, context, special tokens.
Status read_common_fields(const json& j, ModelConfig& c) {
    DSI_RETURN_IF_ERROR(read_opt(j, "rms_norm_eps", c.rms_norm_eps));
    DSI_RETURN_IF_ERROR(read_opt(j, "rope_theta", c.rope_theta));
    DSI_RETURN_IF_ERROR(read_opt(j, "max_position_embeddings", c.max_position_embeddings));
    DSI_RETURN_IF_ERROR(read_opt(j, "bos_token_id", c.bos_token_id));
    DSI_RETURN_IF_ERROR(read_opt(j, "eos_token_id", c.eos_token_id));
    DSI_RETURN_IF_ERROR(read_opt(j, "tie_word_embeddings", c.tie_word_embeddings));
    return Status::ok();
}

}  // namespace

// DeepseekV4ForCausalLM: every field of reference deepseek_v4.md §1.
Status internal::parse_v4_fields(const json& j, ModelConfig& c) {
    DSI_RETURN_IF_ERROR(read_req(j, "vocab_size", c.vocab_size));
    DSI_RETURN_IF_ERROR(read_req(j, "hidden_size", c.hidden_size));
    DSI_RETURN_IF_ERROR(read_req(j, "num_hidden_layers", c.num_hidden_layers));
    DSI_RETURN_IF_ERROR(read_opt(j, "num_nextn_predict_layers", c.num_nextn_predict_layers));
    DSI_RETURN_IF_ERROR(read_req(j, "num_attention_heads", c.num_attention_heads));
    DSI_RETURN_IF_ERROR(read_opt(j, "num_key_value_heads", c.num_key_value_heads));
    DSI_RETURN_IF_ERROR(read_req(j, "head_dim", c.head_dim));
    DSI_RETURN_IF_ERROR(read_req(j, "qk_rope_head_dim", c.qk_rope_head_dim));
    DSI_RETURN_IF_ERROR(read_req(j, "q_lora_rank", c.q_lora_rank));
    DSI_RETURN_IF_ERROR(read_req(j, "o_lora_rank", c.o_lora_rank));
    DSI_RETURN_IF_ERROR(read_req(j, "o_groups", c.o_groups));
    DSI_RETURN_IF_ERROR(read_req(j, "sliding_window", c.sliding_window));
    DSI_RETURN_IF_ERROR(read_req(j, "compress_ratios", c.compress_ratios));
    DSI_RETURN_IF_ERROR(read_opt(j, "compress_rope_theta", c.compress_rope_theta));
    DSI_RETURN_IF_ERROR(read_opt(j, "index_n_heads", c.index_n_heads));
    DSI_RETURN_IF_ERROR(read_opt(j, "index_head_dim", c.index_head_dim));
    DSI_RETURN_IF_ERROR(read_opt(j, "index_topk", c.index_topk));
    DSI_RETURN_IF_ERROR(read_req(j, "n_routed_experts", c.n_routed_experts));
    DSI_RETURN_IF_ERROR(read_opt(j, "n_shared_experts", c.n_shared_experts));
    DSI_RETURN_IF_ERROR(read_req(j, "num_experts_per_tok", c.num_experts_per_tok));
    DSI_RETURN_IF_ERROR(read_req(j, "moe_intermediate_size", c.moe_intermediate_size));
    DSI_RETURN_IF_ERROR(read_opt(j, "num_hash_layers", c.num_hash_layers));
    DSI_RETURN_IF_ERROR(read_opt(j, "first_k_dense_replace", c.first_k_dense_replace));
    std::string scoring = "sqrtsoftplus";
    DSI_RETURN_IF_ERROR(read_opt(j, "scoring_func", scoring));
    if (scoring != "sqrtsoftplus") {
        return invalid_argument("config.json: field 'scoring_func' is '" + scoring +
                                "', DeepseekV4ForCausalLM needs 'sqrtsoftplus'");
    }
    c.scoring_func = ScoringFunc::kSqrtSoftplus;
    std::string topk_method = "noaux_tc";
    DSI_RETURN_IF_ERROR(read_opt(j, "topk_method", topk_method));
    if (topk_method != "noaux_tc") {
        return invalid_argument("config.json: field 'topk_method' is '" + topk_method +
                                "', DeepseekV4ForCausalLM needs 'noaux_tc'");
    }
    c.topk_method = TopkMethod::kNoauxTc;
    DSI_RETURN_IF_ERROR(read_opt(j, "n_group", c.n_group));
    DSI_RETURN_IF_ERROR(read_opt(j, "topk_group", c.topk_group));
    DSI_RETURN_IF_ERROR(read_opt(j, "norm_topk_prob", c.norm_topk_prob));
    DSI_RETURN_IF_ERROR(read_opt(j, "routed_scaling_factor", c.routed_scaling_factor));
    DSI_RETURN_IF_ERROR(read_opt(j, "swiglu_limit", c.swiglu_limit));
    std::string act = "silu";
    DSI_RETURN_IF_ERROR(read_opt(j, "hidden_act", act));
    if (act != "silu") {
        return invalid_argument("config.json: field 'hidden_act' is '" + act +
                                "', expected 'silu'");
    }
    DSI_RETURN_IF_ERROR(read_req(j, "hc_mult", c.hc_mult));
    DSI_RETURN_IF_ERROR(read_req(j, "hc_sinkhorn_iters", c.hc_sinkhorn_iters));
    DSI_RETURN_IF_ERROR(read_req(j, "hc_eps", c.hc_eps));
    DSI_RETURN_IF_ERROR(read_common_fields(j, c));
    if (c.tie_word_embeddings) {
        return invalid_argument(
            "config.json: field 'tie_word_embeddings' must be false for V4 "
            "(embed and head are separate tensors)");
    }
    std::string expert_dtype;
    DSI_RETURN_IF_ERROR(read_opt(j, "expert_dtype", expert_dtype));
    if (expert_dtype == "fp4") {
        c.expert_fp4 = true;
    } else if (!expert_dtype.empty() && expert_dtype != "bf16" && expert_dtype != "fp8") {
        return invalid_argument("config.json: field 'expert_dtype' is '" + expert_dtype +
                                "' (supported: fp4, fp8, bf16)");
    }
    // The V4 reference applies no YaRN mscale (deepseek_v4.md §2.2).
    DSI_RETURN_IF_ERROR(read_rope_scaling(j, c));
    DSI_RETURN_IF_ERROR(read_quantization(j, c));
    // Derived: the nope part of the shared head, and V = K.
    c.qk_nope_head_dim = c.head_dim - c.qk_rope_head_dim;
    c.v_head_dim = c.head_dim;
    return Status::ok();
}

std::string_view topk_method_name(TopkMethod m) {
    switch (m) {
        case TopkMethod::kGreedy:
            return "greedy";
        case TopkMethod::kGroupLimitedGreedy:
            return "group_limited_greedy";
        case TopkMethod::kNoauxTc:
            return "noaux_tc";
    }
    return "?";
}

std::string_view scoring_func_name(ScoringFunc f) {
    switch (f) {
        case ScoringFunc::kSoftmax:
            return "softmax";
        case ScoringFunc::kSigmoid:
            return "sigmoid";
        case ScoringFunc::kSqrtSoftplus:
            return "sqrtsoftplus";
    }
    return "?";
}

double ModelConfig::softmax_scale() const {
    double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
    if (rope_scaling.yarn && rope_scaling.mscale_all_dim != 0.0) {
        double m = yarn_get_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
        scale *= m * m;
    }
    return scale;
}

double ModelConfig::rope_attention_factor() const {
    if (!rope_scaling.yarn) return 1.0;
    double num = yarn_get_mscale(rope_scaling.factor, rope_scaling.mscale);
    double den = rope_scaling.mscale_all_dim != 0.0
                     ? yarn_get_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim)
                     : 1.0;
    return num / den;
}

std::vector<double> ModelConfig::rope_inv_freq() const {
    return rope_inv_freq(rope_theta, rope_scaling.yarn);
}

std::vector<double> ModelConfig::v4_rope_inv_freq(int64_t layer) const {
    return compress_ratio(layer) > 0 ? rope_inv_freq(compress_rope_theta, rope_scaling.yarn)
                                     : rope_inv_freq(rope_theta, false);
}

std::vector<double> ModelConfig::rope_inv_freq(double theta, bool yarn) const {
    const int64_t dim = qk_rope_head_dim;
    const int64_t half = dim / 2;
    std::vector<double> inv(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
        inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(dim));
    }
    if (!yarn) return inv;
    const double max_pos = static_cast<double>(rope_scaling.original_max_position_embeddings);
    auto correction_dim = [&](double num_rotations) {
        return static_cast<double>(dim) * std::log(max_pos / (num_rotations * 2.0 * M_PI)) /
               (2.0 * std::log(theta));
    };
    double low = std::floor(correction_dim(rope_scaling.beta_fast));
    double high = std::ceil(correction_dim(rope_scaling.beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
        double ramp = (static_cast<double>(i) - low) / (high - low);
        ramp = std::clamp(ramp, 0.0, 1.0);
        double extrapolation = 1.0 - ramp;  // 1: keep the original frequency
        double interp = inv[i] / rope_scaling.factor;
        inv[i] = interp * (1.0 - extrapolation) + inv[i] * extrapolation;
    }
    return inv;
}

Status internal::positive_field(const char* name, int64_t v) {
    if (v <= 0) {
        return invalid_argument(std::string("config: field '") + name + "' must be > 0, got " +
                                std::to_string(v));
    }
    return Status::ok();
}

Status internal::field_error(const char* name, const std::string& why) {
    return invalid_argument(std::string("config: field '") + name + "' " + why);
}

// The fields V4 and V4.1 share (reference deepseek_v4.md §1, §7.1) and their cross-checks.
Status ModelConfig::validate_v4_shared() const {
    for (auto [name, v] : {std::pair<const char*, int64_t>{"vocab_size", vocab_size},
                           {"hidden_size", hidden_size},
                           {"num_hidden_layers", num_hidden_layers},
                           {"num_attention_heads", num_attention_heads},
                           {"head_dim", head_dim},
                           {"qk_rope_head_dim", qk_rope_head_dim},
                           {"q_lora_rank", q_lora_rank},
                           {"o_groups", o_groups},
                           {"o_lora_rank", o_lora_rank},
                           {"sliding_window", sliding_window},
                           {"n_routed_experts", n_routed_experts},
                           {"num_experts_per_tok", num_experts_per_tok},
                           {"moe_intermediate_size", moe_intermediate_size},
                           {"hc_mult", hc_mult},
                           {"hc_sinkhorn_iters", hc_sinkhorn_iters}}) {
        DSI_RETURN_IF_ERROR(positive_field(name, v));
    }
    if (num_key_value_heads != 1) {
        return field_error("num_key_value_heads",
                           "must be 1 (V4 attention is MQA with one "
                           "shared KV head), got " +
                               std::to_string(num_key_value_heads));
    }
    if (qk_rope_head_dim % 2 != 0 || qk_rope_head_dim > head_dim) {
        return field_error("qk_rope_head_dim", "must be even and <= head_dim");
    }
    if (num_attention_heads % o_groups != 0) {
        return field_error("o_groups", "must divide num_attention_heads (" +
                                           std::to_string(num_attention_heads) + ")");
    }
    if (num_experts_per_tok > n_routed_experts) {
        return field_error("num_experts_per_tok", "exceeds n_routed_experts");
    }
    if (n_shared_experts < 0) return field_error("n_shared_experts", "must be >= 0");
    if (scoring_func != ScoringFunc::kSqrtSoftplus) {
        return field_error("scoring_func", "must be 'sqrtsoftplus' for " + architecture);
    }
    if (topk_method != TopkMethod::kNoauxTc || n_group != 1) {
        return field_error("topk_method", "must be 'noaux_tc' without groups for V4");
    }
    if (first_k_dense_replace != 0) {
        return field_error("first_k_dense_replace", "must be absent or 0 (every V4 layer is MoE)");
    }
    if (!(swiglu_limit >= 0)) return field_error("swiglu_limit", "must be >= 0");
    if (!(hc_eps > 0)) return field_error("hc_eps", "must be > 0");
    if (!(rms_norm_eps > 0)) return field_error("rms_norm_eps", "must be > 0");
    if (!(rope_theta > 1)) return field_error("rope_theta", "must be > 1");
    if (rope_scaling.yarn && !(rope_scaling.factor >= 1.0)) {
        return field_error("rope_scaling.factor", "must be >= 1");
    }
    if (fp8 && o_lora_rank % fp8_block_rows != 0) {
        return field_error("o_lora_rank", "must be a multiple of the FP8 block rows (" +
                                              std::to_string(fp8_block_rows) +
                                              ") so each group's slice of wo_a has its own scales");
    }
    if (expert_fp4 && (hidden_size % 32 != 0 || moe_intermediate_size % 32 != 0)) {
        return field_error("expert_dtype",
                           "fp4 needs hidden_size and moe_intermediate_size "
                           "multiples of 32");
    }
    if (bos_token_id < 0 || bos_token_id >= vocab_size || eos_token_id < 0 ||
        eos_token_id >= vocab_size) {
        return field_error("bos_token_id", "or eos_token_id is outside the vocabulary");
    }
    return Status::ok();
}

// V4: the shared fields, then compress_ratios (0, 4, 128), the indexer, hash layers.
Status ModelConfig::validate_v4() const {
    DSI_RETURN_IF_ERROR(validate_v4_shared());
    if (num_nextn_predict_layers < 0 || num_nextn_predict_layers > 1) {
        return field_error("num_nextn_predict_layers", "must be 0 or 1");
    }
    const int64_t want = num_hidden_layers + num_nextn_predict_layers;
    if (static_cast<int64_t>(compress_ratios.size()) != want) {
        return field_error("compress_ratios", "has " + std::to_string(compress_ratios.size()) +
                                                  " entries, expected num_hidden_layers + "
                                                  "num_nextn_predict_layers = " +
                                                  std::to_string(want));
    }
    bool any_ratio4 = false, any_compressed = false;
    for (size_t i = 0; i < compress_ratios.size(); ++i) {
        const int64_t r = compress_ratios[i];
        if (r != 0 && r != 4 && r != 128) {
            return field_error("compress_ratios", "entry " + std::to_string(i) + " is " +
                                                      std::to_string(r) +
                                                      " (supported: 0, 4, 128)");
        }
        if (r != 0 && static_cast<int64_t>(i) >= num_hidden_layers) {
            return field_error("compress_ratios",
                               "MTP layer entry " + std::to_string(i) + " must be 0 (window only)");
        }
        any_ratio4 |= r == 4;
        any_compressed |= r != 0;
    }
    if (any_compressed && !(compress_rope_theta > 1)) {
        return field_error("compress_rope_theta", "must be > 1 when layers are compressed");
    }
    if (any_ratio4) {
        DSI_RETURN_IF_ERROR(positive_field("index_n_heads", index_n_heads));
        DSI_RETURN_IF_ERROR(positive_field("index_head_dim", index_head_dim));
        DSI_RETURN_IF_ERROR(positive_field("index_topk", index_topk));
        if (index_head_dim < qk_rope_head_dim) {
            return field_error("index_head_dim", "must be >= qk_rope_head_dim");
        }
    }
    if (num_hash_layers < 0 || num_hash_layers > num_hidden_layers) {
        return field_error("num_hash_layers", "must be in [0, num_hidden_layers]");
    }
    return Status::ok();
}

Status ModelConfig::validate() const {
    if (is_v4()) return validate_v4();
    if (is_v41()) return validate_v41();
    auto positive = [](const char* name, int64_t v) -> Status {
        if (v <= 0)
            return invalid_argument(std::string("config: ") + name + " must be > 0, got " +
                                    std::to_string(v));
        return Status::ok();
    };
    DSI_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
    DSI_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
    DSI_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
    DSI_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
    DSI_RETURN_IF_ERROR(positive("kv_lora_rank", kv_lora_rank));
    DSI_RETURN_IF_ERROR(positive("qk_nope_head_dim", qk_nope_head_dim));
    DSI_RETURN_IF_ERROR(positive("qk_rope_head_dim", qk_rope_head_dim));
    DSI_RETURN_IF_ERROR(positive("v_head_dim", v_head_dim));
    if (qk_rope_head_dim % 2 != 0) return invalid_argument("config: qk_rope_head_dim must be even");
    if (q_lora_rank < 0) return invalid_argument("config: q_lora_rank must be >= 0");
    if (first_k_dense_replace < num_hidden_layers) {
        DSI_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
    }
    if (first_k_dense_replace > 0)
        DSI_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
    if (n_routed_experts > 0) {
        DSI_RETURN_IF_ERROR(positive("moe_intermediate_size", moe_intermediate_size));
        DSI_RETURN_IF_ERROR(positive("num_experts_per_tok", num_experts_per_tok));
        DSI_RETURN_IF_ERROR(positive("moe_layer_freq", moe_layer_freq));
        if (num_experts_per_tok > n_routed_experts) {
            return invalid_argument("config: num_experts_per_tok > n_routed_experts");
        }
        if (n_group <= 0 || n_routed_experts % n_group != 0) {
            return invalid_argument("config: n_routed_experts must be a multiple of n_group");
        }
        if (topk_group <= 0 || topk_group > n_group) {
            return invalid_argument("config: topk_group must be in [1, n_group]");
        }
        if (topk_method != TopkMethod::kGreedy &&
            num_experts_per_tok > topk_group * (n_routed_experts / n_group)) {
            return invalid_argument(
                "config: num_experts_per_tok exceeds experts in topk_group groups");
        }
    }
    if (num_nextn_predict_layers < 0 || num_nextn_predict_layers > 1) {
        return invalid_argument("config: num_nextn_predict_layers must be 0 or 1");
    }
    if (!(rms_norm_eps > 0)) return invalid_argument("config: rms_norm_eps must be > 0");
    if (!(rope_theta > 1)) return invalid_argument("config: rope_theta must be > 1");
    if (rope_scaling.yarn && !(rope_scaling.factor >= 1.0)) {
        return invalid_argument("config: rope_scaling.factor must be >= 1");
    }
    if (bos_token_id < 0 || bos_token_id >= vocab_size || eos_token_id < 0 ||
        eos_token_id >= vocab_size) {
        return invalid_argument("config: bos/eos token ids out of vocabulary");
    }
    return Status::ok();
}

Result<ModelConfig> parse_hf_config(std::string_view json_text) {
    json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument("config.json: not valid JSON");
    if (!j.is_object()) return invalid_argument("config.json: top level must be an object");
    ModelConfig c;
    std::vector<std::string> archs;
    DSI_RETURN_IF_ERROR(read_req(j, "architectures", archs));
    if (archs.empty()) return invalid_argument("config.json: 'architectures' is empty");
    c.architecture = archs[0];
    bool known = false;
    for (const ArchitectureRow& row : kArchitectures) {
        if (row.name == c.architecture) {
            c.family = row.family;
            known = true;
        }
    }
    if (!known) {
        std::string supported;
        for (const ArchitectureRow& row : kArchitectures) {
            supported += supported.empty() ? "" : ", ";
            supported += row.name;
        }
        return invalid_argument("config.json: unsupported architecture '" + c.architecture +
                                "' (supported: " + supported + ")");
    }
    if (c.is_v4()) {
        DSI_RETURN_IF_ERROR(parse_v4_fields(j, c));
        DSI_RETURN_IF_ERROR(c.validate());
        return c;
    }
    if (c.is_v41()) {
        DSI_RETURN_IF_ERROR(internal::parse_v41_fields(j, c));
        DSI_RETURN_IF_ERROR(c.validate());
        return c;
    }
    DSI_RETURN_IF_ERROR(read_req(j, "vocab_size", c.vocab_size));
    DSI_RETURN_IF_ERROR(read_req(j, "hidden_size", c.hidden_size));
    DSI_RETURN_IF_ERROR(read_opt(j, "intermediate_size", c.intermediate_size));
    DSI_RETURN_IF_ERROR(read_opt(j, "moe_intermediate_size", c.moe_intermediate_size));
    DSI_RETURN_IF_ERROR(read_req(j, "num_hidden_layers", c.num_hidden_layers));
    DSI_RETURN_IF_ERROR(read_req(j, "num_attention_heads", c.num_attention_heads));
    DSI_RETURN_IF_ERROR(read_opt(j, "q_lora_rank", c.q_lora_rank));
    DSI_RETURN_IF_ERROR(read_req(j, "kv_lora_rank", c.kv_lora_rank));
    DSI_RETURN_IF_ERROR(read_req(j, "qk_nope_head_dim", c.qk_nope_head_dim));
    DSI_RETURN_IF_ERROR(read_req(j, "qk_rope_head_dim", c.qk_rope_head_dim));
    DSI_RETURN_IF_ERROR(read_req(j, "v_head_dim", c.v_head_dim));
    DSI_RETURN_IF_ERROR(read_opt(j, "n_routed_experts", c.n_routed_experts));
    DSI_RETURN_IF_ERROR(read_opt(j, "n_shared_experts", c.n_shared_experts));
    DSI_RETURN_IF_ERROR(read_opt(j, "num_experts_per_tok", c.num_experts_per_tok));
    DSI_RETURN_IF_ERROR(read_opt(j, "n_group", c.n_group));
    DSI_RETURN_IF_ERROR(read_opt(j, "topk_group", c.topk_group));
    std::string topk_method = c.family == ModelFamily::kDeepseekV3 ? "noaux_tc" : "greedy";
    DSI_RETURN_IF_ERROR(read_opt(j, "topk_method", topk_method));
    if (topk_method == "greedy") {
        c.topk_method = TopkMethod::kGreedy;
    } else if (topk_method == "group_limited_greedy") {
        c.topk_method = TopkMethod::kGroupLimitedGreedy;
    } else if (topk_method == "noaux_tc") {
        c.topk_method = TopkMethod::kNoauxTc;
    } else {
        return invalid_argument("config.json: unknown topk_method '" + topk_method + "'");
    }
    std::string scoring = c.family == ModelFamily::kDeepseekV3 ? "sigmoid" : "softmax";
    DSI_RETURN_IF_ERROR(read_opt(j, "scoring_func", scoring));
    if (scoring == "softmax") {
        c.scoring_func = ScoringFunc::kSoftmax;
    } else if (scoring == "sigmoid") {
        c.scoring_func = ScoringFunc::kSigmoid;
    } else {
        return invalid_argument("config.json: unknown scoring_func '" + scoring + "'");
    }
    DSI_RETURN_IF_ERROR(read_opt(j, "norm_topk_prob", c.norm_topk_prob));
    DSI_RETURN_IF_ERROR(read_opt(j, "routed_scaling_factor", c.routed_scaling_factor));
    DSI_RETURN_IF_ERROR(read_opt(j, "first_k_dense_replace", c.first_k_dense_replace));
    DSI_RETURN_IF_ERROR(read_opt(j, "moe_layer_freq", c.moe_layer_freq));
    DSI_RETURN_IF_ERROR(read_opt(j, "num_nextn_predict_layers", c.num_nextn_predict_layers));
    DSI_RETURN_IF_ERROR(read_common_fields(j, c));
    DSI_RETURN_IF_ERROR(read_rope_scaling(j, c));
    DSI_RETURN_IF_ERROR(read_quantization(j, c));
    DSI_RETURN_IF_ERROR(c.validate());
    return c;
}

namespace {

json yarn_json(const ModelConfig& c) {
    if (!c.rope_scaling.yarn) return nullptr;
    json y = {
        {"type", "yarn"},
        {"factor", c.rope_scaling.factor},
        {"beta_fast", c.rope_scaling.beta_fast},
        {"beta_slow", c.rope_scaling.beta_slow},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
    };
    if (!c.v4_layout()) {
        y["mscale"] = c.rope_scaling.mscale;
        y["mscale_all_dim"] = c.rope_scaling.mscale_all_dim;
    }
    return y;
}

json quantization_json(const ModelConfig& c) {
    json q = {{"activation_scheme", "dynamic"},
              {"fmt", "e4m3"},
              {"quant_method", "fp8"},
              {"weight_block_size", {c.fp8_block_rows, c.fp8_block_cols}}};
    if (c.fp8_scale_ue8m0) q["scale_fmt"] = "ue8m0";
    return q;
}

}  // namespace

// The official DeepSeek-V4-Flash config.json layout (reference deepseek_v4.md §1).
json internal::v4_config_json(const ModelConfig& c) {
    json j;
    j["architectures"] = {c.architecture};
    j["model_type"] = "deepseek_v4";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_key_value_heads"] = c.num_key_value_heads;
    j["head_dim"] = c.head_dim;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["q_lora_rank"] = c.q_lora_rank;
    j["o_lora_rank"] = c.o_lora_rank;
    j["o_groups"] = c.o_groups;
    j["sliding_window"] = c.sliding_window;
    j["compress_ratios"] = c.compress_ratios;
    j["compress_rope_theta"] = c.compress_rope_theta;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = yarn_json(c);
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["index_n_heads"] = c.index_n_heads;
    j["index_head_dim"] = c.index_head_dim;
    j["index_topk"] = c.index_topk;
    j["n_routed_experts"] = c.n_routed_experts;
    j["n_shared_experts"] = c.n_shared_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["num_hash_layers"] = c.num_hash_layers;
    j["scoring_func"] = "sqrtsoftplus";
    j["topk_method"] = "noaux_tc";
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
    j["swiglu_limit"] = c.swiglu_limit;
    j["hidden_act"] = "silu";
    j["hc_mult"] = c.hc_mult;
    j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
    j["hc_eps"] = c.hc_eps;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["expert_dtype"] = c.expert_fp4 ? "fp4" : "fp8";
    j["torch_dtype"] = "bfloat16";
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
    j["tie_word_embeddings"] = false;
    if (c.fp8) j["quantization_config"] = quantization_json(c);
    return j;
}

std::string to_hf_config_json(const ModelConfig& c) {
    if (c.is_v4()) return internal::v4_config_json(c).dump(2) + "\n";
    if (c.is_v41()) return internal::to_v41_config_json(c);
    json j;
    j["architectures"] = {c.architecture};
    j["model_type"] = c.family == ModelFamily::kDeepseekV3 ? "deepseek_v3" : "deepseek_v2";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.intermediate_size;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_key_value_heads"] = c.num_attention_heads;
    if (c.q_lora_rank > 0) {
        j["q_lora_rank"] = c.q_lora_rank;
    } else {
        j["q_lora_rank"] = nullptr;
    }
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
    j["n_routed_experts"] = c.n_routed_experts;
    j["n_shared_experts"] = c.n_shared_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
    j["topk_method"] = std::string(topk_method_name(c.topk_method));
    j["scoring_func"] = std::string(scoring_func_name(c.scoring_func));
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
    j["first_k_dense_replace"] = c.first_k_dense_replace;
    j["moe_layer_freq"] = c.moe_layer_freq;
    j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["hidden_act"] = "silu";
    j["attention_bias"] = false;
    j["torch_dtype"] = "bfloat16";
    j["rope_scaling"] = yarn_json(c);
    if (c.fp8) j["quantization_config"] = quantization_json(c);
    return j.dump(2) + "\n";
}

}  // namespace dsi
