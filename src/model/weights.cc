#include "model/weights.h"

#include <cstring>

namespace dsi {

void WeightMatrix::dequantize_row(int64_t r, float* out) const {
    DSI_DCHECK(r >= 0 && r < rows);
    const uint8_t* row = data + r * row_bytes();
    dsi::dequantize_row(dtype, row, out, cols);
    if (block_scale != nullptr) {
        const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
        const float* s = block_scale + (r / block_rows) * scale_cols;
        for (int64_t c = 0; c < cols; ++c) out[c] *= s[c / block_cols];
    }
}

void MemoryWeightSource::add(std::string name, std::vector<int64_t> shape,
                             std::vector<float> data) {
    DSI_CHECK(shape_numel(shape) == static_cast<int64_t>(data.size()), "tensor ", name);
    tensors_[std::move(name)] = Tensor{std::move(shape), std::move(data)};
}

Result<WeightMatrix> MemoryWeightSource::matrix(const std::string& name, int64_t rows,
                                                int64_t cols) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return not_found("memory: missing tensor '" + name + "'");
    const Tensor& t = it->second;
    if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols) {
        return invalid_argument("memory: tensor '" + name + "' has the wrong shape");
    }
    WeightMatrix m;
    m.dtype = DType::kF32;
    m.rows = rows;
    m.cols = cols;
    m.data = reinterpret_cast<const uint8_t*>(t.data.data());
    return m;
}

Result<std::vector<float>> MemoryWeightSource::vector(const std::string& name, int64_t n) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return not_found("memory: missing tensor '" + name + "'");
    if (static_cast<int64_t>(it->second.data.size()) != n || it->second.shape.size() != 1) {
        return invalid_argument("memory: tensor '" + name + "' has the wrong shape");
    }
    return it->second.data;
}

Result<std::vector<int32_t>> WeightSource::int_matrix(const std::string& name, int64_t, int64_t) {
    return unimplemented(description() + ": integer tensor '" + name +
                         "' is not supported by this checkpoint format");
}

Result<std::vector<int32_t>> MemoryWeightSource::int_matrix(const std::string& name,
                                                            int64_t rows, int64_t cols) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return not_found("memory: missing tensor '" + name + "'");
    const Tensor& t = it->second;
    if (t.shape != std::vector<int64_t>{rows, cols}) {
        return invalid_argument("memory: tensor '" + name + "' has the wrong shape");
    }
    std::vector<int32_t> out(t.data.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int32_t>(t.data[i]);
    return out;
}

std::string v4_scale_name(const std::string& weight_name) {
    constexpr std::string_view kSuffix = "weight";
    if (weight_name.size() >= kSuffix.size() &&
        weight_name.compare(weight_name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
        return weight_name.substr(0, weight_name.size() - kSuffix.size()) + "scale";
    }
    return weight_name + ".scale";
}

std::vector<V4TensorSpec> deepseek_v4_tensor_specs(const ModelConfig& c) {
    std::vector<V4TensorSpec> specs;
    const int64_t H = c.hidden_size;
    const int64_t V = c.vocab_size;
    const int64_t nh = c.num_attention_heads;
    const int64_t hd = c.head_dim;
    const int64_t hc = c.hc_mult;
    const int64_t mix = (2 + hc) * hc;
    const int64_t inter = c.moe_intermediate_size;
    auto add = [&](std::string name, std::vector<int64_t> shape, V4Storage st) {
        specs.push_back(V4TensorSpec{std::move(name), std::move(shape), st});
    };
    using S = V4Storage;
    add("embed.weight", {V, H}, S::kBF16);
    // One block: layers.N. or mtp.0.; `layer` selects the compressor kind and router.
    auto add_block = [&](const std::string& p, int64_t layer) {
        add(p + "attn_norm.weight", {H}, S::kBF16);
        add(p + "ffn_norm.weight", {H}, S::kBF16);
        for (const char* sub : {"attn", "ffn"}) {
            add(p + "hc_" + sub + "_fn", {mix, hc * H}, S::kF32);
            add(p + "hc_" + sub + "_base", {mix}, S::kF32);
            add(p + "hc_" + sub + "_scale", {3}, S::kF32);
        }
        const std::string a = p + "attn.";
        add(a + "wq_a.weight", {c.q_lora_rank, H}, S::kFp8);
        add(a + "q_norm.weight", {c.q_lora_rank}, S::kBF16);
        add(a + "wq_b.weight", {nh * hd, c.q_lora_rank}, S::kFp8);
        add(a + "wkv.weight", {hd, H}, S::kFp8);
        add(a + "kv_norm.weight", {hd}, S::kBF16);
        add(a + "wo_a.weight", {c.o_groups * c.o_lora_rank, nh * hd / c.o_groups}, S::kFp8);
        add(a + "wo_b.weight", {H, c.o_groups * c.o_lora_rank}, S::kFp8);
        add(a + "attn_sink", {nh}, S::kF32);
        const int64_t ratio = c.compress_ratio(layer);
        auto add_compressor = [&](const std::string& q, int64_t dim) {
            const int64_t coff = ratio == 4 ? 2 : 1;
            add(q + "wkv.weight", {coff * dim, H}, S::kBF16);
            add(q + "wgate.weight", {coff * dim, H}, S::kBF16);
            add(q + "ape", {ratio, coff * dim}, S::kF32);
            add(q + "norm.weight", {dim}, S::kBF16);
        };
        if (ratio > 0) add_compressor(a + "compressor.", hd);
        if (ratio == 4) {
            add(a + "indexer.wq_b.weight", {c.index_n_heads * c.index_head_dim, c.q_lora_rank},
                S::kFp8);
            add(a + "indexer.weights_proj.weight", {c.index_n_heads, H}, S::kBF16);
            add_compressor(a + "indexer.compressor.", c.index_head_dim);
        }
        const std::string f = p + "ffn.";
        add(f + "gate.weight", {c.n_routed_experts, H}, S::kBF16);
        if (layer < c.num_hash_layers) {
            add(f + "gate.tid2eid", {V, c.num_experts_per_tok}, S::kI64);
        } else {
            add(f + "gate.bias", {c.n_routed_experts}, S::kF32);
        }
        for (int64_t e = 0; e < c.n_routed_experts; ++e) {
            const std::string x = f + "experts." + std::to_string(e) + ".";
            add(x + "w1.weight", {inter, H}, S::kFp4);
            add(x + "w2.weight", {H, inter}, S::kFp4);
            add(x + "w3.weight", {inter, H}, S::kFp4);
        }
        if (c.n_shared_experts > 0) {
            const int64_t si = c.n_shared_experts * inter;
            add(f + "shared_experts.w1.weight", {si, H}, S::kFp8);
            add(f + "shared_experts.w2.weight", {H, si}, S::kFp8);
            add(f + "shared_experts.w3.weight", {si, H}, S::kFp8);
        }
    };
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        add_block("layers." + std::to_string(i) + ".", i);
    }
    add("norm.weight", {H}, S::kBF16);
    add("head.weight", {V, H}, S::kBF16);
    add("hc_head_fn", {hc, hc * H}, S::kF32);
    add("hc_head_base", {hc}, S::kF32);
    add("hc_head_scale", {1}, S::kF32);
    for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
        const std::string p = "mtp." + std::to_string(k) + ".";
        add(p + "e_proj.weight", {H, H}, S::kFp8);
        add(p + "h_proj.weight", {H, H}, S::kFp8);
        add(p + "enorm.weight", {H}, S::kBF16);
        add(p + "hnorm.weight", {H}, S::kBF16);
        add_block(p, c.num_hidden_layers + k);
        add(p + "norm.weight", {H}, S::kBF16);
        add(p + "hc_head_fn", {hc, hc * H}, S::kF32);
        add(p + "hc_head_base", {hc}, S::kF32);
        add(p + "hc_head_scale", {1}, S::kF32);
    }
    return specs;
}

