#include "model/deepseek_v4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <utility>

#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/internal/linear.h"
#include "model/internal/v4_kv_format.h"

namespace dsi {
namespace {

using internal::Linear;
using internal::WeightClass;

// Hyper-connection mixing parameters of one sub-layer (or of the head: no post/comb).
struct HcParams {
    Linear fn;  // [mix, hc * hidden] f32
    std::vector<float> base, scale;
};

struct Compressor {
    int64_t ratio = 0;
    int64_t dim = 0;   // D: entry width
    int64_t coff = 1;  // 2 with the ratio-4 overlap
    Linear wkv, wgate;
    std::vector<float> ape;  // [ratio, coff * dim]
    std::vector<float> norm;
};

struct Expert {
    Linear w1, w2, w3;
};

struct V4Layer {
    int64_t index = 0;
    int64_t ratio = 0;
    std::vector<double> inv_freq;
    std::vector<float> attn_norm, ffn_norm;
    HcParams hc_attn, hc_ffn;
    Linear wq_a, wq_b, wkv, wo_b;
    std::vector<float> q_norm, kv_norm, sink;
    std::vector<Linear> wo_a;  // one slice per output group
    Compressor comp;           // ratio > 0
    Linear idx_wq_b, idx_weights;
    Compressor idx_comp;       // ratio 4
    Linear gate;
    std::vector<float> gate_bias;
    std::vector<int32_t> tid2eid;  // [vocab, experts_per_tok] on hash layers
    bool hash = false;
    std::vector<Expert> experts;
    bool has_shared = false;
    Expert shared;
};

struct V4Mtp {
    Linear e_proj, h_proj;
    std::vector<float> enorm, hnorm, norm;
    HcParams head;
    V4Layer block;
};

// Where one layer keeps its state: offsets (floats) in the sequence's state slot, and
// the cache groups holding its compressed entries and indexer keys.
struct LayerSlots {
    int64_t ring = 0;  // [window main rows]: position p at row p % window
    // Compressor accumulators: kv then score rows [coff * ratio, coff * D] each.
    int64_t comp = -1, comp_floats = 0;
    int64_t idx_comp = -1, idx_comp_floats = 0;
    int entries_group = -1;  // entry i (tokens [i * ratio, (i + 1) * ratio)) per layer
    int keys_group = -1;     // indexer key i (ratio 4)
    int64_t group_layer = 0;  // the layer's index inside its groups
};

// A compressor's partial-window accumulator in the slot: kv and score rows.
struct CompView {
    float* kv = nullptr;
    float* score = nullptr;
    int64_t floats = 0;  // of each
};

// The slot's header: the main and the MTP length, one int64 each.
constexpr int64_t kHeaderFloats = 4;
int64_t header_get(const float* slot, int i) {
    int64_t v = 0;
    std::memcpy(&v, slot + 2 * i, sizeof v);
    return v;
}
void header_set(float* slot, int i, int64_t v) { std::memcpy(slot + 2 * i, &v, sizeof v); }

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

struct V4State::Impl {
    std::unique_ptr<ContiguousKvCache> cache;
};

V4State::V4State(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
V4State::~V4State() = default;
int64_t V4State::capacity() const { return impl_->cache->capacity(); }
int64_t V4State::length() const { return header_get(impl_->cache->state(), 0); }
int64_t V4State::mtp_length() const { return header_get(impl_->cache->state(), 1); }
int64_t V4State::bytes() const { return impl_->cache->bytes(); }

namespace {

// The tokens of one forward call: per token its position, its sequence's state and
// where its sequence's chunk starts in the batch.
struct Tokens {
    std::vector<int32_t> ids;
    std::vector<int64_t> pos;
    std::vector<KvCache*> cache;  // with the state slot
    std::vector<int64_t> chunk_first;  // batch index of the chunk's first token
    std::vector<int64_t> chunk_start;  // position of the chunk's first token
    int64_t size() const { return static_cast<int64_t>(pos.size()); }
};

}  // namespace

struct DeepseekV4Model::Impl {
    std::unique_ptr<WeightSource> source;
    ModelConfig cfg;
    std::unique_ptr<ThreadPool> pool;
    internal::ClassFormats class_format;
    WeightMatrix embed;
    std::vector<V4Layer> layers;
    std::vector<float> final_norm;
    HcParams hc_head;
    Linear head;
    std::optional<V4Mtp> mtp;
    std::vector<float> ones;  // weight of the per-head query normalisation
    // KV rows (deepseek_v4.h): f32, or e4m3 (main rows FP8, indexer keys MXFP4).
    kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
    bool fp8() const { return kv_dtype == kernels::KvDtype::kE4m3; }
    int64_t main_words = 0;  // 4-byte words per main row
    int64_t key_words = 0;   // per indexer key row
    // The per-sequence cache (class comment in deepseek_v4.h): per layer (main, then MTP).
    KvLayout layout;
    std::vector<LayerSlots> slots;

    // Lays out the cache groups and the state slot for every layer.
    void plan_cache();
    // A fresh sequence: lengths 0, accumulators empty (kv 0, score -inf).
    void reset_state(float* slot) const;
    // Window row of position `pos` (ring slot pos % window).
    float* ring_row(const V4Layer& L, KvCache* c, int64_t pos) const {
        return c->state() + slots[static_cast<size_t>(L.index)].ring +
               (pos % cfg.sliding_window) * main_words;
    }
    CompView comp_state(const V4Layer& L, KvCache* c, bool indexer) const {
        const LayerSlots& s = slots[static_cast<size_t>(L.index)];
        const int64_t off = indexer ? s.idx_comp : s.comp;
        const int64_t n = indexer ? s.idx_comp_floats : s.comp_floats;
        return {c->state() + off, c->state() + off + n, n};
    }
    // Compressed entry i of L (indexer: its key), as stored.
    float* entry_ptr(const V4Layer& L, KvCache* c, int64_t i, bool indexer) const {
        const LayerSlots& s = slots[static_cast<size_t>(L.index)];
        return c->entry(static_cast<size_t>(indexer ? s.keys_group : s.entries_group),
                        s.group_layer, i * L.ratio);
    }
    // Checks the steps and fills the token list; starts sequences at 0 afresh.
    Status gather(std::span<const SequenceStep> steps, Tokens& tk,
                  std::vector<int64_t>& logit_tokens, std::vector<int64_t>& logit_row);
    // The main forward pass over gathered tokens: streams [N, hc, H] out; lengths advanced.
    void run(std::span<const SequenceStep> steps, const Tokens& tk, std::vector<float>& x,
             std::vector<std::vector<float>>* layer_streams);

    int64_t hc() const { return cfg.hc_mult; }
    int64_t H() const { return cfg.hidden_size; }

    Status load_linear(const std::string& name, int64_t rows, int64_t cols, WeightClass cls,
                       Linear& out);
    Status load_exact(const std::string& name, int64_t rows, int64_t cols, Linear& out);
    Status load_hc(const std::string& prefix, int64_t mix, int64_t nscale, HcParams& hc);
    Status load_compressor(const std::string& p, int64_t ratio, int64_t dim, Compressor& cp);
    Status load_expert(const std::string& p, int64_t inter, WeightClass cls, Expert& e);
    Status load_layer(const std::string& p, int64_t index, V4Layer& L);

    void matmul(const Linear& w, const float* x, int64_t n, float* y) {
        kernels::matmul(w.packed, x, n, y, pool.get());
    }
    void rms_norm(const float* x, const float* w, int64_t n, int64_t dim, float* y) const {
        const kernels::Isa isa = kernels::active_isa();
        const float eps = static_cast<float>(cfg.rms_norm_eps);
        for (int64_t t = 0; t < n; ++t) kernels::rms_norm(isa, x + t * dim, w, dim, eps, y + t * dim);
    }
    // Rotates the last qk_rope_head_dim values of num_vecs vectors (stride apart) by
    // pos (inverse: by -pos).
    void rope(const V4Layer& L, int64_t pos, float* v, int64_t num_vecs, int64_t stride,
              int64_t dim, bool inverse) const;

    // mHC: the sub-layer input [N, H] and per token post [hc] and comb [hc, hc].
    void hc_pre(const HcParams& p, const float* x, int64_t n, float* xin, float* post,
                float* comb);
    void hc_post(const float* x, const float* y, const float* post, const float* comb, int64_t n,
                 float* out) const;
    // The head's collapse of the streams into [N, H] (no Sinkhorn).
    void hc_collapse(const HcParams& p, const float* x, int64_t n, float* y);

    void block(const V4Layer& L, float* x, const Tokens& tk);
    void attention(const V4Layer& L, const float* h, const Tokens& tk, float* out);
    // Feeds the chunk's tokens through a compressor, emitting entries into `entries`.
    void compress(const V4Layer& L, const Compressor& cp, const float* h, const Tokens& tk,
                  bool indexer);
    // A stored main row (indexer: key row) as floats: the row itself for f32, else
    // decoded into `buf` (head_dim or index_head_dim floats).
    const float* main_row(const float* row, float* buf) const {
        if (!fp8()) return row;
        internal::v4_main_decode(reinterpret_cast<const uint8_t*>(row), cfg.head_dim,
                                 cfg.qk_rope_head_dim, buf);
        return buf;
    }
    const float* key_row(const float* row, float* buf) const {
        if (!fp8()) return row;
        internal::v4_index_decode(reinterpret_cast<const uint8_t*>(row), cfg.index_head_dim, buf);
        return buf;
    }
    void moe(const V4Layer& L, const float* h, const Tokens& tk, float* out);
    void expert(const Expert& e, const float* x, int64_t n, float* y);
    void logits_of(const HcParams& hcp, const std::vector<float>& norm, const float* x,
                   std::span<const int64_t> rows, float* logits);
};

Status DeepseekV4Model::Impl::load_linear(const std::string& name, int64_t rows, int64_t cols,
                                          WeightClass cls, Linear& out) {
    DSI_ASSIGN_OR_RETURN(out.w, source->matrix(name, rows, cols));
    return internal::pack_linear(class_format, cls, out);
}

// Kept in its stored format whatever --weight-format says (f32 mixing weights).
Status DeepseekV4Model::Impl::load_exact(const std::string& name, int64_t rows, int64_t cols,
                                         Linear& out) {
    DSI_ASSIGN_OR_RETURN(out.w, source->matrix(name, rows, cols));
    return internal::pack_linear(internal::ClassFormats{}, WeightClass::kAttn, out);
}

Status DeepseekV4Model::Impl::load_hc(const std::string& prefix, int64_t mix, int64_t nscale,
                                      HcParams& p) {
    DSI_RETURN_IF_ERROR(load_exact(prefix + "_fn", mix, hc() * H(), p.fn));
    DSI_ASSIGN_OR_RETURN(p.base, source->vector(prefix + "_base", mix));
    DSI_ASSIGN_OR_RETURN(p.scale, source->vector(prefix + "_scale", nscale));
    return Status::ok();
}

Status DeepseekV4Model::Impl::load_compressor(const std::string& p, int64_t ratio, int64_t dim,
                                              Compressor& cp) {
    cp.ratio = ratio;
    cp.dim = dim;
    cp.coff = ratio == 4 ? 2 : 1;
    const int64_t w = cp.coff * dim;
    DSI_RETURN_IF_ERROR(load_linear(p + "wkv.weight", w, H(), WeightClass::kAttn, cp.wkv));
    DSI_RETURN_IF_ERROR(load_linear(p + "wgate.weight", w, H(), WeightClass::kAttn, cp.wgate));
    DSI_ASSIGN_OR_RETURN(WeightMatrix ape, source->matrix(p + "ape", ratio, w));
    cp.ape.resize(static_cast<size_t>(ratio * w));
    for (int64_t r = 0; r < ratio; ++r) ape.dequantize_row(r, cp.ape.data() + r * w);
    DSI_ASSIGN_OR_RETURN(cp.norm, source->vector(p + "norm.weight", dim));
    return Status::ok();
}

Status DeepseekV4Model::Impl::load_expert(const std::string& p, int64_t inter, WeightClass cls,
                                          Expert& e) {
    DSI_RETURN_IF_ERROR(load_linear(p + "w1.weight", inter, H(), cls, e.w1));
    DSI_RETURN_IF_ERROR(load_linear(p + "w2.weight", H(), inter, cls, e.w2));
    DSI_RETURN_IF_ERROR(load_linear(p + "w3.weight", inter, H(), cls, e.w3));
    return Status::ok();
}

Status DeepseekV4Model::Impl::load_layer(const std::string& p, int64_t index, V4Layer& L) {
    const ModelConfig& c = cfg;
    const int64_t nh = c.num_attention_heads;
    const int64_t hd = c.head_dim;
    const int64_t mix = (2 + hc()) * hc();
    L.index = index;
    L.ratio = c.compress_ratio(index);
    L.inv_freq = c.v4_rope_inv_freq(index);
    DSI_ASSIGN_OR_RETURN(L.attn_norm, source->vector(p + "attn_norm.weight", H()));
    DSI_ASSIGN_OR_RETURN(L.ffn_norm, source->vector(p + "ffn_norm.weight", H()));
    DSI_RETURN_IF_ERROR(load_hc(p + "hc_attn", mix, 3, L.hc_attn));
    DSI_RETURN_IF_ERROR(load_hc(p + "hc_ffn", mix, 3, L.hc_ffn));
    const std::string a = p + "attn.";
    DSI_RETURN_IF_ERROR(load_linear(a + "wq_a.weight", c.q_lora_rank, H(), WeightClass::kAttn, L.wq_a));
    DSI_ASSIGN_OR_RETURN(L.q_norm, source->vector(a + "q_norm.weight", c.q_lora_rank));
    DSI_RETURN_IF_ERROR(
        load_linear(a + "wq_b.weight", nh * hd, c.q_lora_rank, WeightClass::kAttn, L.wq_b));
    DSI_RETURN_IF_ERROR(load_linear(a + "wkv.weight", hd, H(), WeightClass::kAttn, L.wkv));
    DSI_ASSIGN_OR_RETURN(L.kv_norm, source->vector(a + "kv_norm.weight", hd));
    // wo_a [groups * o_lora, heads/groups * head_dim]: one slice of o_lora rows per group
    // (validate() keeps FP8 block rows inside a slice).
    const int64_t G = c.o_groups;
    const int64_t olr = c.o_lora_rank;
    DSI_ASSIGN_OR_RETURN(WeightMatrix wo_a,
                         source->matrix(a + "wo_a.weight", G * olr, nh * hd / G));
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
            internal::pack_linear(class_format, WeightClass::kAttn, L.wo_a[static_cast<size_t>(g)]));
    }
    DSI_RETURN_IF_ERROR(load_linear(a + "wo_b.weight", H(), G * olr, WeightClass::kAttn, L.wo_b));
    DSI_ASSIGN_OR_RETURN(L.sink, source->vector(a + "attn_sink", nh));
    if (L.ratio > 0) DSI_RETURN_IF_ERROR(load_compressor(a + "compressor.", L.ratio, hd, L.comp));
    if (L.ratio == 4) {
        DSI_RETURN_IF_ERROR(load_linear(a + "indexer.wq_b.weight", c.index_n_heads * c.index_head_dim,
                                        c.q_lora_rank, WeightClass::kAttn, L.idx_wq_b));
        DSI_RETURN_IF_ERROR(load_linear(a + "indexer.weights_proj.weight", c.index_n_heads, H(),
                                        WeightClass::kAttn, L.idx_weights));
        DSI_RETURN_IF_ERROR(
            load_compressor(a + "indexer.compressor.", 4, c.index_head_dim, L.idx_comp));
    }
    const std::string f = p + "ffn.";
    const int64_t E = c.n_routed_experts;
    DSI_RETURN_IF_ERROR(load_linear(f + "gate.weight", E, H(), WeightClass::kRouter, L.gate));
    L.hash = index < c.num_hash_layers;
    if (L.hash) {
        const std::string name = f + "gate.tid2eid";
        DSI_ASSIGN_OR_RETURN(L.tid2eid, source->int_matrix(name, c.vocab_size, c.num_experts_per_tok));
        const int64_t k = c.num_experts_per_tok;
        for (int64_t v = 0; v < c.vocab_size; ++v) {
            const int32_t* row = L.tid2eid.data() + v * k;
            for (int64_t j = 0; j < k; ++j) {
                if (row[j] < 0 || row[j] >= E || std::find(row, row + j, row[j]) != row + j) {
                    return invalid_argument(source->description() + ": tensor '" + name +
                                            "' row " + std::to_string(v) + " names expert " +
                                            std::to_string(row[j]) +
                                            " (outside [0, " + std::to_string(E) +
                                            ") or twice)");
                }
            }
        }
    } else {
        DSI_ASSIGN_OR_RETURN(L.gate_bias, source->vector(f + "gate.bias", E));
    }
    L.experts.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
        DSI_RETURN_IF_ERROR(load_expert(f + "experts." + std::to_string(e) + ".",
                                        c.moe_intermediate_size, WeightClass::kExperts,
                                        L.experts[static_cast<size_t>(e)]));
    }
    if (c.n_shared_experts > 0) {
        L.has_shared = true;
        DSI_RETURN_IF_ERROR(load_expert(f + "shared_experts.",
                                        c.n_shared_experts * c.moe_intermediate_size,
                                        WeightClass::kShared, L.shared));
    }
    return Status::ok();
}

