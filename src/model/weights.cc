#include "model/weights.h"

#include <cstring>
#include <functional>

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

Result<std::vector<int32_t>> MemoryWeightSource::int_matrix(const std::string& name, int64_t rows,
                                                            int64_t cols) {
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

namespace {

using SpecAdder = std::function<void(std::string, std::vector<int64_t>, V4Storage)>;

// What every V4 / V4.1 block has before its compressor: norms, both sub-layers' mHC
// parameters and the MQA attention core.
void add_v4_attn_core(const ModelConfig& c, const std::string& p, const SpecAdder& add) {
    using S = V4Storage;
    const int64_t H = c.hidden_size;
    const int64_t nh = c.num_attention_heads;
    const int64_t hd = c.head_dim;
    const int64_t hc = c.hc_mult;
    const int64_t mix = (2 + hc) * hc;
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
}

// The MoE: router (hash table or bias), `num_experts` routed experts, shared experts.
void add_v4_ffn(const ModelConfig& c, const std::string& p, int64_t num_experts, int64_t top_k,
                bool hash, const SpecAdder& add) {
    using S = V4Storage;
    const int64_t H = c.hidden_size;
    const int64_t inter = c.moe_intermediate_size;
    const std::string f = p + "ffn.";
    add(f + "gate.weight", {num_experts, H}, S::kBF16);
    if (hash) {
        add(f + "gate.tid2eid", {c.vocab_size, top_k}, S::kI64);
    } else {
        add(f + "gate.bias", {num_experts}, S::kF32);
    }
    for (int64_t e = 0; e < num_experts; ++e) {
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
}

}  // namespace

std::vector<V4TensorSpec> deepseek_v4_tensor_specs(const ModelConfig& c) {
    if (c.is_v41()) return deepseek_v41_tensor_specs(c);
    std::vector<V4TensorSpec> specs;
    const int64_t H = c.hidden_size;
    const int64_t V = c.vocab_size;
    const int64_t hc = c.hc_mult;
    const SpecAdder add = [&](std::string name, std::vector<int64_t> shape, V4Storage st) {
        specs.push_back(V4TensorSpec{std::move(name), std::move(shape), st});
    };
    using S = V4Storage;
    add("embed.weight", {V, H}, S::kBF16);
    // One block: layers.N. or mtp.0.; `layer` selects the compressor kind and router.
    auto add_block = [&](const std::string& p, int64_t layer) {
        add_v4_attn_core(c, p, add);
        const std::string a = p + "attn.";
        const int64_t ratio = c.compress_ratio(layer);
        auto add_compressor = [&](const std::string& q, int64_t dim) {
            const int64_t coff = ratio == 4 ? 2 : 1;
            add(q + "wkv.weight", {coff * dim, H}, S::kBF16);
            add(q + "wgate.weight", {coff * dim, H}, S::kBF16);
            add(q + "ape", {ratio, coff * dim}, S::kF32);
            add(q + "norm.weight", {dim}, S::kBF16);
        };
        if (ratio > 0) add_compressor(a + "compressor.", c.head_dim);
        if (ratio == 4) {
            add(a + "indexer.wq_b.weight", {c.index_n_heads * c.index_head_dim, c.q_lora_rank},
                S::kFp8);
            add(a + "indexer.weights_proj.weight", {c.index_n_heads, H}, S::kBF16);
            add_compressor(a + "indexer.compressor.", c.index_head_dim);
        }
        add_v4_ffn(c, p, c.n_routed_experts, c.num_experts_per_tok, layer < c.num_hash_layers, add);
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

// V4.1 (docs/models_v41.md "Checkpoint"): V4's block core; CSA2 compressors (ratio 2:
// wkv + wgate in f32, ratio 1: wkv in bf16, no APE) and index-key projections on Full
// layers, indexer queries on Full and Reindex layers; Engram tables before Engram
// layers; no hash routing and no hc_head; DSpark draft blocks as mtp.K.
std::vector<V4TensorSpec> deepseek_v41_tensor_specs(const ModelConfig& c) {
    std::vector<V4TensorSpec> specs;
    const int64_t H = c.hidden_size;
    const int64_t V = c.vocab_size;
    const int64_t hd = c.head_dim;
    const V41Fields& f = c.v41;
    const SpecAdder add = [&](std::string name, std::vector<int64_t> shape, V4Storage st) {
        specs.push_back(V4TensorSpec{std::move(name), std::move(shape), st});
    };
    using S = V4Storage;
    add("embed.weight", {V, H}, S::kBF16);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        const std::string p = "layers." + std::to_string(i) + ".";
        if (int64_t e = v41_engram_index(c, i); e >= 0) {
            const int64_t width =
                (f.engram_max_ngram_size - 1) * f.engram_n_heads * f.engram_head_dim;
            add(p + "engram.embed.weight",
                {f.engram_num_embeddings[static_cast<size_t>(e)], f.engram_head_dim}, S::kFp8);
            add(p + "engram.wkv.weight", {(c.hc_mult + 1) * H, width}, S::kFp8);
            add(p + "engram.q_norm.weight", {H}, S::kBF16);
            add(p + "engram.k_norm.weight", {H}, S::kBF16);
        }
        add_v4_attn_core(c, p, add);
        const std::string a = p + "attn.";
        const V41AttnKind kind = v41_attn_kind(c, i);
        if (kind == V41AttnKind::kFull) {
            const bool gated = c.compress_ratio(i) > 1;
            add(a + "compressor.wkv.weight", {hd, H}, gated ? S::kF32 : S::kBF16);
            if (gated) add(a + "compressor.wgate.weight", {hd, H}, S::kF32);
            add(a + "compressor.norm.weight", {hd}, S::kBF16);
            add(a + "indexer.wk.weight", {c.index_head_dim, hd}, S::kBF16);
            add(a + "indexer.k_norm.weight", {c.index_head_dim}, S::kBF16);
        }
        if (kind == V41AttnKind::kFull || kind == V41AttnKind::kReindex) {
            add(a + "indexer.wq_b.weight", {c.index_n_heads * c.index_head_dim, c.q_lora_rank},
                S::kFp8);
            add(a + "indexer.weights_proj.weight", {c.index_n_heads, H}, S::kBF16);
        }
        add_v4_ffn(c, p, c.n_routed_experts, c.num_experts_per_tok, false, add);
    }
    add("norm.weight", {H}, S::kBF16);
    add("head.weight", {V, H}, S::kBF16);
    // DSpark: the first block reads the target layers' streams (h_proj) and the draft
    // tokens' embeddings (e_proj); every block is window-only with the drafter's MoE;
    // the last ends in norm; a low-rank Markov head (token -> rank -> vocab).
    const int64_t nd = c.num_nextn_predict_layers;
    for (int64_t k = 0; k < nd; ++k) {
        const std::string p = "mtp." + std::to_string(k) + ".";
        if (k == 0) {
            const int64_t nt = static_cast<int64_t>(f.dspark_target_layer_ids.size());
            add(p + "e_proj.weight", {H, H}, S::kFp8);
            add(p + "h_proj.weight", {H, nt * H}, S::kFp8);
            add(p + "enorm.weight", {H}, S::kBF16);
            add(p + "hnorm.weight", {H}, S::kBF16);
            add(p + "markov.a.weight", {V, f.dspark_markov_rank}, S::kBF16);
            add(p + "markov.b.weight", {V, f.dspark_markov_rank}, S::kBF16);
        }
        add_v4_attn_core(c, p, add);
        add_v4_ffn(c, p, f.dspark_n_routed_experts, f.dspark_num_experts_per_tok, false, add);
        if (k == nd - 1) add(p + "norm.weight", {H}, S::kBF16);
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
