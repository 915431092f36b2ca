#include "model/deepseek.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/internal/ep_host.h"
#include "model/internal/linear.h"

namespace dsi {
namespace {

constexpr int kLanes = 16;

// Dot product with kLanes partial sums combined in a fixed order: deterministic,
// and simple enough for the compiler to vectorise.
float dot(const float* a, const float* b, int64_t n) {
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
    }
    for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
    for (int w = kLanes / 2; w > 0; w /= 2) {
        for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    }
    return acc[0];
}

void axpy(float a, const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

using internal::Linear;
using internal::WeightClass;

// Per-thread scratch for a forward pass's large intermediates, reused across layers and
// calls. A fresh std::vector per layer meant fresh pages (page faults, zero fill): 13 % of
// a 256-token prefill of `medium` under load (bench/RESULTS.md, issue 20). Each function
// has its own slots and never holds one across a call that uses the same slot; contents
// are not zeroed (every use writes its whole range before reading it). The buffers keep
// their largest size for the thread's lifetime (tens of MB for a 256-token prefill).
enum class Scratch : int {
    kBlockH,
    kBlockY,
    kAttnQ,
    kAttnQa,
    kAttnOut,
    kKvA,
    kQLat,
    kHeadIn,
    kHeadOut,
    kOLat,
    kMlpGate,
    kMlpUp,
    kMoeIn,
    kMoeOut,
    kMoeShared,
    kCount
};

// A view of one slot, used like the std::vector it replaces.
struct ScratchBuf {
    float* p = nullptr;
    int64_t n = 0;
    float* data() const { return p; }
    size_t size() const { return static_cast<size_t>(n); }
    float& operator[](size_t i) const { return p[i]; }
};

ScratchBuf scratch(Scratch slot, int64_t n) {
    static thread_local std::vector<float> bufs[static_cast<int>(Scratch::kCount)];
    std::vector<float>& v = bufs[static_cast<int>(slot)];
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    return {v.data(), n};
}

struct Mlp {
    Linear gate, up, down;
};

struct Layer {
    int64_t index = 0;
    int moe_index = -1;  // among the MoE layers (expert parallelism's placements)
    std::vector<float> input_norm, post_norm;
    Linear q_a, q_b, q;  // q_a/q_b with q_lora, else q
    std::vector<float> q_a_norm;
    Linear kv_a;
    std::vector<float> kv_a_norm;
    std::vector<float> kv_b;  // [heads * (nope + v), kv_lora] dequantised for attention
    // kernels/ path: per head W_kb^T [kv_lora, nope] (query absorption) and W_vb
    // [v, kv_lora] (value up-projection), packed f32.
    std::vector<kernels::PackedMatrix> kb_t, vb;
    Linear o;
    bool moe = false;
    Mlp dense;
    Linear gate;
    std::vector<float> gate_bias;  // noaux_tc only
    std::vector<Mlp> experts;      // by expert id; with expert parallelism by local slot
    bool has_shared = false;
    Mlp shared;
};

// Where each token of a (possibly multi-sequence) batch sits: its position and the
// KV cache of its sequence.
struct TokenSlots {
    std::vector<int64_t> pos;
    std::vector<KvCache*> cache;
    int64_t size() const { return static_cast<int64_t>(pos.size()); }
};

// MLA sizes: heads, q/k nope and rope dims, q/k head dim, v head dim, kv_lora.
struct MlaDims {
    int64_t nh, nope, rd, qk, vd, lora;
};

MlaDims mla_dims(const ModelConfig& c) {
    return {c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim,
            c.qk_head_dim(),       c.v_head_dim,       c.kv_lora_rank};
}

struct Mtp {
    WeightMatrix embed;
    Linear eh_proj, head;
    std::vector<float> enorm, hnorm, head_norm;
    Layer block;
};

}  // namespace

struct DeepseekModel::Impl {
    std::unique_ptr<WeightSource> source;
    ModelConfig cfg;
    std::unique_ptr<ThreadPool> pool;
    WeightMatrix embed;
    std::vector<Layer> layers;
    std::vector<float> final_norm;
    Linear lm_head;
    std::optional<Mtp> mtp;
    bool reference_kernels = false;
    kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
    internal::ClassFormats class_format;
    std::vector<double> inv_freq;
    double rope_factor = 1.0;
    float softmax_scale = 1.0f;
    std::vector<size_t> moe_layers;  // index into `layers` of each MoE layer

    Status load_layer(int64_t i, Layer& layer);
    Status load_mlp(const std::string& prefix, int64_t inter, WeightClass cls, Mlp& mlp);
    Status load_linear(const std::string& name, int64_t rows, int64_t cols, WeightClass cls,
                       Linear& out);
    Status pack(WeightClass cls, Linear& lin);

    // Y[t, r] = W[r, :] . X[t, :] for t < T: kernels/ on the packed weights, or the
    // reference loop.
    void matmul(const Linear& w, const float* x, int64_t num_tokens, float* y);
    void matmul_reference(const WeightMatrix& w, const float* x, int64_t num_tokens, float* y);
    void embed_rows(const WeightMatrix& table, std::span<const int32_t> tokens, float* x);
    void rms_norm(const float* x, const std::vector<float>& w, int64_t num_tokens, int64_t dim,
                  float* y) const;
    void rope(float* v, int64_t pos) const;
    void attention(const Layer& layer, const float* h, const TokenSlots& slots, float* out);
    // Writes the layer's KV rows of the normed inputs `h` [T, hidden] at their slots
    // (kv_a, its norm, rope on the rope part, the cache's dtype): attention's first half.
    void write_kv_rows(const Layer& layer, const float* h, const TokenSlots& slots);
    // After the KV rows are written: absorbed MLA on kernels/ (attention.h), or the
    // reference loop. q: [T, heads, qk] with rope applied; attn: [T, heads, v].
    void attend_kernels(const Layer& layer, const float* q, const TokenSlots& slots, float* attn);
    void attend_reference(const Layer& layer, const float* q, const TokenSlots& slots, float* attn);
    void mlp(const Mlp& m, const float* h, int64_t num_tokens, float* out);
    void moe(const Layer& layer, const float* h, int64_t num_tokens, float* out);
    // moe() with the routed experts spread over the group (model/expert_parallel.h);
    // num_tokens may be 0 (a rank joining its peers' step).
    Status moe_ep(const Layer& layer, const float* h, int64_t num_tokens, float* out);
    // `logits`: the router's E raw scores for one token.
    void route(const float* logits, const Layer& layer, std::vector<int32_t>& ids,
               std::vector<float>& weights);
    Status block(const Layer& layer, float* x, const TokenSlots& slots);
    // x[t * H + i] += y[t * H + i] for t < T, rows over the pool.
    void add_rows(float* x, const float* y, int64_t T, int64_t H);