void DeepseekV4Model::Impl::rope(const V4Layer& L, int64_t pos, float* v, int64_t num_vecs,
                                 int64_t stride, int64_t dim, bool inverse) const {
    const int64_t rd = cfg.qk_rope_head_dim;
    const int64_t pairs = rd / 2;
    float cc[512], ss[512];
    DSI_CHECK(rd <= 512);
    kernels::rope_table(pos, L.inv_freq.data(), pairs, 1.0, cc, ss);
    if (inverse) {
        for (int64_t i = 0; i < rd; ++i) ss[i] = -ss[i];
    }
    kernels::rope_apply(kernels::active_isa(), v + (dim - rd), num_vecs, stride, cc, ss, pairs);
}

void DeepseekV4Model::Impl::hc_pre(const HcParams& p, const float* x, int64_t n, float* xin,
                                   float* post, float* comb) {
    const int64_t hc = this->hc();
    const int64_t HD = hc * H();
    const int64_t mix = (2 + hc) * hc;
    const float eps = static_cast<float>(cfg.hc_eps);
    std::vector<float> mixes(static_cast<size_t>(n * mix));
    matmul(p.fn, x, n, mixes.data());
    const kernels::Isa isa = kernels::active_isa();
    for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * HD;
        float* m = mixes.data() + t * mix;
        // RMS of the unnormalised flat streams, no weight.
        const float rs = 1.0f / std::sqrt(kernels::dot(isa, xt, xt, HD) / static_cast<float>(HD) +
                                          static_cast<float>(cfg.rms_norm_eps));
        for (int64_t i = 0; i < mix; ++i) m[i] *= rs;
        float pre[64];
        DSI_CHECK(hc <= 64);
        for (int64_t j = 0; j < hc; ++j) {
            pre[j] = sigmoid(m[j] * p.scale[0] + p.base[j]) + eps;
            post[t * hc + j] = 2.0f * sigmoid(m[hc + j] * p.scale[1] + p.base[hc + j]);
        }
        float* C = comb + t * hc * hc;
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
        for (int64_t it = 1; it < cfg.hc_sinkhorn_iters; ++it) {
            for (int64_t j = 0; j < hc; ++j) {
                float s = 0.0f;
                for (int64_t k = 0; k < hc; ++k) s += C[j * hc + k];
                for (int64_t k = 0; k < hc; ++k) C[j * hc + k] /= s + eps;
            }
            normalise_cols();
        }
        float* out = xin + t * H();
        std::fill(out, out + H(), 0.0f);
        for (int64_t j = 0; j < hc; ++j) {
            const float* xj = xt + j * H();
            for (int64_t i = 0; i < H(); ++i) out[i] += pre[j] * xj[i];
        }
    }
}

