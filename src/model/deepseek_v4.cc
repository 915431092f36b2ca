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
#include "model/internal/v4_blocks.h"
#include "model/internal/v4_kv_format.h"

namespace dsi {
namespace {

using internal::AttnCore;
using internal::HcParams;
using internal::header_get;
using internal::header_set;
using internal::Linear;
using internal::Moe;
using internal::Tokens;
using internal::WeightClass;

struct Compressor {
    int64_t ratio = 0;
    int64_t dim = 0;   // D: entry width
    int64_t coff = 1;  // 2 with the ratio-4 overlap
    Linear wkv, wgate;
    std::vector<float> ape;  // [ratio, coff * dim]
    std::vector<float> norm;
};

struct V4Layer {
    int64_t index = 0;
    int64_t ratio = 0;
    std::vector<float> attn_norm, ffn_norm;
    HcParams hc_attn, hc_ffn;
    AttnCore attn;
    Compressor comp;  // ratio > 0
    Linear idx_wq_b, idx_weights;
    Compressor idx_comp;  // ratio 4
    Moe moe;
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
    int entries_group = -1;   // entry i (tokens [i * ratio, (i + 1) * ratio)) per layer
    int keys_group = -1;      // indexer key i (ratio 4)
    int64_t group_layer = 0;  // the layer's index inside its groups
};

// A compressor's partial-window accumulator in the slot: kv and score rows.
struct CompView {
    float* kv = nullptr;
    float* score = nullptr;
    int64_t floats = 0;  // of each
};

constexpr int64_t kHeaderFloats = internal::kStateHeaderFloats;

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

struct DeepseekV4Model::Impl {
    std::unique_ptr<WeightSource> source;
    ModelConfig cfg;
    std::unique_ptr<ThreadPool> pool;
    internal::V4Loader loader;  // the source and the --weight-format classes
    WeightMatrix embed;
    std::vector<V4Layer> layers;
    std::vector<float> final_norm;
    HcParams hc_head;
    Linear head;
    std::optional<V4Mtp> mtp;
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
    // Under expert parallelism a collective (the pass starts here); a failure leaves the
    // group.
    Status run(std::span<const SequenceStep> steps, const Tokens& tk, std::vector<float>& x,
               std::vector<std::vector<float>>* layer_streams);

    int64_t hc() const { return cfg.hc_mult; }
    int64_t H() const { return cfg.hidden_size; }

    Status load_linear(const std::string& name, int64_t rows, int64_t cols, WeightClass cls,
                       Linear& out) {
        return loader.linear(name, rows, cols, cls, out);
    }
    Status load_hc(const std::string& prefix, int64_t mix, int64_t nscale, HcParams& hc) {
        return internal::load_hc(loader, prefix, mix, nscale, this->hc() * H(), hc);
    }
    Status load_compressor(const std::string& p, int64_t ratio, int64_t dim, Compressor& cp);
    Status load_layer(const std::string& p, int64_t index, V4Layer& L);

    void matmul(const Linear& w, const float* x, int64_t n, float* y) {
        kernels::matmul(w.packed, x, n, y, pool.get());
    }
    void rms_norm(const float* x, const float* w, int64_t n, int64_t dim, float* y) const {
        internal::rms_norm_rows(cfg, x, w, n, dim, y);
    }
    void rope(const V4Layer& L, int64_t pos, float* v, int64_t num_vecs, int64_t stride,
              int64_t dim, bool inverse) const {
        internal::rope_rows(cfg, L.attn.inv_freq, pos, v, num_vecs, stride, dim, inverse);
    }

    // mHC: the sub-layer input [N, H] and per token post [hc] and comb [hc, hc].
    void hc_pre(const HcParams& p, const float* x, int64_t n, float* xin, float* post, float* comb);
    void hc_post(const float* x, const float* y, const float* post, const float* comb, int64_t n,
                 float* out) const {
        internal::hc_post(x, y, post, comb, n, hc(), H(), out);
    }
    // The head's collapse of the streams into [N, H] (no Sinkhorn).
    void hc_collapse(const HcParams& p, const float* x, int64_t n, float* y);

    Status block(const V4Layer& L, float* x, const Tokens& tk);
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
    void logits_of(const HcParams& hcp, const std::vector<float>& norm, const float* x,
                   std::span<const int64_t> rows, float* logits);