    // Expert parallelism (model/internal/ep_host.h): the group, failover, live EPLB's
    // moves of `experts` (by local slot); null without --ep. The last member: destroyed
    // first, it joins a background weight load that reads the members above.
    std::unique_ptr<internal::EpExperts<Mlp>> ep;
    bool grouped() const { return ep != nullptr && ep->grouped(); }
};

Status DeepseekModel::Impl::pack(WeightClass cls, Linear& lin) {
    if (reference_kernels) return Status::ok();
    return internal::pack_linear(class_format, cls, lin);
}

Status DeepseekModel::Impl::load_linear(const std::string& name, int64_t rows, int64_t cols,
                                        WeightClass cls, Linear& out) {
    DSI_ASSIGN_OR_RETURN(out.w, source->matrix(name, rows, cols));
    return pack(cls, out);
}

Status DeepseekModel::Impl::load_mlp(const std::string& p, int64_t inter, WeightClass cls, Mlp& m) {
    const int64_t H = cfg.hidden_size;
    DSI_RETURN_IF_ERROR(load_linear(p + "gate_proj.weight", inter, H, cls, m.gate));
    DSI_RETURN_IF_ERROR(load_linear(p + "up_proj.weight", inter, H, cls, m.up));
    DSI_RETURN_IF_ERROR(load_linear(p + "down_proj.weight", H, inter, cls, m.down));
    return Status::ok();
}

Status DeepseekModel::Impl::load_layer(int64_t i, Layer& L) {
    const ModelConfig& c = cfg;
    const int64_t H = c.hidden_size;
    const int64_t nh = c.num_attention_heads;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    L.index = i;
    DSI_ASSIGN_OR_RETURN(L.input_norm, source->vector(p + "input_layernorm.weight", H));
    DSI_ASSIGN_OR_RETURN(L.post_norm, source->vector(p + "post_attention_layernorm.weight", H));
    if (c.q_lora_rank > 0) {
        DSI_RETURN_IF_ERROR(load_linear(p + "self_attn.q_a_proj.weight", c.q_lora_rank, H,
                                        WeightClass::kAttn, L.q_a));
        DSI_ASSIGN_OR_RETURN(L.q_a_norm,
                             source->vector(p + "self_attn.q_a_layernorm.weight", c.q_lora_rank));
        DSI_RETURN_IF_ERROR(load_linear(p + "self_attn.q_b_proj.weight", nh * c.qk_head_dim(),
                                        c.q_lora_rank, WeightClass::kAttn, L.q_b));
    } else {
        DSI_RETURN_IF_ERROR(load_linear(p + "self_attn.q_proj.weight", nh * c.qk_head_dim(), H,
                                        WeightClass::kAttn, L.q));
    }
    DSI_RETURN_IF_ERROR(load_linear(p + "self_attn.kv_a_proj_with_mqa.weight",
                                    c.kv_lora_rank + c.qk_rope_head_dim, H, WeightClass::kAttn,
                                    L.kv_a));
    DSI_ASSIGN_OR_RETURN(L.kv_a_norm,
                         source->vector(p + "self_attn.kv_a_layernorm.weight", c.kv_lora_rank));
    const int64_t kvb_rows = nh * (c.qk_nope_head_dim + c.v_head_dim);
    DSI_ASSIGN_OR_RETURN(WeightMatrix kv_b, source->matrix(p + "self_attn.kv_b_proj.weight",
                                                           kvb_rows, c.kv_lora_rank));
    L.kv_b.resize(static_cast<size_t>(kvb_rows * c.kv_lora_rank));
    for (int64_t r = 0; r < kvb_rows; ++r)
        kv_b.dequantize_row(r, L.kv_b.data() + r * c.kv_lora_rank);
    if (!reference_kernels) {
        const int64_t nope = c.qk_nope_head_dim;
        const int64_t vd = c.v_head_dim;
        const int64_t lora = c.kv_lora_rank;
        std::vector<float> t(static_cast<size_t>(lora * nope));
        for (int64_t hd = 0; hd < nh; ++hd) {
            const float* w = L.kv_b.data() + hd * (nope + vd) * lora;
            for (int64_t d = 0; d < nope; ++d) {
                for (int64_t k = 0; k < lora; ++k) t[k * nope + d] = w[d * lora + k];
            }
            kernels::SourceMatrix kb{DType::kF32, lora, nope,
                                     reinterpret_cast<const uint8_t*>(t.data())};
            DSI_ASSIGN_OR_RETURN(kernels::PackedMatrix pk,
                                 kernels::pack_matrix(kb, kernels::WeightFormat::kF32));
            L.kb_t.push_back(std::move(pk));
            kernels::SourceMatrix vb{DType::kF32, vd, lora,
                                     reinterpret_cast<const uint8_t*>(w + nope * lora)};
            DSI_ASSIGN_OR_RETURN(kernels::PackedMatrix pv,
                                 kernels::pack_matrix(vb, kernels::WeightFormat::kF32));
            L.vb.push_back(std::move(pv));
        }
    }
    DSI_RETURN_IF_ERROR(
        load_linear(p + "self_attn.o_proj.weight", H, nh * c.v_head_dim, WeightClass::kAttn, L.o));
    L.moe = c.is_moe_layer(i);
    if (L.moe && i < c.num_hidden_layers) {
        L.moe_index = static_cast<int>(moe_layers.size());
        moe_layers.push_back(static_cast<size_t>(i));
    }
    if (!L.moe) return load_mlp(p + "mlp.", c.intermediate_size, WeightClass::kMlp, L.dense);
    DSI_RETURN_IF_ERROR(
        load_linear(p + "mlp.gate.weight", c.n_routed_experts, H, WeightClass::kRouter, L.gate));
    if (c.topk_method == TopkMethod::kNoauxTc) {
        DSI_ASSIGN_OR_RETURN(L.gate_bias, source->vector(p + "mlp.gate.e_score_correction_bias",
                                                         c.n_routed_experts));
    }
    // With expert parallelism only this rank's slots (the other experts' bytes are never
    // read, so a mapped checkpoint does not even page them in).
    std::vector<int> held(static_cast<size_t>(c.n_routed_experts));
    std::iota(held.begin(), held.end(), 0);
    if (ep != nullptr) held = ep->held(L.moe_index);
    L.experts.resize(held.size());
    for (size_t slot = 0; slot < held.size(); ++slot) {
        if (held[slot] < 0) continue;  // an empty slot receives no rows
        DSI_RETURN_IF_ERROR(load_mlp(p + "mlp.experts." + std::to_string(held[slot]) + ".",
                                     c.moe_intermediate_size, WeightClass::kExperts,
                                     L.experts[slot]));
    }
    if (c.n_shared_experts > 0) {
        L.has_shared = true;
        DSI_RETURN_IF_ERROR(load_mlp(p + "mlp.shared_experts.",
                                     c.n_shared_experts * c.moe_intermediate_size,
                                     WeightClass::kShared, L.shared));
    }
    return Status::ok();
}

void DeepseekModel::Impl::matmul(const Linear& w, const float* x, int64_t num_tokens, float* y) {
    if (w.is_packed) {
        kernels::matmul(w.packed, x, num_tokens, y, pool.get());
    } else {
        matmul_reference(w.w, x, num_tokens, y);
    }
}

void DeepseekModel::Impl::matmul_reference(const WeightMatrix& w, const float* x,
                                           int64_t num_tokens, float* y) {
    const int64_t rows = w.rows;
    const int64_t cols = w.cols;
    pool->parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = begin; r < end; ++r) {
            w.dequantize_row(r, row.data());
            for (int64_t t = 0; t < num_tokens; ++t) {
                y[t * rows + r] = dot(row.data(), x + t * cols, cols);
            }
        }
    });
}

void DeepseekModel::Impl::embed_rows(const WeightMatrix& table, std::span<const int32_t> tokens,
                                     float* x) {
    for (size_t t = 0; t < tokens.size(); ++t) {
        table.dequantize_row(tokens[t], x + static_cast<int64_t>(t) * table.cols);
    }
}

