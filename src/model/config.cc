#include "model/config.h"

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

namespace dsi {
namespace {

using nlohmann::json;

// The architecture registry: architectures[0] -> family. A new family adds a row.
struct ArchitectureRow {
    std::string_view name;
    ModelFamily family;
};
constexpr ArchitectureRow kArchitectures[] = {
    {"DeepseekV3ForCausalLM", ModelFamily::kDeepseekV3},
    {"DeepseekV2ForCausalLM", ModelFamily::kDeepseekV2},
};

double yarn_get_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * std::log(scale) + 1.0;
}

// Reads `key` into `out` if present; a present key of the wrong type is an error.
template <typename T>
Status read_opt(const json& j, const char* key, T& out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::ok();
    try {
        out = it->get<T>();
    } catch (const json::exception& e) {
        return invalid_argument(std::string("config.json: field '") + key + "' has the wrong type: " +
                                e.what());
    }
    return Status::ok();
}

template <typename T>
Status read_req(const json& j, const char* key, T& out) {
    if (!j.contains(key) || j[key].is_null()) {
        return invalid_argument(std::string("config.json: missing required field '") + key + "'");
    }
    return read_opt(j, key, out);
}

}  // namespace

std::string_view topk_method_name(TopkMethod m) {
    switch (m) {
        case TopkMethod::kGreedy: return "greedy";
        case TopkMethod::kGroupLimitedGreedy: return "group_limited_greedy";
        case TopkMethod::kNoauxTc: return "noaux_tc";
    }
    return "?";
}

std::string_view scoring_func_name(ScoringFunc f) {
    return f == ScoringFunc::kSoftmax ? "softmax" : "sigmoid";
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
    const int64_t dim = qk_rope_head_dim;
    const int64_t half = dim / 2;
    std::vector<double> inv(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
        inv[i] = 1.0 / std::pow(rope_theta, static_cast<double>(2 * i) / static_cast<double>(dim));
    }
    if (!rope_scaling.yarn) return inv;
    const double max_pos = static_cast<double>(rope_scaling.original_max_position_embeddings);
    auto correction_dim = [&](double num_rotations) {
        return static_cast<double>(dim) * std::log(max_pos / (num_rotations * 2.0 * M_PI)) /
               (2.0 * std::log(rope_theta));
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

Status ModelConfig::validate() const {
    auto positive = [](const char* name, int64_t v) -> Status {
        if (v <= 0) return invalid_argument(std::string("config: ") + name + " must be > 0, got " +
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
    if (first_k_dense_replace > 0) DSI_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
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
            return invalid_argument("config: num_experts_per_tok exceeds experts in topk_group groups");
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
    DSI_RETURN_IF_ERROR(read_opt(j, "rms_norm_eps", c.rms_norm_eps));
    DSI_RETURN_IF_ERROR(read_opt(j, "rope_theta", c.rope_theta));
    DSI_RETURN_IF_ERROR(read_opt(j, "max_position_embeddings", c.max_position_embeddings));
    DSI_RETURN_IF_ERROR(read_opt(j, "bos_token_id", c.bos_token_id));
    DSI_RETURN_IF_ERROR(read_opt(j, "eos_token_id", c.eos_token_id));
    DSI_RETURN_IF_ERROR(read_opt(j, "tie_word_embeddings", c.tie_word_embeddings));
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
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
    }
    if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
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
    }
    DSI_RETURN_IF_ERROR(c.validate());
    return c;
}

std::string to_hf_config_json(const ModelConfig& c) {
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
    if (c.rope_scaling.yarn) {
        j["rope_scaling"] = {
            {"type", "yarn"},
            {"factor", c.rope_scaling.factor},
            {"beta_fast", c.rope_scaling.beta_fast},
            {"beta_slow", c.rope_scaling.beta_slow},
            {"mscale", c.rope_scaling.mscale},
            {"mscale_all_dim", c.rope_scaling.mscale_all_dim},
            {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
        };
    } else {
        j["rope_scaling"] = nullptr;
    }
    if (c.fp8) {
        json q = {{"activation_scheme", "dynamic"},
                  {"fmt", "e4m3"},
                  {"quant_method", "fp8"},
                  {"weight_block_size", {c.fp8_block_rows, c.fp8_block_cols}}};
        if (c.fp8_scale_ue8m0) q["scale_fmt"] = "ue8m0";
        j["quantization_config"] = q;
    }
    return j.dump(2) + "\n";
}

}  // namespace dsi