void DeepseekV4Model::Impl::hc_post(const float* x, const float* y, const float* post,
                                    const float* comb, int64_t n, float* out) const {
    const int64_t hc = this->hc();
    const int64_t h = H();
    for (int64_t t = 0; t < n; ++t) {
        const float* C = comb + t * hc * hc;
        for (int64_t k = 0; k < hc; ++k) {
            float* o = out + (t * hc + k) * h;
            const float pk = post[t * hc + k];
            const float* yt = y + t * h;
            for (int64_t i = 0; i < h; ++i) o[i] = pk * yt[i];
            for (int64_t j = 0; j < hc; ++j) {
                const float c = C[j * hc + k];
                const float* xj = x + (t * hc + j) * h;
                for (int64_t i = 0; i < h; ++i) o[i] += c * xj[i];
            }
        }
    }
}

void DeepseekV4Model::Impl::hc_collapse(const HcParams& p, const float* x, int64_t n, float* y) {
    const int64_t hc = this->hc();
    const int64_t HD = hc * H();
    std::vector<float> mixes(static_cast<size_t>(n * hc));
    matmul(p.fn, x, n, mixes.data());
    const kernels::Isa isa = kernels::active_isa();
    const float eps = static_cast<float>(cfg.hc_eps);
    for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * HD;
        const float rs = 1.0f / std::sqrt(kernels::dot(isa, xt, xt, HD) / static_cast<float>(HD) +
                                          static_cast<float>(cfg.rms_norm_eps));
        float* out = y + t * H();
        std::fill(out, out + H(), 0.0f);
        for (int64_t j = 0; j < hc; ++j) {
            const float pre = sigmoid(mixes[t * hc + j] * rs * p.scale[0] + p.base[j]) + eps;
            const float* xj = xt + j * H();
            for (int64_t i = 0; i < H(); ++i) out[i] += pre * xj[i];
        }
    }
}