void DeepseekModel::Impl::rms_norm(const float* x, const std::vector<float>& w, int64_t num_tokens,
                                   int64_t dim, float* y) const {
    const float eps = static_cast<float>(cfg.rms_norm_eps);
    if (!reference_kernels) {
        // Row by row, rows over the pool (each row's bits depend on that row only).
        const kernels::Isa isa = kernels::active_isa();
        pool->parallel_for(num_tokens, 8, [&](int64_t tb, int64_t te) {
            for (int64_t t = tb; t < te; ++t) {
                kernels::rms_norm(isa, x + t * dim, w.data(), dim, eps, y + t * dim);
            }
        });
        return;
    }
    for (int64_t t = 0; t < num_tokens; ++t) {
        const float* xt = x + t * dim;
        float ss = dot(xt, xt, dim);
        float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
        for (int64_t i = 0; i < dim; ++i) y[t * dim + i] = xt[i] * inv * w[i];
    }
}

// Rotates adjacent pairs (2i, 2i+1) by pos * inv_freq[i]: the layout DeepSeek's
// weights are stored in (HF de-interleaves and rotates halves, which gives the
// same dot products).
void DeepseekModel::Impl::rope(float* v, int64_t pos) const {
    for (size_t i = 0; i < inv_freq.size(); ++i) {
        double angle = static_cast<double>(pos) * inv_freq[i];
        float c = static_cast<float>(std::cos(angle) * rope_factor);
        float s = static_cast<float>(std::sin(angle) * rope_factor);
        float a = v[2 * i];
        float b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
    }
}

void DeepseekModel::Impl::attention(const Layer& L, const float* h, const TokenSlots& slots,
                                    float* out) {
    const int64_t T = slots.size();
    const ModelConfig& c = cfg;
    const int64_t H = c.hidden_size;
    // Plain copies, not a structured binding: clang 14 does not let lambdas capture one.
    const MlaDims dims = mla_dims(c);
    [[maybe_unused]] const int64_t nh = dims.nh, nope = dims.nope, rd = dims.rd, qk = dims.qk,
                                   vd = dims.vd, lora = dims.lora;

    const ScratchBuf q = scratch(Scratch::kAttnQ, T * nh * qk);
    if (c.q_lora_rank > 0) {
        const ScratchBuf qa = scratch(Scratch::kAttnQa, T * c.q_lora_rank);
        matmul(L.q_a, h, T, qa.data());
        rms_norm(qa.data(), L.q_a_norm, T, c.q_lora_rank, qa.data());
        matmul(L.q_b, qa.data(), T, q.data());
    } else {
        matmul(L.q, h, T, q.data());
    }
    write_kv_rows(L, h, slots);
    if (reference_kernels) {
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t hd = 0; hd < nh; ++hd)
                rope(q.data() + (t * nh + hd) * qk + nope, slots.pos[t]);
        }
    } else {
        const kernels::Isa isa = kernels::active_isa();
        const int64_t pairs = static_cast<int64_t>(inv_freq.size());
        std::vector<float> cc(static_cast<size_t>(2 * pairs)), ss(static_cast<size_t>(2 * pairs));
        for (int64_t t = 0; t < T; ++t) {
            kernels::rope_table(slots.pos[t], inv_freq.data(), pairs, rope_factor, cc.data(),
                                ss.data());
            kernels::rope_apply(isa, q.data() + t * nh * qk + nope, nh, qk, cc.data(), ss.data(),
                                pairs);
        }
    }
    const ScratchBuf attn = scratch(Scratch::kAttnOut, T * nh * vd);
    if (reference_kernels) {
        attend_reference(L, q.data(), slots, attn.data());
    } else {
        attend_kernels(L, q.data(), slots, attn.data());
    }
    (void)H;
    matmul(L.o, attn.data(), T, out);
}

void DeepseekModel::Impl::write_kv_rows(const Layer& L, const float* h, const TokenSlots& slots) {
    const int64_t T = slots.size();
    const MlaDims dims = mla_dims(cfg);
    const int64_t rd = dims.rd, lora = dims.lora;
    const ScratchBuf kv = scratch(Scratch::kKvA, T * (lora + rd));
    matmul(L.kv_a, h, T, kv.data());
    // The new rows are computed in f32 (in place for an f32 cache), then encoded into
    // the cache's dtype (S-ENG-9).
    const bool f32_kv = kv_dtype == kernels::KvDtype::kF32;
    std::vector<float> row_f32(f32_kv ? 0 : static_cast<size_t>(lora + rd));
    const kernels::Isa isa = kernels::active_isa();
    const int64_t pairs = static_cast<int64_t>(inv_freq.size());
    std::vector<float> cc(static_cast<size_t>(2 * pairs)), ss(static_cast<size_t>(2 * pairs));
    for (int64_t t = 0; t < T; ++t) {
        float* dst = slots.cache[t]->row(L.index, slots.pos[t]);
        float* row = f32_kv ? dst : row_f32.data();
        rms_norm(kv.data() + t * (lora + rd), L.kv_a_norm, 1, lora, row);
        std::copy_n(kv.data() + t * (lora + rd) + lora, rd, row + lora);
        if (reference_kernels) {
            rope(row + lora, slots.pos[t]);
        } else {
            kernels::rope_table(slots.pos[t], inv_freq.data(), pairs, rope_factor, cc.data(),
                                ss.data());
            kernels::rope_apply(isa, row + lora, 1, rd, cc.data(), ss.data(), pairs);
        }
        if (!f32_kv) kernels::kv_encode_row(kv_dtype, row, lora + rd, dst);
    }
}

void DeepseekModel::Impl::attend_reference(const Layer& L, const float* q, const TokenSlots& slots,
                                           float* attn) {
    const int64_t T = slots.size();
    const ModelConfig& c = cfg;
    // Plain copies, not a structured binding: clang 14 does not let lambdas capture one.
    const MlaDims dims = mla_dims(c);
    [[maybe_unused]] const int64_t nh = dims.nh, nope = dims.nope, rd = dims.rd, qk = dims.qk,
                                   vd = dims.vd, lora = dims.lora;
    pool->parallel_for(T * nh, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> q_lat(static_cast<size_t>(lora));
        std::vector<float> o_lat(static_cast<size_t>(lora));
        std::vector<float> scores;
        std::vector<float> decoded(static_cast<size_t>(lora + rd));
        // The row of position s as f32 (decoded when the cache holds bf16 / e4m3).
        auto cached = [&](KvCache& cache, int64_t s) -> const float* {
            const float* row = cache.row(L.index, s);
            if (kv_dtype == kernels::KvDtype::kF32) return row;
            kernels::kv_decode_row(kv_dtype, row, lora + rd, decoded.data());
            return decoded.data();
        };
        for (int64_t th = begin; th < end; ++th) {
            const int64_t t = th / nh;
            const int64_t hd = th % nh;
            const int64_t pos = slots.pos[t];
            KvCache& cache = *slots.cache[t];
            const float* qh = q + th * qk;
            const float* kvb = L.kv_b.data() + hd * (nope + vd) * lora;
            // Absorb W_kb into the query: q_lat = sum_d q_nope[d] * W_kb[d, :].
            std::fill(q_lat.begin(), q_lat.end(), 0.0f);
            for (int64_t d = 0; d < nope; ++d) axpy(qh[d], kvb + d * lora, q_lat.data(), lora);
            scores.resize(static_cast<size_t>(pos + 1));
            float max_score = -INFINITY;
            for (int64_t s = 0; s <= pos; ++s) {
                const float* row = cached(cache, s);
                float sc =
                    (dot(q_lat.data(), row, lora) + dot(qh + nope, row + lora, rd)) * softmax_scale;
                scores[s] = sc;
                max_score = std::max(max_score, sc);
            }
            float sum = 0.0f;
            for (int64_t s = 0; s <= pos; ++s) {
                scores[s] = std::exp(scores[s] - max_score);
                sum += scores[s];
            }
            std::fill(o_lat.begin(), o_lat.end(), 0.0f);
            for (int64_t s = 0; s <= pos; ++s) {
                axpy(scores[s] / sum, cached(cache, s), o_lat.data(), lora);
            }
            float* oh = attn + th * vd;
            for (int64_t j = 0; j < vd; ++j)
                oh[j] = dot(kvb + (nope + j) * lora, o_lat.data(), lora);
        }
    });
}

