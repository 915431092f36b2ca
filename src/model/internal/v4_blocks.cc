#include "model/internal/v4_blocks.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/internal/v4_kv_format.h"

namespace dsi::internal {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void matmul(const Linear& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
    kernels::matmul(w.packed, x, n, y, pool);
}

}  // namespace

Status V4Loader::linear(const std::string& name, int64_t rows, int64_t cols, WeightClass cls,
                        Linear& out) const {
    DSI_ASSIGN_OR_RETURN(out.w, source->matrix(name, rows, cols));
    return pack_linear(formats, cls, out);
}

Status V4Loader::exact(const std::string& name, int64_t rows, int64_t cols, Linear& out) const {
    DSI_ASSIGN_OR_RETURN(out.w, source->matrix(name, rows, cols));
    return pack_linear(ClassFormats{}, WeightClass::kAttn, out);
}

Status load_hc(const V4Loader& ld, const std::string& prefix, int64_t mix, int64_t nscale,
               int64_t hc_hidden, HcParams& p) {
    DSI_RETURN_IF_ERROR(ld.exact(prefix + "_fn", mix, hc_hidden, p.fn));
    DSI_ASSIGN_OR_RETURN(p.base, ld.source->vector(prefix + "_base", mix));
    DSI_ASSIGN_OR_RETURN(p.scale, ld.source->vector(prefix + "_scale", nscale));
    return Status::ok();
}

void hc_mixes(const HcParams& p, const ModelConfig& c, ThreadPool* pool, const float* x, int64_t n,
              std::vector<float>& mixes) {
    const int64_t HD = c.hc_mult * c.hidden_size;
    const int64_t mix = p.fn.rows();
    mixes.resize(static_cast<size_t>(n * mix));
    matmul(p.fn, x, n, mixes.data(), pool);
    const kernels::Isa isa = kernels::active_isa();
    for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * HD;
        float* m = mixes.data() + t * mix;
        const float rs = 1.0f / std::sqrt(kernels::dot(isa, xt, xt, HD) / static_cast<float>(HD) +
                                          static_cast<float>(c.rms_norm_eps));
        for (int64_t i = 0; i < mix; ++i) m[i] *= rs;
    }
}

void hc_coefficients(const HcParams& p, const ModelConfig& c, const float* m, float* pre,
                     float* post, float* C) {
    const int64_t hc = c.hc_mult;
    const float eps = static_cast<float>(c.hc_eps);
    for (int64_t j = 0; j < hc; ++j) {
        pre[j] = sigmoid(m[j] * p.scale[0] + p.base[j]) + eps;
        post[j] = 2.0f * sigmoid(m[hc + j] * p.scale[1] + p.base[hc + j]);
    }
    for (int64_t j = 0; j < hc * hc; ++j) C[j] = m[2 * hc + j] * p.scale[2] + p.base[2 * hc + j];
    // Row softmax + eps, column normalisation, then (iters - 1) x (row, column).
    for (int64_t j = 0; j < hc; ++j) {
        float* row = C + j * hc;
        float mx = row[0];
        for (int64_t k = 1; k < hc; ++k) mx = std::max(mx, row[k]);
        float sum = 0.0f;
        for (int64_t k = 0; k < hc; ++k) {
            row[k] = std::exp(row[k] - mx);
            sum += row[k];
        }
        for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
    }
    auto normalise_cols = [&] {
        for (int64_t k = 0; k < hc; ++k) {
            float s = 0.0f;
            for (int64_t j = 0; j < hc; ++j) s += C[j * hc + k];
            for (int64_t j = 0; j < hc; ++j) C[j * hc + k] /= s + eps;
        }
    };
    normalise_cols();
    for (int64_t it = 1; it < c.hc_sinkhorn_iters; ++it) {
        for (int64_t j = 0; j < hc; ++j) {
            float s = 0.0f;
            for (int64_t k = 0; k < hc; ++k) s += C[j * hc + k];
            for (int64_t k = 0; k < hc; ++k) C[j * hc + k] /= s + eps;
        }
        normalise_cols();
    }
}