// Gated pooling with partial-window state (reference §2.3): each token's kv and
// score rows go into the accumulator; at a group end the entry is the per-channel
// softmax(score)-weighted sum of the group's rows (ratio 4: the previous group's
// first-half channels and this group's second-half channels, 8 candidates), then
// RMSNorm and RoPE at the group's first position.
void DeepseekV4Model::Impl::compress(const V4Layer& L, const Compressor& cp, const float* h,
                                     const Tokens& tk, bool indexer) {
    const int64_t n = tk.size();
    const int64_t r = cp.ratio;
    const int64_t D = cp.dim;
    const int64_t W = cp.coff * D;
    std::vector<float> kv(static_cast<size_t>(n * W)), sc(static_cast<size_t>(n * W));
    matmul(cp.wkv, h, n, kv.data());
    matmul(cp.wgate, h, n, sc.data());
    std::vector<float> entry(static_cast<size_t>(D));
    for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = tk.pos[t];
        const CompView cs = comp_state(L, tk.cache[t], indexer);
        const int64_t row = (cp.coff == 2 ? r : 0) + pos % r;
        float* kv_row = cs.kv + row * W;
        float* sc_row = cs.score + row * W;
        const float* ape = cp.ape.data() + (pos % r) * W;
        for (int64_t i = 0; i < W; ++i) {
            kv_row[i] = kv[t * W + i];
            sc_row[i] = sc[t * W + i] + ape[i];
        }
        if ((pos + 1) % r != 0) continue;
        // Candidates per channel c: (row, column) pairs in a fixed order.
        for (int64_t c = 0; c < D; ++c) {
            float mx = -INFINITY;
            const int64_t nrows = cp.coff * r;
            auto col_of = [&](int64_t j) { return cp.coff == 2 && j >= r ? D + c : c; };
            for (int64_t j = 0; j < nrows; ++j) mx = std::max(mx, cs.score[j * W + col_of(j)]);
            float sum = 0.0f, acc = 0.0f;
            for (int64_t j = 0; j < nrows; ++j) {
                const float e = std::exp(cs.score[j * W + col_of(j)] - mx);
                sum += e;
                acc += e * cs.kv[j * W + col_of(j)];
            }
            entry[static_cast<size_t>(c)] = acc / sum;
        }
        if (cp.coff == 2) {
            // This group's rows become the next group's previous rows.
            std::copy(cs.kv + r * W, cs.kv + cs.floats, cs.kv);
            std::copy(cs.score + r * W, cs.score + cs.floats, cs.score);
        }
        const int64_t i = pos / r;
        float* dst = entry_ptr(L, tk.cache[t], i, indexer);
        rms_norm(entry.data(), cp.norm.data(), 1, D, entry.data());
        rope(L, i * r, entry.data(), 1, D, D, false);
        if (!fp8()) {
            std::copy(entry.begin(), entry.end(), dst);
        } else if (indexer) {
            internal::hadamard_rotate(entry.data(), D);
            internal::v4_index_encode(entry.data(), D, reinterpret_cast<uint8_t*>(dst));
        } else {
            internal::v4_main_encode(entry.data(), D, cfg.qk_rope_head_dim, reinterpret_cast<uint8_t*>(dst));
        }
    }
}