void DeepseekModel::Impl::attend_kernels(const Layer& L, const float* q, const TokenSlots& slots,
                                         float* attn) {
    static_assert(KvCache::kLatentBlockTokens == kernels::kKvBlockTokens);
    const int64_t T = slots.size();
    const ModelConfig& c = cfg;
    // Plain copies, not a structured binding: clang 14 does not let lambdas capture one.
    const MlaDims dims = mla_dims(c);
    [[maybe_unused]] const int64_t nh = dims.nh, nope = dims.nope, rd = dims.rd, qk = dims.qk,
                                   vd = dims.vd, lora = dims.lora;
    // Absorb W_kb into the queries, one batch-invariant matmul per head:
    // q_lat[t, h] = W_kb[h]^T q_nope[t, h].
    // Head-major staging ([head][token][...]): each head's matmul reads and writes
    // contiguous rows; the copies in and out run over the pool, all heads at once.
    const ScratchBuf q_lat = scratch(Scratch::kQLat, T * nh * lora);
    const ScratchBuf xin = scratch(Scratch::kHeadIn, nh * T * std::max(nope, lora));
    const ScratchBuf yout = scratch(Scratch::kHeadOut, nh * T * std::max(lora, vd));
    // Rows of n floats: src[t * token_stride + hd * head_stride] -> dst[(hd * T + t) * n].
    auto to_heads = [&](const float* src, int64_t token_stride, int64_t head_stride, int64_t n,
                        float* dst) {
        pool->parallel_for(T, 16, [&](int64_t tb, int64_t te) {
            for (int64_t t = tb; t < te; ++t) {
                for (int64_t hd = 0; hd < nh; ++hd) {
                    std::copy_n(src + t * token_stride + hd * head_stride, n,
                                dst + (hd * T + t) * n);
                }
            }
        });
    };
    // And back: src[(hd * T + t) * n] -> dst[(t * nh + hd) * n].
    auto from_heads = [&](const float* src, int64_t n, float* dst) {
        pool->parallel_for(T, 16, [&](int64_t tb, int64_t te) {
            for (int64_t t = tb; t < te; ++t) {
                for (int64_t hd = 0; hd < nh; ++hd) {
                    std::copy_n(src + (hd * T + t) * n, n, dst + (t * nh + hd) * n);
                }
            }
        });
    };
    to_heads(q, nh * qk, qk, nope, xin.data());
    for (int64_t hd = 0; hd < nh; ++hd) {
        kernels::matmul(L.kb_t[hd], xin.data() + hd * T * nope, T, yout.data() + hd * T * lora,
                        pool.get());
    }
    from_heads(yout.data(), lora, q_lat.data());
    // One block table per sequence (tokens of a sequence share its cache), covering
    // the furthest position any of its tokens attends to.
    std::vector<KvCache*> caches;
    std::vector<int64_t> seq_of(static_cast<size_t>(T));
    std::vector<int64_t> max_pos;
    for (int64_t t = 0; t < T; ++t) {
        const auto it = std::find(caches.begin(), caches.end(), slots.cache[t]);
        const int64_t si = it - caches.begin();
        if (it == caches.end()) {
            caches.push_back(slots.cache[t]);
            max_pos.push_back(slots.pos[t]);
        }
        max_pos[si] = std::max(max_pos[si], slots.pos[t]);
        seq_of[t] = si;
    }
    std::vector<std::vector<const float*>> blocks(caches.size());
    std::vector<int64_t> strides(caches.size());
    for (size_t si = 0; si < caches.size(); ++si) {
        strides[si] = caches[si]->latent_blocks(L.index, max_pos[si] + 1, blocks[si]);
    }
    // Items of up to kTokensPerItem consecutive tokens of one sequence x a group of
    // heads: one mla_attention_tokens call reads the rows they share once. Each head's
    // result is the same whatever the grouping, chunking or thread
    // (kernels/attention.h), so prefill stays bitwise equal to decode-by-decode.
    constexpr int64_t kHeadsPerItem = 8;
    const int64_t heads_per_item = std::min(kHeadsPerItem, nh);
    const int64_t tokens_per_item =
        std::max<int64_t>(1, kernels::kMlaMaxQueriesPerPass / heads_per_item);
    struct Item {
        int64_t t0, num_tokens, h0;
    };
    std::vector<Item> items;
    for (int64_t t = 0; t < T;) {
        int64_t n = 1;
        while (t + n < T && n < tokens_per_item && seq_of[t + n] == seq_of[t]) ++n;
        for (int64_t h0 = 0; h0 < nh; h0 += heads_per_item) items.push_back({t, n, h0});
        t += n;
    }
    std::vector<int64_t> num_positions(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) num_positions[t] = slots.pos[t] + 1;
    const ScratchBuf o_lat = scratch(Scratch::kOLat, T * nh * lora);
    // Items alternate early and late tokens (0, n-1, 1, n-2, ...): a causal item costs
    // about its position, and the pool's chunks are static and contiguous, so in token
    // order one thread would get the cheap half (2 threads: 1/4 vs 3/4 of the work).
    const int64_t num_items = static_cast<int64_t>(items.size());
    std::vector<int64_t> order;
    order.reserve(items.size());
    for (int64_t lo = 0, hi = num_items - 1; lo <= hi; ++lo, --hi) {
        order.push_back(lo);
        if (hi != lo) order.push_back(hi);
    }
    pool->parallel_for(num_items, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const Item& it = items[static_cast<size_t>(order[static_cast<size_t>(i)])];
            const size_t si = static_cast<size_t>(seq_of[it.t0]);
            const kernels::LatentKvView view{blocks[si].data(), strides[si], kv_dtype};
            kernels::MlaTokens tk;
            tk.num_tokens = it.num_tokens;
            tk.num_positions = num_positions.data() + it.t0;
            tk.num_heads = std::min(heads_per_item, nh - it.h0);
            tk.q_lat = q_lat.data() + (it.t0 * nh + it.h0) * lora;
            tk.q_lat_token_stride = nh * lora;
            tk.q_pe = q + (it.t0 * nh + it.h0) * qk + nope;
            tk.q_pe_token_stride = nh * qk;
            tk.q_pe_stride = qk;
            tk.o_lat = o_lat.data() + (it.t0 * nh + it.h0) * lora;
            tk.o_lat_token_stride = nh * lora;
            kernels::mla_attention_tokens(kernels::active_isa(), view, lora, rd, softmax_scale, tk);
        }
    });
    // Value up-projection per head: attn[t, h] = W_vb[h] o_lat[t, h].
    to_heads(o_lat.data(), nh * lora, lora, lora, xin.data());
    for (int64_t hd = 0; hd < nh; ++hd) {
        kernels::matmul(L.vb[hd], xin.data() + hd * T * lora, T, yout.data() + hd * T * vd,
                        pool.get());
    }
    from_heads(yout.data(), vd, attn);
}