void hc_post(const float* x, const float* y, const float* post, const float* comb, int64_t n,
             int64_t hc, int64_t h, float* out) {
    for (int64_t t = 0; t < n; ++t) {
        const float* C = comb + t * hc * hc;
        for (int64_t k = 0; k < hc; ++k) {
            float* o = out + (t * hc + k) * h;
            const float pk = post[t * hc + k];
            const float* yt = y + t * h;
            for (int64_t i = 0; i < h; ++i) o[i] = pk * yt[i];
            for (int64_t j = 0; j < hc; ++j) {
                const float cw = C[j * hc + k];
                const float* xj = x + (t * hc + j) * h;
                for (int64_t i = 0; i < h; ++i) o[i] += cw * xj[i];
            }
        }
    }
}

void hc_mix_in(const float* x, const float* pre, int64_t n, int64_t hc, int64_t h, float* out) {
    for (int64_t t = 0; t < n; ++t) {
        float* o = out + t * h;
        std::fill(o, o + h, 0.0f);
        for (int64_t j = 0; j < hc; ++j) {
            const float* xj = x + (t * hc + j) * h;
            const float w = pre[t * hc + j];
            for (int64_t i = 0; i < h; ++i) o[i] += w * xj[i];
        }
    }
}

// ---- attention ----

Status load_attn_core(const V4Loader& ld, const ModelConfig& c, const std::string& a, AttnCore& L) {
    const int64_t H = c.hidden_size;
    const int64_t nh = c.num_attention_heads;
    const int64_t hd = c.head_dim;
    WeightSource& src = *ld.source;
    DSI_RETURN_IF_ERROR(ld.linear(a + "wq_a.weight", c.q_lora_rank, H, WeightClass::kAttn, L.wq_a));
    DSI_ASSIGN_OR_RETURN(L.q_norm, src.vector(a + "q_norm.weight", c.q_lora_rank));
    DSI_RETURN_IF_ERROR(
        ld.linear(a + "wq_b.weight", nh * hd, c.q_lora_rank, WeightClass::kAttn, L.wq_b));
    DSI_RETURN_IF_ERROR(ld.linear(a + "wkv.weight", hd, H, WeightClass::kAttn, L.wkv));
    DSI_ASSIGN_OR_RETURN(L.kv_norm, src.vector(a + "kv_norm.weight", hd));
    // wo_a [groups * o_lora, heads/groups * head_dim]: one slice of o_lora rows per group
    // (validate() keeps FP8 block rows inside a slice).
    const int64_t G = c.o_groups;
    const int64_t olr = c.o_lora_rank;
    DSI_ASSIGN_OR_RETURN(WeightMatrix wo_a, src.matrix(a + "wo_a.weight", G * olr, nh * hd / G));
    L.wo_a.resize(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
        WeightMatrix s = wo_a;
        s.rows = olr;
        s.data = wo_a.data + g * olr * wo_a.row_bytes();
        if (wo_a.block_scale != nullptr) {
            const int64_t scols = (wo_a.cols + wo_a.block_cols - 1) / wo_a.block_cols;
            s.block_scale = wo_a.block_scale + (g * olr / wo_a.block_rows) * scols;
        }
        L.wo_a[static_cast<size_t>(g)].w = s;
        DSI_RETURN_IF_ERROR(
            pack_linear(ld.formats, WeightClass::kAttn, L.wo_a[static_cast<size_t>(g)]));
    }
    DSI_RETURN_IF_ERROR(ld.linear(a + "wo_b.weight", H, G * olr, WeightClass::kAttn, L.wo_b));
    DSI_ASSIGN_OR_RETURN(L.sink, src.vector(a + "attn_sink", nh));
    return Status::ok();
}