void DeepseekV4Model::Impl::attention(const V4Layer& L, const float* h, const Tokens& tk,
                                      float* out) {
    const ModelConfig& c = cfg;
    const int64_t n = tk.size();
    const int64_t nh = c.num_attention_heads;
    const int64_t hd = c.head_dim;
    const int64_t qlr = c.q_lora_rank;
    const int64_t win = c.sliding_window;
    std::vector<float> qr(static_cast<size_t>(n * qlr));
    matmul(L.wq_a, h, n, qr.data());
    rms_norm(qr.data(), L.q_norm.data(), n, qlr, qr.data());
    std::vector<float> q(static_cast<size_t>(n * nh * hd));
    matmul(L.wq_b, qr.data(), n, q.data());
    rms_norm(q.data(), ones.data(), n * nh, hd, q.data());  // per head, no weight
    std::vector<float> kv(static_cast<size_t>(n * hd));
    matmul(L.wkv, h, n, kv.data());
    rms_norm(kv.data(), L.kv_norm.data(), n, hd, kv.data());
    for (int64_t t = 0; t < n; ++t) {
        rope(L, tk.pos[t], q.data() + t * nh * hd, nh, hd, hd, false);
        rope(L, tk.pos[t], kv.data() + t * hd, 1, hd, hd, false);
    }
    // e4m3: the rows as stored (kvq, into the ring below), and the chunk's queries
    // read them as stored too, so a chunk equals token-by-token decode bitwise.
    std::vector<float> kvq;
    if (fp8()) {
        kvq.resize(static_cast<size_t>(n * main_words));
        for (int64_t t = 0; t < n; ++t) {
            auto* row = reinterpret_cast<uint8_t*>(kvq.data() + t * main_words);
            internal::v4_main_encode(kv.data() + t * hd, hd, c.qk_rope_head_dim, row);
            internal::v4_main_decode(row, hd, c.qk_rope_head_dim, kv.data() + t * hd);
        }
    }
    if (L.ratio > 0) compress(L, L.comp, h, tk, false);
    // The indexer (ratio 4): per token, the compressed entries it attends to.
    std::vector<std::vector<int32_t>> chosen(static_cast<size_t>(n));
    if (L.ratio == 4) {
        compress(L, L.idx_comp, h, tk, true);
        const int64_t ih = c.index_n_heads;
        const int64_t ihd = c.index_head_dim;
        std::vector<float> qi(static_cast<size_t>(n * ih * ihd));
        matmul(L.idx_wq_b, qr.data(), n, qi.data());
        std::vector<float> wi(static_cast<size_t>(n * ih));
        matmul(L.idx_weights, h, n, wi.data());
        const float wscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ihd)) /
                                                std::sqrt(static_cast<double>(ih)));
        for (int64_t t = 0; t < n; ++t) rope(L, tk.pos[t], qi.data() + t * ih * ihd, ih, ihd, ihd, false);
        if (fp8()) {  // the keys' rotation, and the queries quantised as the keys are
            for (int64_t v = 0; v < n * ih; ++v) {
                internal::hadamard_rotate(qi.data() + v * ihd, ihd);
                internal::v4_fp4_simulate(qi.data() + v * ihd, ihd);
            }
        }
        pool->parallel_for(n, 1, [&](int64_t begin, int64_t end) {
            const kernels::Isa isa = kernels::active_isa();
            std::vector<float> score, buf(static_cast<size_t>(ihd));
            for (int64_t t = begin; t < end; ++t) {
                const int64_t visible = (tk.pos[t] + 1) / 4;
                score.assign(static_cast<size_t>(visible), 0.0f);
                for (int64_t e = 0; e < visible; ++e) {
                    const float* key = key_row(entry_ptr(L, tk.cache[t], e, true), buf.data());
                    float s = 0.0f;
                    for (int64_t hh = 0; hh < ih; ++hh) {
                        const float d = kernels::dot(isa, qi.data() + (t * ih + hh) * ihd, key, ihd);
                        s += std::max(d, 0.0f) * (wi[t * ih + hh] * wscale);
                    }
                    score[static_cast<size_t>(e)] = s;
                }
                const int64_t k = std::min(visible, c.index_topk);
                std::vector<int32_t>& ids = chosen[static_cast<size_t>(t)];
                ids.resize(static_cast<size_t>(k));
                kernels::top_k(score.data(), visible, k, ids.data());
                std::sort(ids.begin(), ids.end());
            }
        });
    } else if (L.ratio == 128) {
        for (int64_t t = 0; t < n; ++t) {
            std::vector<int32_t>& ids = chosen[static_cast<size_t>(t)];
            ids.resize(static_cast<size_t>((tk.pos[t] + 1) / 128));
            std::iota(ids.begin(), ids.end(), 0);
        }
    }
    // Attention per (token, head): compressed entries (ascending), then the window
    // (ascending positions), then the sink; one softmax in that fixed order.
    std::vector<float> o(static_cast<size_t>(n * nh * hd));
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    pool->parallel_for(n, 1, [&](int64_t begin, int64_t end) {
        const kernels::Isa isa = kernels::active_isa();
        std::vector<const float*> keys;
        std::vector<float> p, decoded;
        for (int64_t t = begin; t < end; ++t) {
            const int64_t pos = tk.pos[t];
            const std::vector<int32_t>& ids = chosen[static_cast<size_t>(t)];
            // e4m3: stored rows are decoded once per token (not per head).
            if (fp8()) decoded.resize(static_cast<size_t>((ids.size() + static_cast<size_t>(win)) * hd));
            int64_t used = 0;
            auto stored = [&](const float* row) {
                return main_row(row, fp8() ? decoded.data() + (used++) * hd : nullptr);
            };
            keys.clear();
            for (int32_t e : ids) keys.push_back(stored(entry_ptr(L, tk.cache[t], e, false)));
            for (int64_t s = std::max<int64_t>(0, pos - win + 1); s <= pos; ++s) {
                keys.push_back(s >= tk.chunk_start[t]
                                   ? kv.data() + (tk.chunk_first[t] + s - tk.chunk_start[t]) * hd
                                   : stored(ring_row(L, tk.cache[t], s)));
            }
            p.resize(keys.size());
            for (int64_t hh = 0; hh < nh; ++hh) {
                const float* qh = q.data() + (t * nh + hh) * hd;
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
                float* oh = o.data() + (t * nh + hh) * hd;
                std::fill(oh, oh + hd, 0.0f);
                for (size_t i = 0; i < keys.size(); ++i) {
                    const float w = p[i] / sum;
                    const float* k = keys[i];
                    for (int64_t d = 0; d < hd; ++d) oh[d] += w * k[d];
                }
            }
        }
    });
    // The chunk's raw KV rows into each sequence's window ring (after every query
    // of the chunk has read the old rows).
    const float* rows = fp8() ? kvq.data() : kv.data();
    for (int64_t t = 0; t < n; ++t) {
        std::copy_n(rows + t * main_words, main_words, ring_row(L, tk.cache[t], tk.pos[t]));
    }
    // Inverse RoPE on the output's rope dims, at the query's position.
    for (int64_t t = 0; t < n; ++t) rope(L, tk.pos[t], o.data() + t * nh * hd, nh, hd, hd, true);
    // Grouped low-rank output: group g's heads through wo_a's slice g, then wo_b.
    const int64_t G = c.o_groups;
    const int64_t olr = c.o_lora_rank;
    const int64_t gw = nh / G * hd;
    std::vector<float> og(static_cast<size_t>(n * gw)), yg(static_cast<size_t>(n * olr));
    std::vector<float> low(static_cast<size_t>(n * G * olr));
    for (int64_t g = 0; g < G; ++g) {
        for (int64_t t = 0; t < n; ++t) std::copy_n(o.data() + t * nh * hd + g * gw, gw, og.data() + t * gw);
        matmul(L.wo_a[static_cast<size_t>(g)], og.data(), n, yg.data());
        for (int64_t t = 0; t < n; ++t) std::copy_n(yg.data() + t * olr, olr, low.data() + t * G * olr + g * olr);
    }
    matmul(L.wo_b, low.data(), n, out);
}

void DeepseekV4Model::Impl::expert(const Expert& e, const float* x, int64_t n, float* y) {
    const int64_t inter = e.w1.rows();
    std::vector<float> g(static_cast<size_t>(n * inter)), u(static_cast<size_t>(n * inter));
    matmul(e.w1, x, n, g.data());
    matmul(e.w3, x, n, u.data());
    const float lim = static_cast<float>(cfg.swiglu_limit);
    if (lim > 0) {
        for (size_t i = 0; i < g.size(); ++i) {
            g[i] = std::min(g[i], lim);
            u[i] = std::clamp(u[i], -lim, lim);
        }
    }
    kernels::silu_mul(kernels::active_isa(), g.data(), u.data(), n * inter, g.data());
    matmul(e.w2, g.data(), n, y);
}