void DeepseekModel::Impl::mlp(const Mlp& m, const float* h, int64_t T, float* out) {
    const int64_t inter = m.gate.rows();
    const ScratchBuf g = scratch(Scratch::kMlpGate, T * inter);
    const ScratchBuf u = scratch(Scratch::kMlpUp, T * inter);
    matmul(m.gate, h, T, g.data());
    matmul(m.up, h, T, u.data());
    if (!reference_kernels) {
        // Element-wise: any split over the pool gives the same bits.
        const kernels::Isa isa = kernels::active_isa();
        pool->parallel_for(T, 8, [&](int64_t tb, int64_t te) {
            kernels::silu_mul(isa, g.data() + tb * inter, u.data() + tb * inter, (te - tb) * inter,
                              g.data() + tb * inter);
        });
    } else {
        for (size_t i = 0; i < g.size(); ++i) {
            float x = g[i];
            g[i] = x / (1.0f + std::exp(-x)) * u[i];
        }
    }
    matmul(m.down, g.data(), T, out);
}

// Chooses num_experts_per_tok experts for one token and their weights; `ids` comes
// back sorted by expert id so the MoE sum has one fixed order.
void DeepseekModel::Impl::route(const float* logits, const Layer& L, std::vector<int32_t>& ids,
                                std::vector<float>& weights) {
    const ModelConfig& c = cfg;
    const int64_t E = c.n_routed_experts;
    const int64_t k = c.num_experts_per_tok;
    std::vector<float> scores(logits, logits + E);
    if (c.scoring_func == ScoringFunc::kSoftmax) {
        float mx = *std::max_element(scores.begin(), scores.end());
        float sum = 0;
        for (float& s : scores) {
            s = std::exp(s - mx);
            sum += s;
        }
        for (float& s : scores) s /= sum;
    } else {
        for (float& s : scores) s = 1.0f / (1.0f + std::exp(-s));
    }
    // Selection scores: with noaux_tc the bias steers the choice, not the weights.
    std::vector<float> choice = scores;
    if (c.topk_method == TopkMethod::kNoauxTc) {
        for (int64_t e = 0; e < E; ++e) choice[e] += L.gate_bias[e];
    }
    std::vector<bool> allowed(static_cast<size_t>(E), true);
    if (c.topk_method != TopkMethod::kGreedy && c.n_group > 1) {
        const int64_t per = E / c.n_group;
        std::vector<float> group_score(static_cast<size_t>(c.n_group));
        for (int64_t g = 0; g < c.n_group; ++g) {
            std::vector<float> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
            std::sort(v.begin(), v.end(), std::greater<float>());
            // noaux_tc: sum of the top 2 per group; group_limited_greedy: the max.
            group_score[g] =
                c.topk_method == TopkMethod::kNoauxTc ? v[0] + (per > 1 ? v[1] : 0.0f) : v[0];
        }
        std::vector<int64_t> order(static_cast<size_t>(c.n_group));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
        std::fill(allowed.begin(), allowed.end(), false);
        for (int64_t gi = 0; gi < c.topk_group; ++gi) {
            for (int64_t e = order[gi] * per; e < (order[gi] + 1) * per; ++e) allowed[e] = true;
        }
    }
    std::vector<int32_t> order;
    for (int64_t e = 0; e < E; ++e) {
        if (allowed[e]) order.push_back(static_cast<int32_t>(e));
    }
    // Top-k by selection score; ties go to the lower expert id.
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
    ids.assign(order.begin(), order.begin() + k);
    std::sort(ids.begin(), ids.end());
    weights.resize(static_cast<size_t>(k));
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) {
        weights[j] = scores[ids[j]];
        sum += weights[j];
    }
    if (c.norm_topk_prob && k > 1) {
        for (float& w : weights) w /= sum + 1e-20f;
    }
    for (float& w : weights) w *= static_cast<float>(c.routed_scaling_factor);
}

void DeepseekModel::Impl::moe(const Layer& L, const float* h, int64_t T, float* out) {
    const ModelConfig& c = cfg;
    const int64_t H = c.hidden_size;
    const int64_t E = c.n_routed_experts;
    const int64_t k = c.num_experts_per_tok;
    std::vector<std::vector<int32_t>> ids(static_cast<size_t>(T));
    std::vector<std::vector<float>> weights(static_cast<size_t>(T));
    std::vector<float> gate_logits(static_cast<size_t>(T * E));
    matmul(L.gate, h, T, gate_logits.data());
    for (int64_t t = 0; t < T; ++t) route(gate_logits.data() + t * E, L, ids[t], weights[t]);
    // Group tokens by expert: expert e's rows are [first[e], first[e + 1]) of one
    // expert-major buffer, its tokens in increasing order; row_of[t * k + j] is the row
    // holding token t's j-th expert (ids are sorted, so each token's routed outputs are
    // summed in expert-id order and its result does not depend on its batch).
    std::vector<int64_t> first(static_cast<size_t>(E + 1), 0);
    for (int64_t t = 0; t < T; ++t) {
        for (int32_t e : ids[t]) ++first[e + 1];
    }
    for (int64_t e = 0; e < E; ++e) first[e + 1] += first[e];
    std::vector<int64_t> row_of(static_cast<size_t>(T * k));
    std::vector<int64_t> token_of_row(static_cast<size_t>(T * k));
    {
        std::vector<int64_t> next(first.begin(), first.end() - 1);
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t j = 0; j < k; ++j) {
                const int64_t r = next[ids[t][j]]++;
                row_of[t * k + j] = r;
                token_of_row[r] = t;
            }
        }
    }
    // Gather, the experts' MLPs, then each token's weighted sum: copies and sums are
    // spread over the pool by row / token (each element's operations stay the same).
    const ScratchBuf xin = scratch(Scratch::kMoeIn, T * k * H);
    const ScratchBuf y = scratch(Scratch::kMoeOut, T * k * H);
    pool->parallel_for(T * k, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            std::copy_n(h + token_of_row[r] * H, H, xin.data() + r * H);
        }
    });
    for (int64_t e = 0; e < E; ++e) {
        const int64_t n = first[e + 1] - first[e];
        if (n == 0) continue;
        mlp(L.experts[e], xin.data() + first[e] * H, n, y.data() + first[e] * H);
    }
    const ScratchBuf s = L.has_shared ? scratch(Scratch::kMoeShared, T * H) : ScratchBuf{};
    if (L.has_shared) mlp(L.shared, h, T, s.data());
    pool->parallel_for(T, 4, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            float* o = out + t * H;
            std::fill(o, o + H, 0.0f);
            for (int64_t j = 0; j < k; ++j) {
                axpy(weights[t][j], y.data() + row_of[t * k + j] * H, o, H);
            }
            if (s.data() != nullptr) {
                for (int64_t i = 0; i < H; ++i) o[i] += s[t * H + i];
            }
        }
    });
}

