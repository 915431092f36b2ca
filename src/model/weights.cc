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