void rope_rows(const ModelConfig& c, const std::vector<double>& inv_freq, int64_t pos, float* v,
               int64_t num_vecs, int64_t stride, int64_t dim, bool inverse) {
    const int64_t rd = c.qk_rope_head_dim;
    const int64_t pairs = rd / 2;
    float cc[512], ss[512];
    DSI_CHECK(rd <= 512);
    kernels::rope_table(pos, inv_freq.data(), pairs, 1.0, cc, ss);
    if (inverse) {
        for (int64_t i = 0; i < rd; ++i) ss[i] = -ss[i];
    }
    kernels::rope_apply(kernels::active_isa(), v + (dim - rd), num_vecs, stride, cc, ss, pairs);
}

void rms_norm_rows(const ModelConfig& c, const float* x, const float* w, int64_t n, int64_t dim,
                   float* y) {
    const kernels::Isa isa = kernels::active_isa();
    const float eps = static_cast<float>(c.rms_norm_eps);
    for (int64_t t = 0; t < n; ++t) kernels::rms_norm(isa, x + t * dim, w, dim, eps, y + t * dim);
}

void attn_project(const AttnCore& L, const ModelConfig& c, ThreadPool* pool, const float* h,
                  std::span<const int64_t> pos, std::vector<float>& qr, std::vector<float>& q,
                  std::vector<float>& kv) {
    const int64_t n = static_cast<int64_t>(pos.size());
    const int64_t nh = c.num_attention_heads;
    const int64_t hd = c.head_dim;
    const int64_t qlr = c.q_lora_rank;
    qr.resize(static_cast<size_t>(n * qlr));
    matmul(L.wq_a, h, n, qr.data(), pool);
    rms_norm_rows(c, qr.data(), L.q_norm.data(), n, qlr, qr.data());
    q.resize(static_cast<size_t>(n * nh * hd));
    matmul(L.wq_b, qr.data(), n, q.data(), pool);
    const std::vector<float> ones(static_cast<size_t>(hd), 1.0f);
    rms_norm_rows(c, q.data(), ones.data(), n * nh, hd, q.data());  // per head, no weight
    kv.resize(static_cast<size_t>(n * hd));
    matmul(L.wkv, h, n, kv.data(), pool);
    rms_norm_rows(c, kv.data(), L.kv_norm.data(), n, hd, kv.data());
    for (int64_t t = 0; t < n; ++t) {
        rope_rows(c, L.inv_freq, pos[t], q.data() + t * nh * hd, nh, hd, hd, false);
        rope_rows(c, L.inv_freq, pos[t], kv.data() + t * hd, 1, hd, hd, false);
    }
}

void sink_attention(const AttnCore& L, const ModelConfig& c, const float* q,
                    std::span<const float* const> keys, float* o, std::vector<float>& p) {
    const int64_t nh = c.num_attention_heads;
    const int64_t hd = c.head_dim;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    const kernels::Isa isa = kernels::active_isa();
    p.resize(keys.size());
    for (int64_t hh = 0; hh < nh; ++hh) {
        const float* qh = q + hh * hd;
        float mx = L.sink[static_cast<size_t>(hh)];
        for (size_t i = 0; i < keys.size(); ++i) {
            p[i] = kernels::dot(isa, qh, keys[i], hd) * scale;
            mx = std::max(mx, p[i]);
        }
        float sum = std::exp(L.sink[static_cast<size_t>(hh)] - mx);
        for (size_t i = 0; i < keys.size(); ++i) {
            p[i] = std::exp(p[i] - mx);
            sum += p[i];
        }
        float* oh = o + hh * hd;
        std::fill(oh, oh + hd, 0.0f);
        for (size_t i = 0; i < keys.size(); ++i) {
            const float w = p[i] / sum;
            const float* k = keys[i];
            for (int64_t d = 0; d < hd; ++d) oh[d] += w * k[d];
        }
    }
}