Status DeepseekModel::Impl::moe_ep(const Layer& L, const float* h, int64_t T, float* out) {
    const ModelConfig& c = cfg;
    const int64_t H = c.hidden_size;
    const int64_t E = c.n_routed_experts;
    const int64_t k = c.num_experts_per_tok;
    std::vector<int32_t> ids(static_cast<size_t>(T * k));
    std::vector<float> gate(static_cast<size_t>(T * k));
    if (T > 0) {
        std::vector<float> gate_logits(static_cast<size_t>(T * E));
        matmul(L.gate, h, T, gate_logits.data());
        std::vector<int32_t> tid;
        std::vector<float> tw;
        for (int64_t t = 0; t < T; ++t) {
            route(gate_logits.data() + t * E, L, tid, tw);
            std::copy(tid.begin(), tid.end(), ids.begin() + t * k);
            std::copy(tw.begin(), tw.end(), gate.begin() + t * k);
        }
    }
    // The combine sums each token's experts in k order (ids ascending) from +0.0f, as
    // moe() does: the same bits wherever the experts ran (S-ENG-2, docs/comm.md).
    DSI_RETURN_IF_ERROR(ep->moe(L.moe_index, std::span<const float>(h, static_cast<size_t>(T * H)),
                                T, ids, gate, std::span<float>(out, static_cast<size_t>(T * H))));
    if (L.has_shared && T > 0) {
        std::vector<float> s(static_cast<size_t>(T * H));
        mlp(L.shared, h, T, s.data());
        for (int64_t i = 0; i < T * H; ++i) out[i] += s[i];
    }
    return Status::ok();
}

Status DeepseekModel::Impl::block(const Layer& L, float* x, const TokenSlots& slots) {
    const int64_t T = slots.size();
    const int64_t H = cfg.hidden_size;
    const ScratchBuf h = scratch(Scratch::kBlockH, T * H);
    const ScratchBuf y = scratch(Scratch::kBlockY, T * H);
    if (T > 0) {
        rms_norm(x, L.input_norm, T, H, h.data());
        attention(L, h.data(), slots, y.data());
        add_rows(x, y.data(), T, H);
        rms_norm(x, L.post_norm, T, H, h.data());
    }
    if (L.moe && grouped()) {
        DSI_RETURN_IF_ERROR(moe_ep(L, h.data(), T, y.data()));
    } else if (L.moe) {
        moe(L, h.data(), T, y.data());
    } else if (T > 0) {
        mlp(L.dense, h.data(), T, y.data());
    }
    add_rows(x, y.data(), T, H);
    return Status::ok();
}

void DeepseekModel::Impl::add_rows(float* x, const float* y, int64_t T, int64_t H) {
    pool->parallel_for(T, 8, [&](int64_t tb, int64_t te) {
        for (int64_t i = tb * H; i < te * H; ++i) x[i] += y[i];
    });
}

DeepseekModel::DeepseekModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeepseekModel::~DeepseekModel() = default;

const ModelConfig& DeepseekModel::config() const { return impl_->cfg; }
int64_t DeepseekModel::kv_row_floats() const {
    return kernels::kv_row_words(impl_->kv_dtype,
                                 impl_->cfg.kv_lora_rank + impl_->cfg.qk_rope_head_dim);
}
kernels::KvDtype DeepseekModel::kv_dtype() const { return impl_->kv_dtype; }
int64_t DeepseekModel::kv_num_layers() const {
    return impl_->cfg.num_hidden_layers + (impl_->mtp ? 1 : 0);
}
KvLayout DeepseekModel::kv_layout() const {
    KvLayout layout;
    layout.groups.push_back(KvGroupLayout{"mla", kv_num_layers(), 1, kv_row_floats()});
    return layout;
}
std::unique_ptr<KvCache> DeepseekModel::new_kv_cache(int64_t capacity) const {
    return std::make_unique<ContiguousKvCache>(kv_num_layers(), kv_row_floats(), capacity);
}

Result<std::unique_ptr<DeepseekModel>> DeepseekModel::load(std::unique_ptr<WeightSource> source,
                                                           Options options) {
    auto impl = std::make_unique<Impl>();
    impl->cfg = source->config();
    if (impl->cfg.v4_layout()) {
        return unimplemented(source->description() + ": " + impl->cfg.architecture +
                             " runs through DeepseekV4Model / DeepseekV41Model "
                             "(model/deepseek_v4.h, deepseek_v41.h; load_causal_lm picks it)");
    }
    DSI_RETURN_IF_ERROR(impl->cfg.validate());
    if (options.expert_parallel.enabled()) {
        // Joined before the weights load: a rank whose load fails leaves the group at
        // once, so its peers fail fast instead of at their attach deadline.
        Impl& m = *impl;
        impl->ep = std::make_unique<internal::EpExperts<Mlp>>(
            [&m](int l) -> std::vector<Mlp>& { return m.layers[m.moe_layers[l]].experts; },
            [&m](int l, int e, Mlp& out) {
                const std::string prefix = "model.layers." + std::to_string(m.moe_layers[l]) +
                                           ".mlp.experts." + std::to_string(e) + ".";
                return m.load_mlp(prefix, m.cfg.moe_intermediate_size, WeightClass::kExperts, out);
            });
        DSI_RETURN_IF_ERROR(impl->ep->join(
            options.expert_parallel, impl->cfg,
            [&m](int l, int slot, const float* x, int64_t rows, float* y) {
                m.mlp(m.layers[m.moe_layers[l]].experts[static_cast<size_t>(slot)], x, rows, y);
            }));
    }
    impl->source = std::move(source);
    impl->pool = std::make_unique<ThreadPool>(options.num_threads);
    impl->reference_kernels = options.reference_kernels;
    DSI_RETURN_IF_ERROR(internal::parse_weight_formats(options.weight_format, impl->class_format));
    const ModelConfig& c = impl->cfg;
    if (!kernels::parse_kv_dtype(options.kv_dtype.c_str(), &impl->kv_dtype)) {
        return invalid_argument("kv dtype '" + options.kv_dtype + "' (f32, bf16, e4m3)");
    }
    if (impl->kv_dtype == kernels::KvDtype::kE4m3 &&
        (c.kv_lora_rank % 16 != 0 || c.qk_rope_head_dim % 16 != 0)) {
        return invalid_argument(
            "kv dtype e4m3 needs kv_lora_rank and qk_rope_head_dim "
            "multiples of 16 (one scale per 16 values)");
    }
    WeightSource& src = *impl->source;
    const int64_t H = c.hidden_size;
    DSI_ASSIGN_OR_RETURN(impl->embed, src.matrix("model.embed_tokens.weight", c.vocab_size, H));
    impl->layers.resize(static_cast<size_t>(c.num_hidden_layers));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        DSI_RETURN_IF_ERROR(impl->load_layer(i, impl->layers[i]));
    }
    DSI_ASSIGN_OR_RETURN(impl->final_norm, src.vector("model.norm.weight", H));
    if (c.tie_word_embeddings) {
        impl->lm_head.w = impl->embed;
        DSI_RETURN_IF_ERROR(impl->pack(WeightClass::kHead, impl->lm_head));
    } else {
        DSI_RETURN_IF_ERROR(impl->load_linear("lm_head.weight", c.vocab_size, H, WeightClass::kHead,
                                              impl->lm_head));
    }
    const std::string mtp_prefix = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    // Expert parallelism leaves the MTP layer out: its MoE would be a collective of its own.
    if (c.num_nextn_predict_layers > 0 && src.has(mtp_prefix + "eh_proj.weight") &&
        impl->ep == nullptr) {
        Mtp m;
        DSI_ASSIGN_OR_RETURN(m.embed,
                             src.matrix(mtp_prefix + "embed_tokens.weight", c.vocab_size, H));
        DSI_RETURN_IF_ERROR(impl->load_linear(mtp_prefix + "eh_proj.weight", H, 2 * H,
                                              WeightClass::kHead, m.eh_proj));
        DSI_ASSIGN_OR_RETURN(m.enorm, src.vector(mtp_prefix + "enorm.weight", H));
        DSI_ASSIGN_OR_RETURN(m.hnorm, src.vector(mtp_prefix + "hnorm.weight", H));
        DSI_ASSIGN_OR_RETURN(m.head_norm, src.vector(mtp_prefix + "shared_head.norm.weight", H));
        DSI_RETURN_IF_ERROR(impl->load_linear(mtp_prefix + "shared_head.head.weight", c.vocab_size,
                                              H, WeightClass::kHead, m.head));
        DSI_RETURN_IF_ERROR(impl->load_layer(c.num_hidden_layers, m.block));
        impl->mtp = std::move(m);
    }
    impl->inv_freq = c.rope_inv_freq();
    impl->rope_factor = c.rope_attention_factor();
    impl->softmax_scale = static_cast<float>(c.softmax_scale());
    return std::unique_ptr<DeepseekModel>(new DeepseekModel(std::move(impl)));
}