    // Expert parallelism (model/internal/ep_host.h): layer l's MoE is MoE layer l; null
    // without --ep. The last member: destroyed first, it joins a background weight load
    // that reads the members above.
    std::unique_ptr<internal::EpExperts<internal::Expert>> ep;
    bool grouped() const { return ep != nullptr && ep->grouped(); }
};

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

Status DeepseekV4Model::Impl::load_layer(const std::string& p, int64_t index, V4Layer& L) {
    const ModelConfig& c = cfg;
    const int64_t mix = (2 + hc()) * hc();
    L.index = index;
    L.ratio = c.compress_ratio(index);
    L.attn.inv_freq = c.v4_rope_inv_freq(index);
    DSI_ASSIGN_OR_RETURN(L.attn_norm, source->vector(p + "attn_norm.weight", H()));
    DSI_ASSIGN_OR_RETURN(L.ffn_norm, source->vector(p + "ffn_norm.weight", H()));
    DSI_RETURN_IF_ERROR(load_hc(p + "hc_attn", mix, 3, L.hc_attn));
    DSI_RETURN_IF_ERROR(load_hc(p + "hc_ffn", mix, 3, L.hc_ffn));
    const std::string a = p + "attn.";
    DSI_RETURN_IF_ERROR(internal::load_attn_core(loader, c, a, L.attn));
    if (L.ratio > 0)
        DSI_RETURN_IF_ERROR(load_compressor(a + "compressor.", L.ratio, c.head_dim, L.comp));
    if (L.ratio == 4) {
        DSI_RETURN_IF_ERROR(load_linear(a + "indexer.wq_b.weight",
                                        c.index_n_heads * c.index_head_dim, c.q_lora_rank,
                                        WeightClass::kAttn, L.idx_wq_b));
        DSI_RETURN_IF_ERROR(load_linear(a + "indexer.weights_proj.weight", c.index_n_heads, H(),
                                        WeightClass::kAttn, L.idx_weights));
        DSI_RETURN_IF_ERROR(
            load_compressor(a + "indexer.compressor.", 4, c.index_head_dim, L.idx_comp));
    }
    // With expert parallelism only this rank's slots (the MTP layer is not loaded then).
    const std::vector<int> held =
        ep != nullptr ? ep->held(static_cast<int>(index)) : std::vector<int>{};
    return internal::load_moe(loader, c, p + "ffn.", c.n_routed_experts, c.num_experts_per_tok,
                              index < c.num_hash_layers, held, L.moe);
}

void DeepseekV4Model::Impl::hc_pre(const HcParams& p, const float* x, int64_t n, float* xin,
                                   float* post, float* comb) {
    const int64_t hc = this->hc();
    const int64_t mix = (2 + hc) * hc;
    std::vector<float> mixes, pre(static_cast<size_t>(n * hc));
    internal::hc_mixes(p, cfg, pool.get(), x, n, mixes);
    for (int64_t t = 0; t < n; ++t) {
        internal::hc_coefficients(p, cfg, mixes.data() + t * mix, pre.data() + t * hc,
                                  post + t * hc, comb + t * hc * hc);
    }
    internal::hc_mix_in(x, pre.data(), n, hc, H(), xin);
}

void DeepseekV4Model::Impl::hc_collapse(const HcParams& p, const float* x, int64_t n, float* y) {
    const int64_t hc = this->hc();
    std::vector<float> mixes, pre(static_cast<size_t>(n * hc));
    internal::hc_mixes(p, cfg, pool.get(), x, n, mixes);
    const float eps = static_cast<float>(cfg.hc_eps);
    for (int64_t t = 0; t < n * hc; ++t) {
        pre[t] = sigmoid(mixes[t] * p.scale[0] + p.base[t % hc]) + eps;
    }
    internal::hc_mix_in(x, pre.data(), n, hc, H(), y);
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
            internal::v4_main_encode(entry.data(), D, cfg.qk_rope_head_dim,
                                     reinterpret_cast<uint8_t*>(dst));
        }
    }
}