void DeepseekV4Model::Impl::moe(const V4Layer& L, const float* h, const Tokens& tk, float* out) {
    const ModelConfig& c = cfg;
    const int64_t n = tk.size();
    const int64_t E = c.n_routed_experts;
    const int64_t k = c.num_experts_per_tok;
    const int64_t hid = H();
    std::vector<float> logits(static_cast<size_t>(n * E));
    matmul(L.gate, h, n, logits.data());
    // Per token: (expert, weight) pairs sorted by expert id (one fixed sum order).
    std::vector<std::vector<std::pair<int32_t, float>>> routes(static_cast<size_t>(n));
    std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
    std::vector<int32_t> ids(static_cast<size_t>(k));
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t e = 0; e < E; ++e) {
            const float x = logits[t * E + e];
            const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
            s[static_cast<size_t>(e)] = std::sqrt(sp);
        }
        if (L.hash) {
            std::copy_n(L.tid2eid.data() + static_cast<int64_t>(tk.ids[t]) * k, k, ids.data());
        } else {
            for (int64_t e = 0; e < E; ++e) choice[e] = s[e] + L.gate_bias[e];
            kernels::top_k(choice.data(), E, k, ids.data());
        }
        auto& r = routes[static_cast<size_t>(t)];
        r.clear();
        float sum = 0.0f;
        for (int32_t e : ids) {
            r.emplace_back(e, s[static_cast<size_t>(e)]);
            sum += s[static_cast<size_t>(e)];
        }
        for (auto& [e, w] : r) {
            if (c.norm_topk_prob) w /= sum;
            w *= static_cast<float>(c.routed_scaling_factor);
        }
        std::sort(r.begin(), r.end());
    }
    std::vector<std::vector<int64_t>> tokens_of(static_cast<size_t>(E));
    for (int64_t t = 0; t < n; ++t) {
        for (auto& [e, w] : routes[static_cast<size_t>(t)]) tokens_of[static_cast<size_t>(e)].push_back(t);
    }
    std::vector<float> y_routed(static_cast<size_t>(n * k * hid));
    for (int64_t e = 0; e < E; ++e) {
        const auto& toks = tokens_of[static_cast<size_t>(e)];
        if (toks.empty()) continue;
        const int64_t m = static_cast<int64_t>(toks.size());
        std::vector<float> xin(static_cast<size_t>(m * hid)), y(static_cast<size_t>(m * hid));
        for (int64_t i = 0; i < m; ++i) std::copy_n(h + toks[i] * hid, hid, xin.data() + i * hid);
        expert(L.experts[static_cast<size_t>(e)], xin.data(), m, y.data());
        for (int64_t i = 0; i < m; ++i) {
            const auto& r = routes[static_cast<size_t>(toks[i])];
            int64_t j = 0;
            while (r[static_cast<size_t>(j)].first != e) ++j;
            std::copy_n(y.data() + i * hid, hid, y_routed.data() + (toks[i] * k + j) * hid);
        }
    }
    std::fill(out, out + n * hid, 0.0f);
    for (int64_t t = 0; t < n; ++t) {
        const auto& r = routes[static_cast<size_t>(t)];
        for (int64_t j = 0; j < static_cast<int64_t>(r.size()); ++j) {
            const float w = r[static_cast<size_t>(j)].second;
            const float* y = y_routed.data() + (t * k + j) * hid;
            for (int64_t i = 0; i < hid; ++i) out[t * hid + i] += w * y[i];
        }
    }
    if (L.has_shared) {
        std::vector<float> sh(static_cast<size_t>(n * hid));
        expert(L.shared, h, n, sh.data());
        for (int64_t i = 0; i < n * hid; ++i) out[i] += sh[i];
    }
}

void DeepseekV4Model::Impl::block(const V4Layer& L, float* x, const Tokens& tk) {
    const int64_t n = tk.size();
    const int64_t hc = this->hc();
    const int64_t hid = H();
    std::vector<float> xin(static_cast<size_t>(n * hid)), y(static_cast<size_t>(n * hid));
    std::vector<float> post(static_cast<size_t>(n * hc)), comb(static_cast<size_t>(n * hc * hc));
    std::vector<float> next(static_cast<size_t>(n * hc * hid));
    hc_pre(L.hc_attn, x, n, xin.data(), post.data(), comb.data());
    rms_norm(xin.data(), L.attn_norm.data(), n, hid, xin.data());
    attention(L, xin.data(), tk, y.data());
    hc_post(x, y.data(), post.data(), comb.data(), n, next.data());
    std::copy(next.begin(), next.end(), x);
    hc_pre(L.hc_ffn, x, n, xin.data(), post.data(), comb.data());
    rms_norm(xin.data(), L.ffn_norm.data(), n, hid, xin.data());
    moe(L, xin.data(), tk, y.data());
    hc_post(x, y.data(), post.data(), comb.data(), n, next.data());
    std::copy(next.begin(), next.end(), x);
}

void DeepseekV4Model::Impl::logits_of(const HcParams& hcp, const std::vector<float>& norm,
                                      const float* x, std::span<const int64_t> rows,
                                      float* logits) {
    const int64_t m = static_cast<int64_t>(rows.size());
    const int64_t HD = hc() * H();
    std::vector<float> xs(static_cast<size_t>(m * HD)), y(static_cast<size_t>(m * H()));
    for (int64_t r = 0; r < m; ++r) std::copy_n(x + rows[static_cast<size_t>(r)] * HD, HD, xs.data() + r * HD);
    hc_collapse(hcp, xs.data(), m, y.data());
    rms_norm(y.data(), norm.data(), m, H(), y.data());
    matmul(head, y.data(), m, logits);
}

// ---- public API ----

DeepseekV4Model::DeepseekV4Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeepseekV4Model::~DeepseekV4Model() = default;
const ModelConfig& DeepseekV4Model::config() const { return impl_->cfg; }