void attn_output(const AttnCore& L, const ModelConfig& c, ThreadPool* pool,
                 std::span<const int64_t> pos, std::vector<float>& o, float* out) {
    const int64_t n = static_cast<int64_t>(pos.size());
    const int64_t nh = c.num_attention_heads;
    const int64_t hd = c.head_dim;
    // Inverse RoPE on the output's rope dims, at the query's position.
    for (int64_t t = 0; t < n; ++t)
        rope_rows(c, L.inv_freq, pos[t], o.data() + t * nh * hd, nh, hd, hd, true);
    // Grouped low-rank output: group g's heads through wo_a's slice g, then wo_b.
    const int64_t G = c.o_groups;
    const int64_t olr = c.o_lora_rank;
    const int64_t gw = nh / G * hd;
    std::vector<float> og(static_cast<size_t>(n * gw)), yg(static_cast<size_t>(n * olr));
    std::vector<float> low(static_cast<size_t>(n * G * olr));
    for (int64_t g = 0; g < G; ++g) {
        for (int64_t t = 0; t < n; ++t)
            std::copy_n(o.data() + t * nh * hd + g * gw, gw, og.data() + t * gw);
        matmul(L.wo_a[static_cast<size_t>(g)], og.data(), n, yg.data(), pool);
        for (int64_t t = 0; t < n; ++t)
            std::copy_n(yg.data() + t * olr, olr, low.data() + t * G * olr + g * olr);
    }
    matmul(L.wo_b, low.data(), n, out, pool);
}

void store_rows(std::vector<float>& kv, int64_t n, int64_t dim, int64_t words,
                const std::function<void(const float*, uint8_t*)>& encode,
                const std::function<void(const uint8_t*, float*)>& decode,
                std::vector<float>& stored) {
    stored.resize(static_cast<size_t>(n * words));
    for (int64_t t = 0; t < n; ++t) {
        auto* row = reinterpret_cast<uint8_t*>(stored.data() + t * words);
        encode(kv.data() + t * dim, row);
        decode(row, kv.data() + t * dim);
    }
}

void attend(const AttnCore& a, const ModelConfig& c, ThreadPool* pool, const Tokens& tk,
            const std::vector<float>& q, const std::vector<float>& kv, const AttendKeys& src,
            std::vector<float>& o) {
    const int64_t n = tk.size();
    const int64_t nh = c.num_attention_heads;
    const int64_t hd = c.head_dim;
    const int64_t win = c.sliding_window;
    o.resize(static_cast<size_t>(n * nh * hd));
    pool->parallel_for(n, 1, [&](int64_t begin, int64_t end) {
        std::vector<const float*> keys;
        std::vector<float> p, decoded;
        for (int64_t t = begin; t < end; ++t) {
            const int64_t pos = tk.pos[t];
            const std::vector<int32_t>& ids = src.chosen(t);
            // Stored rows are decoded once per token (not per head).
            decoded.resize((ids.size() + static_cast<size_t>(win)) * static_cast<size_t>(hd));
            int64_t used = 0;
            keys.clear();
            for (int32_t e : ids) keys.push_back(src.entry(t, e, decoded.data() + (used++) * hd));
            int64_t first = std::max<int64_t>(0, pos - win + 1);
            if (src.window_floor) first = std::max(first, src.window_floor(t));  // S-SWA
            for (int64_t s = first; s <= pos; ++s) {
                keys.push_back(s >= tk.chunk_start[t]
                                   ? kv.data() + (tk.chunk_first[t] + s - tk.chunk_start[t]) * hd
                                   : src.window(t, s, decoded.data() + (used++) * hd));
            }
            sink_attention(a, c, q.data() + t * nh * hd, keys, o.data() + t * nh * hd, p);
        }
    });
}

float IndexQueries::score(int64_t t, const float* key) const {
    const kernels::Isa isa = kernels::active_isa();
    float s = 0.0f;
    for (int64_t hh = 0; hh < heads; ++hh) {
        const float d = kernels::dot(isa, q.data() + (t * heads + hh) * dim, key, dim);
        s += std::max(d, 0.0f) * w[static_cast<size_t>(t * heads + hh)];
    }
    return s;
}