Status DeepseekModel::forward(std::span<const int32_t> tokens, int64_t start_pos, KvCache& cache,
                              bool all_logits, ForwardOutput& out) {
    SequenceStep step{tokens, start_pos, &cache, all_logits};
    BatchOutput batch;
    DSI_RETURN_IF_ERROR(forward_batch(std::span<const SequenceStep>(&step, 1), batch));
    out.logits = std::move(batch.logits);
    out.hidden = std::move(batch.hidden);
    return Status::ok();
}

namespace {

Status forward_batch_impl(DeepseekModel::Impl& m, std::span<const SequenceStep> steps,
                          BatchOutput& out) {
    const ModelConfig& c = m.cfg;
    const int64_t H = c.hidden_size;
    if (steps.empty()) return invalid_argument("forward: empty batch");
    TokenSlots slots;
    std::vector<int32_t> tokens;
    out.logit_row.clear();
    std::vector<int64_t> logit_tokens;  // batch token index of each logits row
    for (size_t i = 0; i < steps.size(); ++i) {
        const SequenceStep& st = steps[i];
        const int64_t T = static_cast<int64_t>(st.tokens.size());
        if (T == 0)
            return invalid_argument("forward: sequence " + std::to_string(i) + " has no tokens");
        if (st.cache == nullptr)
            return invalid_argument("forward: sequence " + std::to_string(i) + " has no KV cache");
        for (int32_t t : st.tokens) {
            if (t < 0 || t >= c.vocab_size) {
                return invalid_argument("forward: token id " + std::to_string(t) +
                                        " outside the vocabulary [0, " +
                                        std::to_string(c.vocab_size) + ")");
            }
        }
        if (st.start_pos < 0 || st.start_pos + T > st.cache->capacity()) {
            return out_of_range("forward: positions [" + std::to_string(st.start_pos) + ", " +
                                std::to_string(st.start_pos + T) + ") exceed the KV capacity " +
                                std::to_string(st.cache->capacity()));
        }
        for (size_t j = 0; j < i; ++j) {
            if (steps[j].cache == st.cache) {
                return invalid_argument("forward: two batch entries share one KV cache");
            }
        }
        out.logit_row.push_back(static_cast<int64_t>(logit_tokens.size()));
        for (int64_t t = 0; t < T; ++t) {
            const int64_t index = static_cast<int64_t>(tokens.size());
            tokens.push_back(st.tokens[t]);
            slots.pos.push_back(st.start_pos + t);
            slots.cache.push_back(st.cache);
            if (st.all_logits || t == T - 1) logit_tokens.push_back(index);
        }
    }
    const int64_t N = slots.size();
    if (m.grouped()) DSI_RETURN_IF_ERROR(m.ep->begin_pass(N));
    std::vector<float> x(static_cast<size_t>(N * H));
    m.embed_rows(m.embed, tokens, x.data());
    for (const Layer& layer : m.layers) DSI_RETURN_IF_ERROR(m.block(layer, x.data(), slots));
    out.hidden.resize(static_cast<size_t>(N * H));
    m.rms_norm(x.data(), m.final_norm, N, H, out.hidden.data());
    const int64_t rows = static_cast<int64_t>(logit_tokens.size());
    std::vector<float> hin(static_cast<size_t>(rows * H));
    for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(out.hidden.data() + logit_tokens[r] * H, H, hin.data() + r * H);
    }
    out.logits.resize(static_cast<size_t>(rows * c.vocab_size));
    m.matmul(m.lm_head, hin.data(), rows, out.logits.data());
    return Status::ok();
}

}  // namespace

Status DeepseekModel::forward_batch(std::span<const SequenceStep> steps, BatchOutput& out) {
    Status s = forward_batch_impl(*impl_, steps, out);
    // With expert parallelism any failure (bad input here, or a peer's that no failover
    // could mend) ends this rank's membership: its peers must not wait for a collective
    // it will not join.
    if (!s.is_ok() && impl_->ep != nullptr) impl_->ep->abandon();
    return s;
}

std::optional<ExpertParallelStats> DeepseekModel::expert_parallel_stats(size_t max_windows) const {
    return internal::group_stats(impl_->ep.get(), max_windows);
}

Result<CausalLm::GroupStep> DeepseekModel::group_idle_step(bool leaving) {
    return internal::group_idle_step(impl_->ep.get(), leaving);
}

Status DeepseekModel::mtp_forward(std::span<const int32_t> next_tokens,
                                  std::span<const float> hidden, int64_t start_pos, KvCache& cache,
                                  std::vector<float>& logits, std::vector<float>* mtp_hidden,
                                  int64_t logit_rows) {
    const int64_t T = static_cast<int64_t>(next_tokens.size());
    MtpStep step{next_tokens, hidden, start_pos, &cache, logit_rows < 0 ? T : logit_rows};
    MtpBatchOutput out;
    DSI_RETURN_IF_ERROR(mtp_forward_batch(std::span<const MtpStep>(&step, 1), out));
    logits = std::move(out.logits);
    if (mtp_hidden != nullptr) *mtp_hidden = std::move(out.hidden);
    return Status::ok();
}

struct MtpDraftHead::Weights {
    Linear head;
    std::vector<uint8_t> rows;  // the selected rows' bytes (w.data points here)
};

MtpDraftHead::MtpDraftHead(std::vector<int32_t> ids, std::unique_ptr<Weights> w)
    : ids_(std::move(ids)), w_(std::move(w)) {}
MtpDraftHead::~MtpDraftHead() = default;