Result<std::unique_ptr<DeepseekV4Model>> DeepseekV4Model::load(
    std::unique_ptr<WeightSource> source, Options options) {
    auto impl = std::make_unique<Impl>();
    impl->cfg = source->config();
    if (!impl->cfg.is_v4()) {
        return invalid_argument(source->description() + ": architecture '" +
                                impl->cfg.architecture + "' is not DeepseekV4ForCausalLM");
    }
    DSI_RETURN_IF_ERROR(impl->cfg.validate());
    impl->source = std::move(source);
    impl->pool = std::make_unique<ThreadPool>(options.num_threads);
    DSI_RETURN_IF_ERROR(internal::parse_weight_formats(options.weight_format, impl->class_format));
    const ModelConfig& c = impl->cfg;
    WeightSource& src = *impl->source;
    impl->kv_dtype = options.kv_dtype;
    if (options.kv_dtype == kernels::KvDtype::kBf16) {
        return invalid_argument("DeepSeek V4: kv dtype 'bf16' is not supported (f32 or e4m3)");
    }
    if (impl->fp8() && (c.index_head_dim % 32 != 0 || (c.index_head_dim & (c.index_head_dim - 1)) != 0)) {
        return invalid_argument(
            "DeepSeek V4: kv dtype 'e4m3' needs a power-of-two index_head_dim of at least 32 (its "
            "keys are Hadamard-rotated MXFP4); the config has " + std::to_string(c.index_head_dim));
    }
    const int64_t H = c.hidden_size;
    impl->ones.assign(static_cast<size_t>(c.head_dim), 1.0f);
    DSI_ASSIGN_OR_RETURN(impl->embed, src.matrix("embed.weight", c.vocab_size, H));
    impl->layers.resize(static_cast<size_t>(c.num_hidden_layers));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        DSI_RETURN_IF_ERROR(
            impl->load_layer("layers." + std::to_string(i) + ".", i, impl->layers[static_cast<size_t>(i)]));
    }
    DSI_ASSIGN_OR_RETURN(impl->final_norm, src.vector("norm.weight", H));
    DSI_RETURN_IF_ERROR(impl->load_hc("hc_head", c.hc_mult, 1, impl->hc_head));
    DSI_RETURN_IF_ERROR(
        impl->load_linear("head.weight", c.vocab_size, H, WeightClass::kHead, impl->head));
    if (c.num_nextn_predict_layers > 0) {
        V4Mtp m;
        const std::string p = "mtp.0.";
        DSI_RETURN_IF_ERROR(impl->load_linear(p + "e_proj.weight", H, H, WeightClass::kAttn, m.e_proj));
        DSI_RETURN_IF_ERROR(impl->load_linear(p + "h_proj.weight", H, H, WeightClass::kAttn, m.h_proj));
        DSI_ASSIGN_OR_RETURN(m.enorm, src.vector(p + "enorm.weight", H));
        DSI_ASSIGN_OR_RETURN(m.hnorm, src.vector(p + "hnorm.weight", H));
        DSI_ASSIGN_OR_RETURN(m.norm, src.vector(p + "norm.weight", H));
        // A GGUF (llama.cpp's deepseek4 layout) has no MTP hc_head: the trunk's is used, as
        // llama.cpp does.
        if (src.has(p + "hc_head_fn")) {
            DSI_RETURN_IF_ERROR(impl->load_hc(p + "hc_head", c.hc_mult, 1, m.head));
        } else {
            m.head = impl->hc_head;
        }
        DSI_RETURN_IF_ERROR(impl->load_layer(p, c.num_hidden_layers, m.block));
        impl->mtp = std::move(m);
    }
    impl->plan_cache();
    return std::unique_ptr<DeepseekV4Model>(new DeepseekV4Model(std::move(impl)));
}

void DeepseekV4Model::Impl::plan_cache() {
    const ModelConfig& c = cfg;
    // Rows in 4-byte words (a key row of index_head_dim 64 is 34 bytes: padded to 36).
    main_words = fp8() ? (internal::v4_main_row_bytes(c.head_dim, c.qk_rope_head_dim) + 3) / 4 : c.head_dim;
    key_words = fp8() && c.index_head_dim > 0 ? (internal::v4_index_row_bytes(c.index_head_dim) + 3) / 4
                                               : c.index_head_dim;
    const int64_t nl = c.num_hidden_layers + (mtp ? 1 : 0);
    slots.assign(static_cast<size_t>(nl), LayerSlots{});
    int64_t n4 = 0, n128 = 0;
    for (int64_t i = 0; i < nl; ++i) {
        const int64_t r = c.compress_ratio(i);
        if (r == 4) slots[static_cast<size_t>(i)].group_layer = n4++;
        if (r == 128) slots[static_cast<size_t>(i)].group_layer = n128++;
    }
    layout = KvLayout{};
    int g4 = -1, g4i = -1, g128 = -1;
    if (n4 > 0) {
        g4 = static_cast<int>(layout.groups.size());
        layout.groups.push_back({"c4", n4, 4, main_words});
        g4i = static_cast<int>(layout.groups.size());
        layout.groups.push_back({"c4_index", n4, 4, key_words});
    }
    if (n128 > 0) {
        g128 = static_cast<int>(layout.groups.size());
        layout.groups.push_back({"c128", n128, 128, main_words});
    }
    // A model without compressed layers still pages its positions (the engine counts
    // a sequence's length in blocks): one word per block.
    if (layout.groups.empty()) layout.groups.push_back({"positions", 1, 128, 1});
    int64_t off = kHeaderFloats;
    for (int64_t i = 0; i < nl; ++i) {
        LayerSlots& s = slots[static_cast<size_t>(i)];
        const int64_t r = c.compress_ratio(i);
        s.ring = off;
        off += c.sliding_window * main_words;
        if (r > 0) {
            const int64_t coff = r == 4 ? 2 : 1;
            s.comp = off;
            s.comp_floats = coff * r * coff * c.head_dim;
            off += 2 * s.comp_floats;
            s.entries_group = r == 4 ? g4 : g128;
        }
        if (r == 4) {
            s.idx_comp = off;
            s.idx_comp_floats = 2 * r * 2 * c.index_head_dim;
            off += 2 * s.idx_comp_floats;
            s.keys_group = g4i;
        }
    }
    layout.state_floats = off;
    layout.prefix_reusable = false;
    layout.not_reusable_reason =
        "DeepSeek V4 keeps a sliding-window ring and compressor partial windows per sequence "
        "that paged blocks cannot restore (prefixes are cached in this process with copies "
        "of that state: docs/swa_cache.md)";
    // The slot holds the lengths, every window ring (position p at p % window) and the
    // compressors' accumulators (at a block boundary: the ratio-4 overlap rows of the
    // group before it), all position-addressed: a copy taken after B tokens resumes at B.
    layout.state_snapshot_resumes = true;
}

void DeepseekV4Model::Impl::reset_state(float* slot) const {
    header_set(slot, 0, 0);
    header_set(slot, 1, 0);
    for (const LayerSlots& s : slots) {
        if (s.comp >= 0) {
            std::fill_n(slot + s.comp, s.comp_floats, 0.0f);
            std::fill_n(slot + s.comp + s.comp_floats, s.comp_floats, -INFINITY);
        }
        if (s.idx_comp >= 0) {
            std::fill_n(slot + s.idx_comp, s.idx_comp_floats, 0.0f);
            std::fill_n(slot + s.idx_comp + s.idx_comp_floats, s.idx_comp_floats, -INFINITY);
        }
    }
}

KvLayout DeepseekV4Model::kv_layout() const { return impl_->layout; }
kernels::KvDtype DeepseekV4Model::kv_dtype() const { return impl_->kv_dtype; }

std::unique_ptr<KvCache> DeepseekV4Model::new_kv_cache(int64_t capacity) const {
    auto cache = std::make_unique<ContiguousKvCache>(impl_->layout, capacity);
    impl_->reset_state(cache->state());
    return cache;
}

std::unique_ptr<V4State> DeepseekV4Model::new_state(int64_t capacity) const {
    auto st = std::make_unique<V4State::Impl>();
    st->cache = std::make_unique<ContiguousKvCache>(impl_->layout, capacity);
    impl_->reset_state(st->cache->state());
    return std::unique_ptr<V4State>(new V4State(std::move(st)));
}

Status DeepseekV4Model::forward(std::span<const int32_t> tokens, int64_t start_pos,
                                V4State& state, bool all_logits, V4Output& out) {
    V4Step step{tokens, start_pos, &state, all_logits};
    return forward_batch(std::span<const V4Step>(&step, 1), out);
}