void IndexQueries::score_keys(int64_t t, const float* const* keys, int64_t n, float* out) const {
    kernels::index_scores(kernels::active_isa(), qt.data() + t * dim * packed_heads,
                          wt.data() + t * packed_heads, packed_heads, dim, keys, n, out);
}

IndexQueries index_queries(const Linear& wq_b, const Linear& weights_proj, const ModelConfig& c,
                           ThreadPool* pool, const std::vector<float>& qr, const float* h,
                           std::span<const int64_t> pos, const std::vector<double>& inv_freq,
                           bool quantised_keys) {
    const int64_t n = static_cast<int64_t>(pos.size());
    IndexQueries iq;
    iq.heads = c.index_n_heads;
    iq.dim = c.index_head_dim;
    const int64_t ih = iq.heads, ihd = iq.dim;
    iq.q.resize(static_cast<size_t>(n * ih * ihd));
    matmul(wq_b, qr.data(), n, iq.q.data(), pool);
    iq.w.resize(static_cast<size_t>(n * ih));
    matmul(weights_proj, h, n, iq.w.data(), pool);
    const float wscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ihd)) /
                                            std::sqrt(static_cast<double>(ih)));
    for (float& x : iq.w) x *= wscale;
    for (int64_t t = 0; t < n; ++t) {
        rope_rows(c, inv_freq, pos[t], iq.q.data() + t * ih * ihd, ih, ihd, ihd, false);
    }
    if (quantised_keys) {  // the keys' rotation, and the queries quantised as the keys are
        for (int64_t v = 0; v < n * ih; ++v) {
            hadamard_rotate(iq.q.data() + v * ihd, ihd);
            v4_fp4_simulate(iq.q.data() + v * ihd, ihd);
        }
    }
    iq.packed_heads = kernels::index_packed_heads(ih);
    iq.qt.resize(static_cast<size_t>(n * ihd * iq.packed_heads));
    iq.wt.resize(static_cast<size_t>(n * iq.packed_heads));
    for (int64_t t = 0; t < n; ++t) {
        kernels::index_pack_queries(iq.q.data() + t * ih * ihd, iq.w.data() + t * ih, ih, ihd,
                                    iq.qt.data() + t * ihd * iq.packed_heads,
                                    iq.wt.data() + t * iq.packed_heads);
    }
    return iq;
}

std::vector<int32_t> top_k_ascending(const std::vector<float>& scores, int64_t k) {
    std::vector<int32_t> ids(static_cast<size_t>(k));
    kernels::top_k(scores.data(), static_cast<int64_t>(scores.size()), k, ids.data());
    std::sort(ids.begin(), ids.end());
    return ids;
}

// ---- MoE ----

namespace {

Status load_expert(const V4Loader& ld, const ModelConfig& c, const std::string& p, int64_t inter,
                   WeightClass cls, Expert& e) {
    const int64_t H = c.hidden_size;
    DSI_RETURN_IF_ERROR(ld.linear(p + "w1.weight", inter, H, cls, e.w1));
    DSI_RETURN_IF_ERROR(ld.linear(p + "w2.weight", H, inter, cls, e.w2));
    DSI_RETURN_IF_ERROR(ld.linear(p + "w3.weight", inter, H, cls, e.w3));
    return Status::ok();
}

}  // namespace

void expert_forward(const Expert& e, const ModelConfig& c, ThreadPool* pool, const float* x,
                    int64_t n, float* y) {
    const int64_t inter = e.w1.rows();
    std::vector<float> g(static_cast<size_t>(n * inter)), u(static_cast<size_t>(n * inter));
    matmul(e.w1, x, n, g.data(), pool);
    matmul(e.w3, x, n, u.data(), pool);
    const float lim = static_cast<float>(c.swiglu_limit);
    if (lim > 0) {
        for (size_t i = 0; i < g.size(); ++i) {
            g[i] = std::min(g[i], lim);
            u[i] = std::clamp(u[i], -lim, lim);
        }
    }
    kernels::silu_mul(kernels::active_isa(), g.data(), u.data(), n * inter, g.data());
    matmul(e.w2, g.data(), n, y, pool);
}