std::vector<TensorSpec> deepseek_tensor_specs(const ModelConfig& c) {
    std::vector<TensorSpec> specs;
    const int64_t H = c.hidden_size;
    const int64_t V = c.vocab_size;
    const int64_t nh = c.num_attention_heads;
    auto add = [&](std::string name, std::vector<int64_t> shape, bool q) {
        specs.push_back(TensorSpec{std::move(name), std::move(shape), q});
    };
    add("model.embed_tokens.weight", {V, H}, false);
    auto add_block = [&](int64_t i) {
        const std::string p = "model.layers." + std::to_string(i) + ".";
        add(p + "input_layernorm.weight", {H}, false);
        if (c.q_lora_rank > 0) {
            add(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, H}, true);
            add(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}, false);
            add(p + "self_attn.q_b_proj.weight", {nh * c.qk_head_dim(), c.q_lora_rank}, true);
        } else {
            add(p + "self_attn.q_proj.weight", {nh * c.qk_head_dim(), H}, true);
        }
        add(p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, H},
            true);
        add(p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}, false);
        add(p + "self_attn.kv_b_proj.weight",
            {nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, true);
        add(p + "self_attn.o_proj.weight", {H, nh * c.v_head_dim}, true);
        add(p + "post_attention_layernorm.weight", {H}, false);
        auto add_mlp = [&](const std::string& q, int64_t inter) {
            add(q + "gate_proj.weight", {inter, H}, true);
            add(q + "up_proj.weight", {inter, H}, true);
            add(q + "down_proj.weight", {H, inter}, true);
        };
        if (!c.is_moe_layer(i)) {
            add_mlp(p + "mlp.", c.intermediate_size);
            return;
        }
        add(p + "mlp.gate.weight", {c.n_routed_experts, H}, false);
        if (c.topk_method == TopkMethod::kNoauxTc) {
            add(p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts}, false);
        }
        for (int64_t e = 0; e < c.n_routed_experts; ++e) {
            add_mlp(p + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size);
        }
        if (c.n_shared_experts > 0) {
            add_mlp(p + "mlp.shared_experts.", c.n_shared_experts * c.moe_intermediate_size);
        }
    };
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) add_block(i);
    add("model.norm.weight", {H}, false);
    if (!c.tie_word_embeddings) add("lm_head.weight", {V, H}, false);
    for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
        const int64_t i = c.num_hidden_layers + k;
        const std::string p = "model.layers." + std::to_string(i) + ".";
        add(p + "embed_tokens.weight", {V, H}, false);
        add(p + "enorm.weight", {H}, false);
        add(p + "hnorm.weight", {H}, false);
        add(p + "eh_proj.weight", {H, 2 * H}, false);
        add_block(i);
        add(p + "shared_head.norm.weight", {H}, false);
        add(p + "shared_head.head.weight", {V, H}, false);
    }
    return specs;
}

}  // namespace dsi