Status DeepseekV4Model::Impl::gather(std::span<const SequenceStep> steps, Tokens& tk,
                                     std::vector<int64_t>& logit_tokens,
                                     std::vector<int64_t>& logit_row) {
    const ModelConfig& c = cfg;
    if (steps.empty()) return invalid_argument("forward: empty batch");
    logit_row.clear();
    for (size_t i = 0; i < steps.size(); ++i) {
        const SequenceStep& st = steps[i];
        const std::string which = "forward: sequence " + std::to_string(i);
        const int64_t T = static_cast<int64_t>(st.tokens.size());
        if (T == 0) return invalid_argument(which + " has no tokens");
        if (st.cache == nullptr || st.cache->state() == nullptr) {
            return invalid_argument(which + " has no V4 state (a cache of kv_layout())");
        }
        const int64_t length = header_get(st.cache->state(), 0);
        if (st.start_pos != 0 && st.start_pos != length) {
            return invalid_argument(which + " starts at position " + std::to_string(st.start_pos) +
                                    " but its state holds " + std::to_string(length) +
                                    " positions (V4 state is sequential)");
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
    // Every step is valid: sequences at position 0 start afresh.
    for (const SequenceStep& st : steps) {
        if (st.start_pos == 0) reset_state(st.cache->state());
    }
    return Status::ok();
}

void DeepseekV4Model::Impl::run(std::span<const SequenceStep> steps, const Tokens& tk,
                                std::vector<float>& x,
                                std::vector<std::vector<float>>* layer_streams) {
    const int64_t n = tk.size();
    const int64_t hc = this->hc();
    x.resize(static_cast<size_t>(n * hc * H()));
    for (int64_t t = 0; t < n; ++t) {
        float* xt = x.data() + t * hc * H();
        embed.dequantize_row(tk.ids[static_cast<size_t>(t)], xt);
        for (int64_t j = 1; j < hc; ++j) std::copy_n(xt, H(), xt + j * H());
    }
    if (layer_streams != nullptr) layer_streams->clear();
    for (const V4Layer& L : layers) {
        block(L, x.data(), tk);
        if (layer_streams != nullptr) layer_streams->push_back(x);
    }
    for (const SequenceStep& st : steps) {
        float* slot = st.cache->state();
        header_set(slot, 0, header_get(slot, 0) + static_cast<int64_t>(st.tokens.size()));
    }
}

Status DeepseekV4Model::forward_batch(std::span<const V4Step> steps, V4Output& out) {
    Impl& m = *impl_;
    std::vector<SequenceStep> seq(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
        const V4Step& st = steps[i];
        if (st.state == nullptr) {
            return invalid_argument("forward: sequence " + std::to_string(i) + " has no state");
        }
        seq[i] = {st.tokens, st.start_pos, st.state->impl_->cache.get(), st.all_logits};
    }
    Tokens tk;
    std::vector<int64_t> logit_tokens;
    DSI_RETURN_IF_ERROR(m.gather(seq, tk, logit_tokens, out.logit_row));
    std::vector<float> x;
    m.run(seq, tk, x, out.capture_layers ? &out.layer_streams : nullptr);
    if (!out.capture_layers) out.layer_streams.clear();
    out.logits.resize(logit_tokens.size() * static_cast<size_t>(m.cfg.vocab_size));
    m.logits_of(m.hc_head, m.final_norm, x.data(), logit_tokens, out.logits.data());
    out.streams = std::move(x);
    return Status::ok();
}

Status DeepseekV4Model::forward_batch(std::span<const SequenceStep> steps, BatchOutput& out) {
    Impl& m = *impl_;
    Tokens tk;
    std::vector<int64_t> logit_tokens;
    DSI_RETURN_IF_ERROR(m.gather(steps, tk, logit_tokens, out.logit_row));
    std::vector<float> x;
    m.run(steps, tk, x, nullptr);
    out.logits.resize(logit_tokens.size() * static_cast<size_t>(m.cfg.vocab_size));
    m.logits_of(m.hc_head, m.final_norm, x.data(), logit_tokens, out.logits.data());
    out.hidden.clear();
    return Status::ok();
}
Status DeepseekV4Model::mtp_forward(std::span<const int32_t> next_tokens,
                                    std::span<const float> streams, int64_t start_pos,
                                    V4State& state, std::vector<float>& logits) {
    Impl& m = *impl_;
    if (!m.mtp) return failed_precondition("mtp_forward: the checkpoint has no MTP layer");
    const ModelConfig& c = m.cfg;
    const int64_t T = static_cast<int64_t>(next_tokens.size());
    const int64_t H = c.hidden_size;
    const int64_t hc = c.hc_mult;
    if (T == 0 || static_cast<int64_t>(streams.size()) != T * hc * H) {
        return invalid_argument("mtp_forward: streams must be [tokens, hc_mult, hidden_size]");
    }
    for (int32_t id : next_tokens) {
        if (id < 0 || id >= c.vocab_size) return invalid_argument("mtp_forward: token id out of range");
    }
    KvCache* s = state.impl_->cache.get();
    const int64_t mtp_length = header_get(s->state(), 1);
    if (start_pos != mtp_length) {
        return invalid_argument("mtp_forward: starts at " + std::to_string(start_pos) +
                                " but the MTP state holds " + std::to_string(mtp_length));
    }
    if (start_pos + T > s->capacity()) return out_of_range("mtp_forward: positions exceed the capacity");
    const V4Mtp& mtp = *m.mtp;
    Tokens tk;
    for (int64_t t = 0; t < T; ++t) {
        tk.ids.push_back(next_tokens[static_cast<size_t>(t)]);
        tk.pos.push_back(start_pos + t);
        tk.cache.push_back(s);
        tk.chunk_first.push_back(0);
        tk.chunk_start.push_back(start_pos);
    }
    // x = e_proj(enorm(embed(next))) + h_proj(hnorm(stream)) for every stream.
    std::vector<float> e(static_cast<size_t>(T * H)), ep(static_cast<size_t>(T * H));
    for (int64_t t = 0; t < T; ++t) m.embed.dequantize_row(next_tokens[static_cast<size_t>(t)], e.data() + t * H);
    m.rms_norm(e.data(), mtp.enorm.data(), T, H, e.data());
    m.matmul(mtp.e_proj, e.data(), T, ep.data());
    std::vector<float> hn(static_cast<size_t>(T * hc * H)), x(static_cast<size_t>(T * hc * H));
    m.rms_norm(streams.data(), mtp.hnorm.data(), T * hc, H, hn.data());
    m.matmul(mtp.h_proj, hn.data(), T * hc, x.data());
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < hc; ++j) {
            float* xr = x.data() + (t * hc + j) * H;
            for (int64_t i = 0; i < H; ++i) xr[i] += ep[t * H + i];
        }
    }
    m.block(mtp.block, x.data(), tk);
    header_set(s->state(), 1, mtp_length + T);
    std::vector<int64_t> rows(static_cast<size_t>(T));
    std::iota(rows.begin(), rows.end(), 0);
    logits.resize(static_cast<size_t>(T * c.vocab_size));
    m.logits_of(mtp.head, mtp.norm, x.data(), rows, logits.data());
    return Status::ok();
}

}  // namespace dsi