Status load_routed_expert(const V4Loader& ld, const ModelConfig& c, const std::string& f,
                          int expert, Expert& e) {
    return load_expert(ld, c, f + "experts." + std::to_string(expert) + ".",
                       c.moe_intermediate_size, WeightClass::kExperts, e);
}

Status load_moe(const V4Loader& ld, const ModelConfig& c, const std::string& f, int64_t num_experts,
                int64_t top_k, bool hash, std::span<const int> held, Moe& m) {
    const int64_t E = num_experts;
    WeightSource& src = *ld.source;
    m.top_k = top_k;
    DSI_RETURN_IF_ERROR(
        ld.linear(f + "gate.weight", E, c.hidden_size, WeightClass::kRouter, m.gate));
    m.hash = hash;
    if (m.hash) {
        const std::string name = f + "gate.tid2eid";
        DSI_ASSIGN_OR_RETURN(m.tid2eid, src.int_matrix(name, c.vocab_size, top_k));
        const int64_t k = top_k;
        for (int64_t v = 0; v < c.vocab_size; ++v) {
            const int32_t* row = m.tid2eid.data() + v * k;
            for (int64_t j = 0; j < k; ++j) {
                if (row[j] < 0 || row[j] >= E || std::find(row, row + j, row[j]) != row + j) {
                    return invalid_argument(src.description() + ": tensor '" + name + "' row " +
                                            std::to_string(v) + " names expert " +
                                            std::to_string(row[j]) + " (outside [0, " +
                                            std::to_string(E) + ") or twice)");
                }
            }
        }
    } else {
        DSI_ASSIGN_OR_RETURN(m.gate_bias, src.vector(f + "gate.bias", E));
    }
    // With expert parallelism only this rank's slots (the other experts' bytes are never
    // read, so a mapped checkpoint does not even page them in).
    std::vector<int> all;
    if (held.empty()) {
        all.resize(static_cast<size_t>(E));
        std::iota(all.begin(), all.end(), 0);
        held = all;
    }
    m.experts.resize(held.size());
    for (size_t slot = 0; slot < held.size(); ++slot) {
        if (held[slot] < 0) continue;  // an empty slot receives no rows
        DSI_RETURN_IF_ERROR(load_routed_expert(ld, c, f, held[slot], m.experts[slot]));
    }
    if (c.n_shared_experts > 0) {
        m.has_shared = true;
        DSI_RETURN_IF_ERROR(load_expert(ld, c, f + "shared_experts.",
                                        c.n_shared_experts * c.moe_intermediate_size,
                                        WeightClass::kShared, m.shared));
    }
    return Status::ok();
}

void moe_route(const Moe& L, const ModelConfig& c, ThreadPool* pool, const float* h,
               std::span<const int32_t> token_ids, int64_t n, std::vector<int32_t>& ids,
               std::vector<float>& weights) {
    const int64_t E = L.gate.rows();
    const int64_t k = L.top_k;
    std::vector<float> logits(static_cast<size_t>(n * E));
    matmul(L.gate, h, n, logits.data(), pool);
    ids.resize(static_cast<size_t>(n * k));
    weights.resize(static_cast<size_t>(n * k));
    std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
    std::vector<int32_t> top(static_cast<size_t>(k));
    std::vector<std::pair<int32_t, float>> r;
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t e = 0; e < E; ++e) {
            const float x = logits[t * E + e];
            const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
            s[static_cast<size_t>(e)] = std::sqrt(sp);
        }
        if (L.hash) {
            std::copy_n(L.tid2eid.data() + static_cast<int64_t>(token_ids[t]) * k, k, top.data());
        } else {
            for (int64_t e = 0; e < E; ++e) choice[e] = s[e] + L.gate_bias[e];
            kernels::top_k(choice.data(), E, k, top.data());
        }
        // The weights' sum in the order the choice gives, then (expert, weight) pairs
        // sorted by expert id: one fixed sum order per token.
        r.clear();
        float sum = 0.0f;
        for (int32_t e : top) {
            r.emplace_back(e, s[static_cast<size_t>(e)]);
            sum += s[static_cast<size_t>(e)];
        }
        for (auto& [e, w] : r) {
            if (c.norm_topk_prob) w /= sum;
            w *= static_cast<float>(c.routed_scaling_factor);
        }
        std::sort(r.begin(), r.end());
        for (int64_t j = 0; j < k; ++j) {
            ids[static_cast<size_t>(t * k + j)] = r[static_cast<size_t>(j)].first;
            weights[static_cast<size_t>(t * k + j)] = r[static_cast<size_t>(j)].second;
        }
    }
}

