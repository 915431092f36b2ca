#include "model/gguf_names.h"

#include <cmath>

namespace dsi {
namespace {

constexpr const char* kArch = "deepseek2";
constexpr const char* kArchV4 = "deepseek4";

std::string key(const char* suffix) { return std::string(kArch) + "." + suffix; }
std::string key4(const char* suffix) { return std::string(kArchV4) + "." + suffix; }

// llama.cpp's expert_gating_func value for sqrt(softplus(x)) (DeepSeek V4).
constexpr uint32_t kGatingSqrtSoftplus = 4;

// "<prefix><n>.<rest>" -> (n, rest); nullopt otherwise.
std::optional<std::pair<int64_t, std::string>> split_numbered(const std::string& name,
                                                              const std::string& prefix) {
    if (name.rfind(prefix, 0) != 0) return std::nullopt;
    size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) return std::nullopt;
    const std::string num = name.substr(prefix.size(), dot - prefix.size());
    if (num.empty() || num.size() > 9 || num.find_first_not_of("0123456789") != std::string::npos) {
        return std::nullopt;
    }
    return std::make_pair(std::stoll(num), name.substr(dot + 1));
}

// DeepSeek V4 (official HF names, no "model." prefix) -> llama.cpp deepseek4 names
// (docs/models.md "GGUF deepseek4"). The MTP layer `mtp.0.` is block num_hidden_layers:
// its layer tensors under the usual names, e_proj and h_proj as the two column halves of
// nextn.eh_proj, enorm / hnorm / norm as nextn.{enorm,hnorm,shared_head_norm}. The MTP
// layer's own hc_head has no GGUF counterpart (llama.cpp's deepseek4 applies the trunk's
// hc_head to the MTP output; the loader does the same when a file lacks it).
std::optional<GgufTensorRef> v4_gguf_tensor(const ModelConfig& c, const std::string& name) {
    struct Row {
        const char* hf;
        const char* gguf;
    };
    static const Row kGlobal[] = {
        {"embed.weight", "token_embd.weight"},    {"head.weight", "output.weight"},
        {"norm.weight", "output_norm.weight"},    {"hc_head_fn", "output_hc_fn.weight"},
        {"hc_head_base", "output_hc_base.weight"}, {"hc_head_scale", "output_hc_scale.weight"},
    };
    for (const Row& r : kGlobal) {
        if (name == r.hf) return GgufTensorRef{r.gguf};
    }
    auto layer = split_numbered(name, "layers.");
    if (layer && layer->first >= c.num_hidden_layers) return std::nullopt;
    if (!layer) {
        auto mtp = split_numbered(name, "mtp.");
        if (!mtp || mtp->first >= c.num_nextn_predict_layers) return std::nullopt;
        mtp->first += c.num_hidden_layers;
        const std::string blk = "blk." + std::to_string(mtp->first) + ".";
        if (mtp->second == "e_proj.weight") return GgufTensorRef{blk + "nextn.eh_proj.weight", -1, 0};
        if (mtp->second == "h_proj.weight") return GgufTensorRef{blk + "nextn.eh_proj.weight", -1, 1};
        static const Row kMtp[] = {{"enorm.weight", "nextn.enorm.weight"},
                                   {"hnorm.weight", "nextn.hnorm.weight"},
                                   {"norm.weight", "nextn.shared_head_norm.weight"}};
        for (const Row& r : kMtp) {
            if (mtp->second == r.hf) return GgufTensorRef{blk + r.gguf};
        }
        if (mtp->second.starts_with("hc_head_")) return std::nullopt;
        layer = mtp;
    }
    const auto& [i, rest] = *layer;
    const std::string blk = "blk." + std::to_string(i) + ".";
    static const Row kRows[] = {
        {"attn_norm.weight", "attn_norm.weight"},
        {"ffn_norm.weight", "ffn_norm.weight"},
        {"hc_attn_fn", "hc_attn_fn.weight"},
        {"hc_attn_base", "hc_attn_base.weight"},
        {"hc_attn_scale", "hc_attn_scale.weight"},
        {"hc_ffn_fn", "hc_ffn_fn.weight"},
        {"hc_ffn_base", "hc_ffn_base.weight"},
        {"hc_ffn_scale", "hc_ffn_scale.weight"},
        {"attn.wq_a.weight", "attn_q_a.weight"},
        {"attn.q_norm.weight", "attn_q_a_norm.weight"},
        {"attn.wq_b.weight", "attn_q_b.weight"},
        {"attn.wkv.weight", "attn_kv.weight"},
        {"attn.kv_norm.weight", "attn_kv_a_norm.weight"},
        {"attn.wo_a.weight", "attn_output_a.weight"},
        {"attn.wo_b.weight", "attn_output_b.weight"},
        {"attn.attn_sink", "attn_sinks.weight"},
        {"attn.compressor.wkv.weight", "attn_compressor_kv.weight"},
        {"attn.compressor.wgate.weight", "attn_compressor_gate.weight"},
        {"attn.compressor.ape", "attn_compressor_ape.weight"},
        {"attn.compressor.norm.weight", "attn_compressor_norm.weight"},
        {"attn.indexer.wq_b.weight", "indexer.attn_q_b.weight"},
        {"attn.indexer.weights_proj.weight", "indexer.proj.weight"},
        {"attn.indexer.compressor.wkv.weight", "indexer_compressor_kv.weight"},
        {"attn.indexer.compressor.wgate.weight", "indexer_compressor_gate.weight"},
        {"attn.indexer.compressor.ape", "indexer_compressor_ape.weight"},
        {"attn.indexer.compressor.norm.weight", "indexer_compressor_norm.weight"},
        {"ffn.gate.weight", "ffn_gate_inp.weight"},
        {"ffn.gate.bias", "exp_probs_b.bias"},
        {"ffn.gate.tid2eid", "ffn_gate_tid2eid.weight"},
        {"ffn.shared_experts.w1.weight", "ffn_gate_shexp.weight"},
        {"ffn.shared_experts.w3.weight", "ffn_up_shexp.weight"},
        {"ffn.shared_experts.w2.weight", "ffn_down_shexp.weight"},
    };
    for (const Row& r : kRows) {
        if (rest == r.hf) return GgufTensorRef{blk + r.gguf};
    }
    // "ffn.experts.<e>.w<1|2|3>.weight" -> slice e of ffn_<gate|down|up>_exps.
    auto expert = split_numbered(rest, "ffn.experts.");
    if (!expert || expert->first >= c.n_routed_experts) return std::nullopt;
    static const Row kExperts[] = {{"w1.weight", "ffn_gate_exps.weight"},
                                   {"w3.weight", "ffn_up_exps.weight"},
                                   {"w2.weight", "ffn_down_exps.weight"}};
    for (const Row& r : kExperts) {
        if (expert->second == r.hf) return GgufTensorRef{blk + r.gguf, expert->first};
    }
    return std::nullopt;
}

Result<ModelConfig> v4_config_from_gguf(const GgufFile& f) {
    ModelConfig c;
    c.architecture = "DeepseekV4ForCausalLM";
    c.family = ModelFamily::kDeepseekV4;
    c.scoring_func = ScoringFunc::kSqrtSoftplus;
    c.topk_method = TopkMethod::kNoauxTc;
    auto i64 = [&](const char* k, int64_t& out) -> Status {
        DSI_ASSIGN_OR_RETURN(out, f.get_i64(key4(k)));
        return Status::ok();
    };
    auto f64 = [&](const char* k, double& out) -> Status {
        DSI_ASSIGN_OR_RETURN(out, f.get_f64(key4(k)));
        return Status::ok();
    };
    int64_t blocks = 0;
    DSI_RETURN_IF_ERROR(i64("block_count", blocks));
    DSI_RETURN_IF_ERROR(i64("embedding_length", c.hidden_size));
    DSI_RETURN_IF_ERROR(i64("attention.head_count", c.num_attention_heads));
    DSI_RETURN_IF_ERROR(i64("attention.head_count_kv", c.num_key_value_heads));
    DSI_RETURN_IF_ERROR(i64("attention.key_length", c.head_dim));
    DSI_RETURN_IF_ERROR(i64("rope.dimension_count", c.qk_rope_head_dim));
    DSI_RETURN_IF_ERROR(i64("attention.q_lora_rank", c.q_lora_rank));
    DSI_RETURN_IF_ERROR(i64("attention.output_lora_rank", c.o_lora_rank));
    DSI_RETURN_IF_ERROR(i64("attention.output_group_count", c.o_groups));
    DSI_RETURN_IF_ERROR(i64("attention.sliding_window", c.sliding_window));
    DSI_ASSIGN_OR_RETURN(c.compress_ratios, f.get_i64_array(key4("attention.compress_ratios")));
    DSI_RETURN_IF_ERROR(f64("attention.compress_rope_freq_base", c.compress_rope_theta));
    DSI_RETURN_IF_ERROR(f64("rope.freq_base", c.rope_theta));
    DSI_RETURN_IF_ERROR(f64("attention.layer_norm_rms_epsilon", c.rms_norm_eps));
    if (f.find_kv(key4("attention.indexer.head_count"))) {
        DSI_RETURN_IF_ERROR(i64("attention.indexer.head_count", c.index_n_heads));
        DSI_RETURN_IF_ERROR(i64("attention.indexer.key_length", c.index_head_dim));
        DSI_RETURN_IF_ERROR(i64("attention.indexer.top_k", c.index_topk));
    }
    DSI_RETURN_IF_ERROR(i64("expert_count", c.n_routed_experts));
    DSI_RETURN_IF_ERROR(i64("expert_used_count", c.num_experts_per_tok));
    DSI_RETURN_IF_ERROR(i64("expert_shared_count", c.n_shared_experts));
    DSI_RETURN_IF_ERROR(i64("expert_feed_forward_length", c.moe_intermediate_size));
    DSI_RETURN_IF_ERROR(f64("expert_weights_scale", c.routed_scaling_factor));
    if (f.find_kv(key4("expert_weights_norm"))) {
        DSI_ASSIGN_OR_RETURN(c.norm_topk_prob, f.get_bool(key4("expert_weights_norm")));
    }
    DSI_ASSIGN_OR_RETURN(uint32_t gating, f.get_u32(key4("expert_gating_func")));
    if (gating != kGatingSqrtSoftplus) {
        return invalid_argument(key4("expert_gating_func") + " = " + std::to_string(gating) +
                                " (DeepSeek V4 needs 4, sqrt(softplus))");
    }
    DSI_RETURN_IF_ERROR(i64("hash_layer_count", c.num_hash_layers));
    DSI_RETURN_IF_ERROR(i64("hyper_connection.count", c.hc_mult));
    DSI_RETURN_IF_ERROR(i64("hyper_connection.sinkhorn_iterations", c.hc_sinkhorn_iters));
    DSI_RETURN_IF_ERROR(f64("hyper_connection.epsilon", c.hc_eps));
    if (f.find_kv(key4("swiglu_clamp_exp"))) {
        // One limit per layer; V4 uses one value for all.
        DSI_ASSIGN_OR_RETURN(std::vector<float> limits, f.get_f32_array(key4("swiglu_clamp_exp")));
        if (!limits.empty()) c.swiglu_limit = limits[0];
        for (float v : limits) {
            if (v != static_cast<float>(c.swiglu_limit)) {
                return invalid_argument(key4("swiglu_clamp_exp") + " differs between layers");
            }
        }
    }
    if (f.find_kv(key4("nextn_predict_layers"))) {
        DSI_RETURN_IF_ERROR(i64("nextn_predict_layers", c.num_nextn_predict_layers));
    }
    if (f.find_kv(key4("context_length"))) DSI_RETURN_IF_ERROR(i64("context_length", c.max_position_embeddings));
    c.num_hidden_layers = blocks - c.num_nextn_predict_layers;
    // A file that declares MTP blocks without their tensors has none (llama.cpp reads it
    // the same way: it probes the first MTP block's nextn.eh_proj).
    if (c.num_nextn_predict_layers > 0 &&
        f.find_tensor("blk." + std::to_string(c.num_hidden_layers) + ".nextn.eh_proj.weight") == nullptr) {
        c.num_nextn_predict_layers = 0;
    }
    // llama.cpp keeps an entry per block (layers + MTP) or more; ours needs exactly that many.
    const int64_t entries = c.num_hidden_layers + c.num_nextn_predict_layers;
    if (entries >= 0 && static_cast<int64_t>(c.compress_ratios.size()) > entries) {
        c.compress_ratios.resize(static_cast<size_t>(entries));
    }
    if (f.find_kv(key4("rope.scaling.type"))) {
        DSI_ASSIGN_OR_RETURN(std::string type, f.get_string(key4("rope.scaling.type")));
        if (type == "yarn") {
            c.rope_scaling.yarn = true;
            DSI_RETURN_IF_ERROR(f64("rope.scaling.factor", c.rope_scaling.factor));
            DSI_RETURN_IF_ERROR(i64("rope.scaling.original_context_length",
                                    c.rope_scaling.original_max_position_embeddings));
            if (f.find_kv(key4("rope.scaling.yarn_beta_fast"))) {
                DSI_RETURN_IF_ERROR(f64("rope.scaling.yarn_beta_fast", c.rope_scaling.beta_fast));
            }
            if (f.find_kv(key4("rope.scaling.yarn_beta_slow"))) {
                DSI_RETURN_IF_ERROR(f64("rope.scaling.yarn_beta_slow", c.rope_scaling.beta_slow));
            }
        } else if (type != "none") {
            return invalid_argument(key4("rope.scaling.type") + " '" + type + "' is not supported");
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
    c.qk_nope_head_dim = c.head_dim - c.qk_rope_head_dim;
    c.v_head_dim = c.head_dim;
    DSI_RETURN_IF_ERROR(c.validate());
    return c;
}

std::vector<std::pair<std::string, GgufValue>> v4_gguf_metadata(const ModelConfig& c,
                                                                const std::string& name) {
    std::vector<std::pair<std::string, GgufValue>> kv;
    auto u32 = [&](const char* k, int64_t v) { kv.emplace_back(key4(k), static_cast<uint32_t>(v)); };
    auto f32 = [&](const char* k, double v) { kv.emplace_back(key4(k), static_cast<float>(v)); };
    const int64_t L = c.num_hidden_layers + c.num_nextn_predict_layers;  // blocks, MTP last
    kv.emplace_back("general.architecture", std::string(kArchV4));
    kv.emplace_back("general.name", name);
    u32("block_count", L);
    u32("context_length", c.max_position_embeddings);
    u32("embedding_length", c.hidden_size);
    u32("feed_forward_length", c.moe_intermediate_size);
    u32("vocab_size", c.vocab_size);
    u32("attention.head_count", c.num_attention_heads);
    u32("attention.head_count_kv", 1);
    u32("attention.key_length", c.head_dim);
    u32("attention.value_length", c.head_dim);
    f32("attention.layer_norm_rms_epsilon", c.rms_norm_eps);
    u32("attention.q_lora_rank", c.q_lora_rank);
    u32("attention.output_lora_rank", c.o_lora_rank);
    u32("attention.output_group_count", c.o_groups);
    u32("attention.sliding_window", c.sliding_window);
    std::vector<uint32_t> ratios(c.compress_ratios.begin(), c.compress_ratios.begin() + L);
    kv.emplace_back(key4("attention.compress_ratios"), GgufArray(std::move(ratios)));
    f32("attention.compress_rope_freq_base", c.compress_rope_theta);
    u32("attention.indexer.head_count", c.index_n_heads);
    u32("attention.indexer.key_length", c.index_head_dim);
    u32("attention.indexer.top_k", c.index_topk);
    u32("hash_layer_count", c.num_hash_layers);
    u32("hyper_connection.count", c.hc_mult);
    u32("hyper_connection.sinkhorn_iterations", c.hc_sinkhorn_iters);
    f32("hyper_connection.epsilon", c.hc_eps);
    u32("expert_count", c.n_routed_experts);
    u32("expert_used_count", c.num_experts_per_tok);
    u32("expert_shared_count", c.n_shared_experts);
    u32("expert_feed_forward_length", c.moe_intermediate_size);
    f32("expert_weights_scale", c.routed_scaling_factor);
    kv.emplace_back(key4("expert_weights_norm"), c.norm_topk_prob);
    u32("expert_gating_func", kGatingSqrtSoftplus);
    kv.emplace_back(key4("swiglu_clamp_exp"),
                    GgufArray(std::vector<float>(static_cast<size_t>(L), static_cast<float>(c.swiglu_limit))));
    kv.emplace_back(key4("swiglu_clamp_shexp"),
                    GgufArray(std::vector<float>(static_cast<size_t>(L), static_cast<float>(c.swiglu_limit))));
    u32("leading_dense_block_count", 0);
    u32("nextn_predict_layers", c.num_nextn_predict_layers);
    u32("rope.dimension_count", c.qk_rope_head_dim);
    f32("rope.freq_base", c.rope_theta);
    if (c.rope_scaling.yarn) {
        kv.emplace_back(key4("rope.scaling.type"), std::string("yarn"));
        f32("rope.scaling.factor", c.rope_scaling.factor);
        u32("rope.scaling.original_context_length", c.rope_scaling.original_max_position_embeddings);
        f32("rope.scaling.yarn_beta_fast", c.rope_scaling.beta_fast);
        f32("rope.scaling.yarn_beta_slow", c.rope_scaling.beta_slow);
    }
    return kv;
}

// "model.layers.<i>.<rest>" -> (i, rest); nullopt otherwise.

}  // namespace

std::optional<GgufTensorRef> gguf_tensor_for_hf_name(const ModelConfig& c,
                                                     const std::string& name) {
    if (c.is_v4()) return v4_gguf_tensor(c, name);
    if (name == "model.embed_tokens.weight") return GgufTensorRef{"token_embd.weight"};
    if (name == "model.norm.weight") return GgufTensorRef{"output_norm.weight"};
    if (name == "lm_head.weight") return GgufTensorRef{"output.weight"};
    auto layer = split_numbered(name, "model.layers.");
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
    if (arch == kArchV4) return v4_config_from_gguf(f);
    if (arch != kArch) {
        return invalid_argument("general.architecture is '" + arch +
                                "', expected 'deepseek2' or 'deepseek4'");
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
    if (c.is_v4()) return v4_gguf_metadata(c, name);
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