void DeepseekV4Model::Impl::attention(const V4Layer& L, const float* h, const Tokens& tk,
                                      float* out) {
    const ModelConfig& c = cfg;
    const int64_t n = tk.size();
    const int64_t hd = c.head_dim;
    std::vector<float> qr, q, kv;
    internal::attn_project(L.attn, c, pool.get(), h, tk.pos, qr, q, kv);
    // e4m3: the rows as stored (kvq, into the ring below), and the chunk's queries
    // read them as stored too, so a chunk equals token-by-token decode bitwise.
    std::vector<float> kvq;
    if (fp8()) {
        const int64_t rd = c.qk_rope_head_dim;
        internal::store_rows(
            kv, n, hd, main_words,
            [&](const float* x, uint8_t* row) { internal::v4_main_encode(x, hd, rd, row); },
            [&](const uint8_t* row, float* y) { internal::v4_main_decode(row, hd, rd, y); }, kvq);
    }
    if (L.ratio > 0) compress(L, L.comp, h, tk, false);
    // The indexer (ratio 4): per token, the compressed entries it attends to.
    std::vector<std::vector<int32_t>> chosen(static_cast<size_t>(n));
    if (L.ratio == 4) {
        compress(L, L.idx_comp, h, tk, true);
        const internal::IndexQueries iq = internal::index_queries(
            L.idx_wq_b, L.idx_weights, c, pool.get(), qr, h, tk.pos, L.attn.inv_freq, fp8());
        pool->parallel_for(n, 1, [&](int64_t begin, int64_t end) {
            std::vector<float> score, buf(static_cast<size_t>(c.index_head_dim));
            for (int64_t t = begin; t < end; ++t) {
                const int64_t visible = (tk.pos[t] + 1) / 4;
                score.assign(static_cast<size_t>(visible), 0.0f);
                for (int64_t e = 0; e < visible; ++e) {
                    score[static_cast<size_t>(e)] =
                        iq.score(t, key_row(entry_ptr(L, tk.cache[t], e, true), buf.data()));
                }
                chosen[static_cast<size_t>(t)] =
                    internal::top_k_ascending(score, std::min(visible, c.index_topk));
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
    std::vector<float> o;
    internal::AttendKeys keys;
    keys.chosen = [&](int64_t t) -> const std::vector<int32_t>& {
        return chosen[static_cast<size_t>(t)];
    };
    keys.entry = [&](int64_t t, int32_t e, float* buf) {
        return main_row(entry_ptr(L, tk.cache[t], e, false), buf);
    };
    keys.window = [&](int64_t t, int64_t s, float* buf) {
        return main_row(ring_row(L, tk.cache[t], s), buf);
    };
    internal::attend(L.attn, c, pool.get(), tk, q, kv, keys, o);
    // The chunk's raw KV rows into each sequence's window ring (after every query
    // of the chunk has read the old rows).
    const float* rows = fp8() ? kvq.data() : kv.data();
    for (int64_t t = 0; t < n; ++t) {
        std::copy_n(rows + t * main_words, main_words, ring_row(L, tk.cache[t], tk.pos[t]));
    }
    internal::attn_output(L.attn, c, pool.get(), tk.pos, o, out);
}

Status DeepseekV4Model::Impl::block(const V4Layer& L, float* x, const Tokens& tk) {
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
    if (grouped() && L.index < cfg.num_hidden_layers) {
        DSI_RETURN_IF_ERROR(internal::moe_forward_ep(L.moe, cfg, pool.get(), *ep,
                                                     static_cast<int>(L.index), xin.data(), tk.ids,
                                                     n, y.data()));
    } else {
        internal::moe_forward(L.moe, cfg, pool.get(), xin.data(), tk.ids, n, y.data());
    }
    hc_post(x, y.data(), post.data(), comb.data(), n, next.data());
    std::copy(next.begin(), next.end(), x);
    return Status::ok();
}

void DeepseekV4Model::Impl::logits_of(const HcParams& hcp, const std::vector<float>& norm,
                                      const float* x, std::span<const int64_t> rows,
                                      float* logits) {
    const int64_t m = static_cast<int64_t>(rows.size());
    const int64_t HD = hc() * H();
    std::vector<float> xs(static_cast<size_t>(m * HD)), y(static_cast<size_t>(m * H()));
    for (int64_t r = 0; r < m; ++r)
        std::copy_n(x + rows[static_cast<size_t>(r)] * HD, HD, xs.data() + r * HD);
    hc_collapse(hcp, xs.data(), m, y.data());
    rms_norm(y.data(), norm.data(), m, H(), y.data());
    matmul(head, y.data(), m, logits);
}

// ---- public API ----

DeepseekV4Model::DeepseekV4Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeepseekV4Model::~DeepseekV4Model() = default;
const ModelConfig& DeepseekV4Model::config() const { return impl_->cfg; }

Result<std::unique_ptr<DeepseekV4Model>> DeepseekV4Model::load(std::unique_ptr<WeightSource> source,
                                                               Options options) {
    auto impl = std::make_unique<Impl>();
    impl->cfg = source->config();
    if (!impl->cfg.is_v4()) {
        return invalid_argument(source->description() + ": architecture '" +
                                impl->cfg.architecture + "' is not DeepseekV4ForCausalLM");
    }
    DSI_RETURN_IF_ERROR(impl->cfg.validate());
    impl->source = std::move(source);
    impl->loader.source = impl->source.get();
    impl->pool = std::make_unique<ThreadPool>(options.num_threads);
    DSI_RETURN_IF_ERROR(
        internal::parse_weight_formats(options.weight_format, impl->loader.formats));
    const ModelConfig& c = impl->cfg;
    WeightSource& src = *impl->source;
    impl->kv_dtype = options.kv_dtype;
    if (options.kv_dtype == kernels::KvDtype::kBf16) {
        return invalid_argument("DeepSeek V4: kv dtype 'bf16' is not supported (f32 or e4m3)");
    }
    if (impl->fp8() &&
        (c.index_head_dim % 32 != 0 || (c.index_head_dim & (c.index_head_dim - 1)) != 0)) {
        return invalid_argument(
            "DeepSeek V4: kv dtype 'e4m3' needs a power-of-two index_head_dim of at least 32 (its "
            "keys are Hadamard-rotated MXFP4); the config has " +
            std::to_string(c.index_head_dim));
    }
    const int64_t H = c.hidden_size;
    impl->layers.resize(static_cast<size_t>(c.num_hidden_layers));
    if (options.expert_parallel.enabled()) {
        // Joined before the weights load: a rank whose load fails leaves the group at
        // once, so its peers fail fast instead of at their attach deadline.
        DSI_ASSIGN_OR_RETURN(
            impl->ep, internal::join_expert_parallel(options.expert_parallel, impl->cfg,
                                                     impl->loader, impl->pool.get(), impl->layers));
    }
    DSI_ASSIGN_OR_RETURN(impl->embed, src.matrix("embed.weight", c.vocab_size, H));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        DSI_RETURN_IF_ERROR(impl->load_layer("layers." + std::to_string(i) + ".", i,
                                             impl->layers[static_cast<size_t>(i)]));
    }
    DSI_ASSIGN_OR_RETURN(impl->final_norm, src.vector("norm.weight", H));
    DSI_RETURN_IF_ERROR(impl->load_hc("hc_head", c.hc_mult, 1, impl->hc_head));
    DSI_RETURN_IF_ERROR(
        impl->load_linear("head.weight", c.vocab_size, H, WeightClass::kHead, impl->head));
    // Expert parallelism leaves the MTP layer out: its MoE would be a collective of its own.
    if (c.num_nextn_predict_layers > 0 && impl->ep == nullptr) {
        V4Mtp m;
        const std::string p = "mtp.0.";
        DSI_RETURN_IF_ERROR(
            impl->load_linear(p + "e_proj.weight", H, H, WeightClass::kAttn, m.e_proj));
        DSI_RETURN_IF_ERROR(
            impl->load_linear(p + "h_proj.weight", H, H, WeightClass::kAttn, m.h_proj));
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
    main_words =
        fp8() ? (internal::v4_main_row_bytes(c.head_dim, c.qk_rope_head_dim) + 3) / 4 : c.head_dim;
    key_words = fp8() && c.index_head_dim > 0
                    ? (internal::v4_index_row_bytes(c.index_head_dim) + 3) / 4
                    : c.index_head_dim;
    // The MTP layer's rows also when expert parallelism left it out: one layout per
    // checkpoint.
    const int64_t nl = c.num_hidden_layers + (c.num_nextn_predict_layers > 0 ? 1 : 0);
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

Status DeepseekV4Model::forward(std::span<const int32_t> tokens, int64_t start_pos, V4State& state,
                                bool all_logits, V4Output& out) {
    V4Step step{tokens, start_pos, &state, all_logits};
    return forward_batch(std::span<const V4Step>(&step, 1), out);
}

Status DeepseekV4Model::Impl::gather(std::span<const SequenceStep> steps, Tokens& tk,
                                     std::vector<int64_t>& logit_tokens,
                                     std::vector<int64_t>& logit_row) {
    Status s = internal::gather_steps(steps, cfg, "V4", tk, logit_tokens, logit_row);
    if (!s.is_ok()) {
        if (ep != nullptr) ep->abandon();  // bad input ends this rank's membership too
        return s;
    }
    // Every step is valid: sequences at position 0 start afresh.
    for (const SequenceStep& st : steps) {
        if (st.start_pos == 0) reset_state(st.cache->state());
    }
    return Status::ok();
}

Status DeepseekV4Model::Impl::run(std::span<const SequenceStep> steps, const Tokens& tk,
                                  std::vector<float>& x,
                                  std::vector<std::vector<float>>* layer_streams) {
    const int64_t n = tk.size();
    if (grouped()) {
        Status s = ep->begin_pass(n);
        if (!s.is_ok()) {
            ep->abandon();
            return s;
        }
    }
    const int64_t hc = this->hc();
    x.resize(static_cast<size_t>(n * hc * H()));
    for (int64_t t = 0; t < n; ++t) {
        float* xt = x.data() + t * hc * H();
        embed.dequantize_row(tk.ids[static_cast<size_t>(t)], xt);
        for (int64_t j = 1; j < hc; ++j) std::copy_n(xt, H(), xt + j * H());
    }
    if (layer_streams != nullptr) layer_streams->clear();
    for (const V4Layer& L : layers) {
        Status s = block(L, x.data(), tk);
        if (!s.is_ok()) {
            // With expert parallelism a failure ends this rank's membership: its peers
            // must not wait for a collective it will not join.
            if (ep != nullptr) ep->abandon();
            return s;
        }
        if (layer_streams != nullptr) layer_streams->push_back(x);
    }
    for (const SequenceStep& st : steps) {
        float* slot = st.cache->state();
        header_set(slot, 0, header_get(slot, 0) + static_cast<int64_t>(st.tokens.size()));
    }
    return Status::ok();
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
    DSI_RETURN_IF_ERROR(m.run(seq, tk, x, out.capture_layers ? &out.layer_streams : nullptr));
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
    DSI_RETURN_IF_ERROR(m.run(steps, tk, x, nullptr));
    out.logits.resize(logit_tokens.size() * static_cast<size_t>(m.cfg.vocab_size));
    m.logits_of(m.hc_head, m.final_norm, x.data(), logit_tokens, out.logits.data());
    out.hidden.clear();
    return Status::ok();
}
Result<CausalLm::GroupStep> DeepseekV4Model::group_idle_step(bool leaving) {
    return internal::group_idle_step(impl_->ep.get(), leaving);
}

std::optional<ExpertParallelStats> DeepseekV4Model::expert_parallel_stats(
    size_t max_windows) const {
    return internal::group_stats(impl_->ep.get(), max_windows);
}

Status DeepseekV4Model::mtp_forward(std::span<const int32_t> next_tokens,
                                    std::span<const float> streams, int64_t start_pos,
                                    V4State& state, std::vector<float>& logits) {
    Impl& m = *impl_;
    if (m.ep != nullptr) {
        return failed_precondition("mtp_forward: not with expert parallelism (yet)");
    }
    if (!m.mtp) return failed_precondition("mtp_forward: the checkpoint has no MTP layer");
    const ModelConfig& c = m.cfg;
    const int64_t T = static_cast<int64_t>(next_tokens.size());
    const int64_t H = c.hidden_size;
    const int64_t hc = c.hc_mult;
    if (T == 0 || static_cast<int64_t>(streams.size()) != T * hc * H) {
        return invalid_argument("mtp_forward: streams must be [tokens, hc_mult, hidden_size]");
    }
    for (int32_t id : next_tokens) {
        if (id < 0 || id >= c.vocab_size)
            return invalid_argument("mtp_forward: token id out of range");
    }
    KvCache* s = state.impl_->cache.get();
    const int64_t mtp_length = header_get(s->state(), 1);
    if (start_pos != mtp_length) {
        return invalid_argument("mtp_forward: starts at " + std::to_string(start_pos) +
                                " but the MTP state holds " + std::to_string(mtp_length));
    }
    if (start_pos + T > s->capacity())
        return out_of_range("mtp_forward: positions exceed the capacity");
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
    for (int64_t t = 0; t < T; ++t)
        m.embed.dequantize_row(next_tokens[static_cast<size_t>(t)], e.data() + t * H);
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
    DSI_RETURN_IF_ERROR(m.block(mtp.block, x.data(), tk));
    header_set(s->state(), 1, mtp_length + T);
    std::vector<int64_t> rows(static_cast<size_t>(T));
    std::iota(rows.begin(), rows.end(), 0);
    logits.resize(static_cast<size_t>(T * c.vocab_size));
    m.logits_of(mtp.head, mtp.norm, x.data(), rows, logits.data());
    return Status::ok();
}

}  // namespace dsi