namespace {

// out[i] += the shared expert's output of h (n tokens).
void add_shared(const Moe& L, const ModelConfig& c, ThreadPool* pool, const float* h, int64_t n,
                float* out) {
    const int64_t hid = c.hidden_size;
    std::vector<float> sh(static_cast<size_t>(n * hid));
    expert_forward(L.shared, c, pool, h, n, sh.data());
    for (int64_t i = 0; i < n * hid; ++i) out[i] += sh[i];
}

}  // namespace

void moe_forward(const Moe& L, const ModelConfig& c, ThreadPool* pool, const float* h,
                 std::span<const int32_t> token_ids, int64_t n, float* out) {
    const int64_t E = static_cast<int64_t>(L.experts.size());
    const int64_t k = L.top_k;
    const int64_t hid = c.hidden_size;
    std::vector<int32_t> ids;
    std::vector<float> weights;
    moe_route(L, c, pool, h, token_ids, n, ids, weights);
    std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(E));  // t * k + j
    for (int64_t i = 0; i < n * k; ++i) rows_of[static_cast<size_t>(ids[i])].push_back(i);
    std::vector<float> y_routed(static_cast<size_t>(n * k * hid));
    for (int64_t e = 0; e < E; ++e) {
        const auto& rows = rows_of[static_cast<size_t>(e)];
        if (rows.empty()) continue;
        const int64_t m = static_cast<int64_t>(rows.size());
        std::vector<float> xin(static_cast<size_t>(m * hid)), y(static_cast<size_t>(m * hid));
        for (int64_t i = 0; i < m; ++i) {
            std::copy_n(h + rows[static_cast<size_t>(i)] / k * hid, hid, xin.data() + i * hid);
        }
        expert_forward(L.experts[static_cast<size_t>(e)], c, pool, xin.data(), m, y.data());
        for (int64_t i = 0; i < m; ++i) {
            std::copy_n(y.data() + i * hid, hid,
                        y_routed.data() + rows[static_cast<size_t>(i)] * hid);
        }
    }
    std::fill(out, out + n * hid, 0.0f);
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t j = 0; j < k; ++j) {
            const float w = weights[static_cast<size_t>(t * k + j)];
            const float* y = y_routed.data() + (t * k + j) * hid;
            for (int64_t i = 0; i < hid; ++i) out[t * hid + i] += w * y[i];
        }
    }
    if (L.has_shared) add_shared(L, c, pool, h, n, out);
}

Status moe_forward_ep(const Moe& L, const ModelConfig& c, ThreadPool* pool, EpHost& ep,
                      int moe_layer, const float* h, std::span<const int32_t> token_ids, int64_t n,
                      float* out) {
    const size_t hn = static_cast<size_t>(n * c.hidden_size);
    std::vector<int32_t> ids;
    std::vector<float> weights;
    if (n > 0) moe_route(L, c, pool, h, token_ids, n, ids, weights);
    // The combine sums each token's experts in k order (ids ascending) from +0.0f, as
    // moe_forward does: the same bits wherever the experts ran (S-ENG-2, docs/comm.md).
    DSI_RETURN_IF_ERROR(ep.moe(moe_layer, std::span<const float>(h, hn), n, ids, weights,
                               std::span<float>(out, hn)));
    if (L.has_shared && n > 0) add_shared(L, c, pool, h, n, out);
    return Status::ok();
}