Result<std::unique_ptr<const MtpDraftHead>> DeepseekModel::make_mtp_draft_head(
    std::span<const int32_t> ids) const {
    Impl& m = *impl_;
    if (!m.mtp) return failed_precondition("draft vocabulary: the checkpoint has no MTP layer");
    const int64_t V = m.cfg.vocab_size;
    if (ids.empty()) return invalid_argument("draft vocabulary: no token ids");
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= V || (i > 0 && ids[i] <= ids[i - 1])) {
            return invalid_argument("draft vocabulary: ids must increase strictly within [0, " +
                                    std::to_string(V) + "); entry " + std::to_string(i) + " is " +
                                    std::to_string(ids[i]));
        }
    }
    const WeightMatrix& src = m.mtp->head.w;
    auto w = std::make_unique<MtpDraftHead::Weights>();
    WeightMatrix& dst = w->head.w;
    dst.rows = static_cast<int64_t>(ids.size());
    dst.cols = src.cols;
    if (src.block_scale == nullptr) {
        // Rows are contiguous in every stored format without block scales: copy them
        // as stored, so a draft logit is the full head's logit of that token.
        dst.dtype = src.dtype;
        const int64_t rb = src.row_bytes();
        w->rows.resize(static_cast<size_t>(rb) * ids.size());
        for (size_t i = 0; i < ids.size(); ++i) {
            std::copy_n(src.data + ids[i] * rb, rb, w->rows.data() + static_cast<int64_t>(i) * rb);
        }
    } else {  // FP8 with block scales: the selected rows dequantised
        dst.dtype = DType::kF32;
        w->rows.resize(sizeof(float) * static_cast<size_t>(src.cols) * ids.size());
        float* f = reinterpret_cast<float*>(w->rows.data());
        for (size_t i = 0; i < ids.size(); ++i) src.dequantize_row(ids[i], f + i * src.cols);
    }
    dst.data = w->rows.data();
    DSI_RETURN_IF_ERROR(m.pack(WeightClass::kHead, w->head));
    return std::unique_ptr<const MtpDraftHead>(
        new MtpDraftHead(std::vector<int32_t>(ids.begin(), ids.end()), std::move(w)));
}

Status DeepseekModel::mtp_forward_batch(std::span<const MtpStep> steps, MtpBatchOutput& out,
                                        const MtpDraftHead* head) {
    Impl& m = *impl_;
    if (m.ep != nullptr) {
        return failed_precondition("mtp_forward: not with expert parallelism (yet)");
    }
    if (!m.mtp) return failed_precondition("mtp_forward: the checkpoint has no MTP layer");
    const ModelConfig& c = m.cfg;
    const int64_t H = c.hidden_size;
    std::vector<int32_t> next;
    std::vector<float> hidden;
    TokenSlots slots;
    std::vector<int64_t> logit_tokens;  // batch token index of each logits row
    std::vector<char> full;             // per row: its output is computed
    out.logit_row.clear();
    for (size_t i = 0; i < steps.size(); ++i) {
        const MtpStep& st = steps[i];
        const int64_t T = static_cast<int64_t>(st.next_tokens.size());
        if (T == 0 || static_cast<int64_t>(st.hidden.size()) != T * H) {
            return invalid_argument("mtp_forward: hidden must be [tokens, hidden_size]");
        }
        for (int32_t t : st.next_tokens) {
            if (t < 0 || t >= c.vocab_size)
                return invalid_argument("mtp_forward: token id out of range");
        }
        if (st.cache == nullptr || st.start_pos < 0 || st.start_pos + T > st.cache->capacity()) {
            return out_of_range("mtp_forward: positions exceed the KV capacity");
        }
        const int64_t first = static_cast<int64_t>(next.size());
        next.insert(next.end(), st.next_tokens.begin(), st.next_tokens.end());
        hidden.insert(hidden.end(), st.hidden.begin(), st.hidden.end());
        for (int64_t t = 0; t < T; ++t) {
            slots.pos.push_back(st.start_pos + t);
            slots.cache.push_back(st.cache);
        }
        out.logit_row.push_back(static_cast<int64_t>(logit_tokens.size()));
        const int64_t logit_rows = std::clamp<int64_t>(st.logit_rows, 0, T);
        for (int64_t t = T - logit_rows; t < T; ++t) logit_tokens.push_back(first + t);
        const int64_t output_rows =
            st.output_rows < 0 ? T : std::clamp<int64_t>(st.output_rows, logit_rows, T);
        full.insert(full.end(), static_cast<size_t>(T - output_rows), 0);
        full.insert(full.end(), static_cast<size_t>(output_rows), 1);
    }
    const int64_t N = slots.size();
    if (N == 0) return invalid_argument("mtp_forward: empty batch");
    const Mtp& mtp = *m.mtp;
    std::vector<float> cat(static_cast<size_t>(N * 2 * H));
    std::vector<float> e(static_cast<size_t>(N * H));
    m.embed_rows(mtp.embed, next, e.data());
    std::vector<float> en(static_cast<size_t>(N * H));
    std::vector<float> hn(static_cast<size_t>(N * H));
    m.rms_norm(e.data(), mtp.enorm, N, H, en.data());
    m.rms_norm(hidden.data(), mtp.hnorm, N, H, hn.data());
    for (int64_t t = 0; t < N; ++t) {
        // Embedding first, then the hidden state (DeepSeek V3 MTP).
        std::copy_n(en.data() + t * H, H, cat.data() + t * 2 * H);
        std::copy_n(hn.data() + t * H, H, cat.data() + t * 2 * H + H);
    }
    out.hidden.resize(static_cast<size_t>(N * H));
    m.matmul(mtp.eh_proj, cat.data(), N, out.hidden.data());
    // Rows without output: their KV rows only (written first: the output rows attend to
    // them), the very rows block() writes (row-wise norm, batch-invariant kernels).
    TokenSlots kv_only;
    std::vector<float> kv_in;
    std::vector<int64_t> out_rows;
    TokenSlots out_slots;
    for (int64_t t = 0; t < N; ++t) {
        TokenSlots& to = full[t] ? out_slots : kv_only;
        to.pos.push_back(slots.pos[t]);
        to.cache.push_back(slots.cache[t]);
        if (full[t]) {
            out_rows.push_back(t);
        } else {
            kv_in.insert(kv_in.end(), out.hidden.begin() + t * H, out.hidden.begin() + (t + 1) * H);
        }
    }
    if (kv_only.size() > 0) {
        std::vector<float> h(kv_in.size());
        m.rms_norm(kv_in.data(), mtp.block.input_norm, kv_only.size(), H, h.data());
        m.write_kv_rows(mtp.block, h.data(), kv_only);
    }
    if (kv_only.size() == 0) {
        DSI_RETURN_IF_ERROR(m.block(mtp.block, out.hidden.data(), slots));
    } else if (out_slots.size() > 0) {
        std::vector<float> x(static_cast<size_t>(out_slots.size() * H));
        for (size_t r = 0; r < out_rows.size(); ++r) {
            std::copy_n(out.hidden.data() + out_rows[r] * H, H, x.data() + r * H);
        }
        DSI_RETURN_IF_ERROR(m.block(mtp.block, x.data(), out_slots));
        for (size_t r = 0; r < out_rows.size(); ++r) {
            std::copy_n(x.data() + r * H, H, out.hidden.data() + out_rows[r] * H);
        }
    }
    const int64_t R = static_cast<int64_t>(logit_tokens.size());
    std::vector<float> xn(static_cast<size_t>(R * H));
    for (int64_t r = 0; r < R; ++r) {
        m.rms_norm(out.hidden.data() + logit_tokens[r] * H, mtp.head_norm, 1, H, xn.data() + r * H);
    }
    const Linear& lm = head != nullptr ? head->w_->head : mtp.head;
    out.logits.resize(static_cast<size_t>(R * lm.rows()));
    if (R > 0) m.matmul(lm, xn.data(), R, out.logits.data());
    return Status::ok();
}

}  // namespace dsi