Result<std::unique_ptr<EpExperts<Expert>>> join_expert_parallel(
    const ExpertParallelOptions& options, const ModelConfig& c, const V4Loader& ld,
    ThreadPool* pool, std::function<Moe&(int layer)> moe_of) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        if (!c.is_moe_layer(i)) {
            return invalid_argument("expert parallelism: layer " + std::to_string(i) +
                                    " of this V4-family config has no MoE (every layer needs one)");
        }
    }
    auto ep = std::make_unique<EpExperts<Expert>>(
        [moe_of](int l) -> std::vector<Expert>& { return moe_of(l).experts; },
        [&ld, &c](int l, int e, Expert& out) {
            return load_routed_expert(ld, c, "layers." + std::to_string(l) + ".ffn.", e, out);
        });
    DSI_RETURN_IF_ERROR(ep->join(
        options, c, [moe_of, &c, pool](int l, int slot, const float* x, int64_t rows, float* y) {
            expert_forward(moe_of(l).experts[static_cast<size_t>(slot)], c, pool, x, rows, y);
        }));
    return ep;
}

// ---- batching ----

Status gather_steps(std::span<const SequenceStep> steps, const ModelConfig& c,
                    const std::string& model, Tokens& tk, std::vector<int64_t>& logit_tokens,
                    std::vector<int64_t>& logit_row, bool bounded_replay) {
    if (steps.empty()) return invalid_argument("forward: empty batch");
    logit_row.clear();
    for (size_t i = 0; i < steps.size(); ++i) {
        const SequenceStep& st = steps[i];
        const std::string which = "forward: sequence " + std::to_string(i);
        const int64_t T = static_cast<int64_t>(st.tokens.size());
        if (T == 0) return invalid_argument(which + " has no tokens");
        if (!bounded_replay && (st.replay_end != 0 || st.decoder_begin != 0)) {
            return invalid_argument(which + ": " + model + " has no SWA bounded replay");
        }
        if (st.cache == nullptr || st.cache->state() == nullptr) {
            return invalid_argument(which + " has no " + model + " state (a cache of kv_layout())");
        }
        const int64_t length = header_get(st.cache->state(), 0);
        // A replay step (bounded replay) starts its state afresh at start_pos.
        const bool replay = bounded_replay && st.replay_end > st.start_pos;
        if (st.start_pos != 0 && st.start_pos != length && !replay) {
            return invalid_argument(which + " starts at position " + std::to_string(st.start_pos) +
                                    " but its state holds " + std::to_string(length) +
                                    " positions (" + model + " state is sequential)");
        }
        if (st.start_pos + T > st.cache->capacity()) {
            return out_of_range(which + ": positions [" + std::to_string(st.start_pos) + ", " +
                                std::to_string(st.start_pos + T) + ") exceed the capacity " +
                                std::to_string(st.cache->capacity()));
        }
        for (int32_t id : st.tokens) {
            if (id < 0 || id >= c.vocab_size) {
                return invalid_argument(which + ": token id " + std::to_string(id) +
                                        " outside the vocabulary [0, " +
                                        std::to_string(c.vocab_size) + ")");
            }
        }
        for (size_t j = 0; j < i; ++j) {
            if (steps[j].cache == st.cache) {
                return invalid_argument("forward: two batch entries share one state");
            }
        }
        logit_row.push_back(static_cast<int64_t>(logit_tokens.size()));
        const int64_t first = tk.size();
        for (int64_t t = 0; t < T; ++t) {
            tk.ids.push_back(st.tokens[static_cast<size_t>(t)]);
            tk.pos.push_back(st.start_pos + t);
            tk.cache.push_back(st.cache);
            tk.chunk_first.push_back(first);
            tk.chunk_start.push_back(st.start_pos);
            if (st.all_logits || t == T - 1) logit_tokens.push_back(first + t);
        }
    }
    return Status::ok();
}

}  // namespace dsi::internal
