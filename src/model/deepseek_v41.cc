#include "model/deepseek_v41.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "base/env.h"
#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
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

struct V41Layer {
    int64_t index = 0;
    int64_t ratio = 0;
    V41AttnKind kind = V41AttnKind::kWindow;
    int64_t kv_src = -1;    // the Full layer whose entries it attends to
    int64_t topk_src = -1;  // the Full / Reindex layer whose top-k it uses
    std::vector<float> attn_norm, ffn_norm;
    HcParams hc_attn, hc_ffn;
    AttnCore attn;
    // Full: the CSA2 compressor and the index-key projection.
    Linear comp_wkv, comp_wgate;
    std::vector<float> comp_norm, idx_k_norm;
    Linear idx_wk;
    // Full / Reindex: the indexer query.
    Linear idx_wq_b, idx_weights;
    Moe moe;
    int64_t engram = -1;  // index into Impl::engrams
};

// One Engram layer: the table of every (order, head) sub-table, the key/value projection
// and the gate's norm weights; the hash of each sub-table (docs/models_v41.md).
struct Engram {
    WeightMatrix table;  // [rows, engram_head_dim]
    Linear wkv;          // [(hc + 1) * hidden, sub-tables * engram_head_dim]
    std::vector<float> q_norm, k_norm;
    std::vector<int64_t> modulus, offset;  // per sub-table
    std::vector<uint64_t> mult;            // [sub-table][max_ngram] odd multipliers
};

// Where one layer keeps its state (floats into the slot) and its groups.
struct LayerSlots {
    int64_t ring = 0;   // [window SWA rows]: position p at row p % window
    int64_t comp = -1;  // ratio-2 Full: kv then score rows [ratio, head_dim]
    int64_t comp_floats = 0;
    int entries_group = -1, keys_group = -1;
    int64_t group_layer = 0;
};

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Bounded replay (S-SWA) words after the slot header, int64 at header_get index: the
// encoder layers' window floor, the decoder layers' window floor, and the end of the
// block KV a replay reuses (positions below it are never written).
constexpr int kEncoderFloor = 2;
constexpr int kDecoderFloor = 3;
constexpr int kReuseEnd = 4;
constexpr int64_t kReplayWordsFloats = 6;

}  // namespace

struct DeepseekV41Model::Impl {
    std::unique_ptr<WeightSource> source;
    ModelConfig cfg;
    std::unique_ptr<ThreadPool> pool;
    internal::V4Loader loader;
    WeightMatrix embed;
    std::vector<V41Layer> layers;
    std::vector<Engram> engrams;
    std::vector<float> final_norm;
    Linear head;
    std::vector<WeightMatrix> draft_matrices;  // DSpark, loaded only
    std::vector<std::vector<float>> draft_vectors;
    kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
    bool packed() const { return kv_dtype == kernels::KvDtype::kE4m3; }
    int64_t main_words = 0, key_words = 0, swa_words = 0;  // 4-byte words per row
    KvLayout layout;
    std::vector<LayerSlots> slots;
    int64_t ids_ring = -1, ids_ring_len = 0;  // Engram: the last token ids
    int64_t first_decoder = 0;                // v41_first_decoder_layer

    int64_t hc() const { return cfg.hc_mult; }
    int64_t H() const { return cfg.hidden_size; }
    void matmul(const Linear& w, const float* x, int64_t n, float* y) {
        kernels::matmul(w.packed, x, n, y, pool.get());
    }
    void rms_norm(const float* x, const float* w, int64_t n, int64_t dim, float* y) const {
        internal::rms_norm_rows(cfg, x, w, n, dim, y);
    }
    void rope(const V41Layer& L, int64_t pos, float* v, int64_t num_vecs, int64_t stride,
              int64_t dim, bool inverse) const {
        internal::rope_rows(cfg, L.attn.inv_freq, pos, v, num_vecs, stride, dim, inverse);
    }

    Status load_layer(int64_t index, V41Layer& L);
    Status load_engram(int64_t layer, int64_t e, Engram& g);
    void plan_cache();
    void reset_state(float* slot) const;
    // The window floor of L's half for a token of `c` (S-SWA: no row before it is read).
    int64_t window_floor(const V41Layer& L, KvCache* c) const {
        return header_get(c->state(), L.index >= first_decoder ? kDecoderFloor : kEncoderFloor);
    }
    // Sets up the replay words of each step (SequenceStep::replay_end, decoder_begin);
    // a replay step starts its state afresh at start_pos with `context`'s token ids.
    Status begin_replays(std::span<const SequenceStep> steps);

    float* ring_row(const V41Layer& L, KvCache* c, int64_t pos) const {
        return c->state() + slots[static_cast<size_t>(L.index)].ring +
               (pos % cfg.sliding_window) * swa_words;
    }
    // Entry / index key `i` of Full layer `full`, as stored.
    float* entry_ptr(int64_t full, KvCache* c, int64_t i, bool key) const {
        const LayerSlots& s = slots[static_cast<size_t>(full)];
        return c->entry(static_cast<size_t>(key ? s.keys_group : s.entries_group), s.group_layer,
                        i * cfg.compress_ratio(full));
    }
    const float* read_main(const float* row, float* buf) const {
        if (!packed()) return row;
        internal::v41_main_decode(reinterpret_cast<const uint8_t*>(row), cfg.head_dim, buf);
        return buf;
    }
    const float* read_key(const float* row, float* buf) const {
        if (!packed()) return row;
        internal::v4_index_decode(reinterpret_cast<const uint8_t*>(row), cfg.index_head_dim, buf);
        return buf;
    }
    const float* read_swa(const float* row, float* buf) const {
        if (!packed()) return row;
        internal::v41_swa_decode(reinterpret_cast<const uint8_t*>(row), cfg.head_dim, buf);
        return buf;
    }
    int32_t token_at(const Tokens& tk, int64_t t, int64_t p) const;

    // Per forward call: the top-k of every Full / Reindex layer and the decoder
    // candidates, per token.
    struct Selections {
        std::vector<std::vector<std::vector<int32_t>>> chosen;  // [layer][token]
        std::vector<std::vector<int32_t>> candidates;           // [token]
    };
    void engram_forward(const Engram& g, int64_t layer, float* x, const Tokens& tk,
                        V41Trace* trace);
    void compress(const V41Layer& L, const float* h, const Tokens& tk);
    void select(const V41Layer& L, const float* h, const std::vector<float>& qr, const Tokens& tk,
                Selections& sel, V41Trace* trace);
    void attention(const V41Layer& L, const float* h, const Tokens& tk, Selections& sel, float* out,
                   V41Trace* trace);
    // Both sub-layers of L; `pre` [n, hc] is the previous sub-layer's and becomes L's last.
    Status block(const V41Layer& L, float* x, std::vector<float>& pre, const Tokens& tk,
                 Selections& sel, V41Trace* trace);
    // The streams after the encoder and the decoder layers. The decoder runs for the
    // tokens at or past their step's decoder_begin (none with encoder_only); the others
    // get only the decoder kv source's projection. Returns each batch token's row in x
    // and pre (the decoder's tokens), -1 for a token the decoder did not run for. Under
    // expert parallelism a collective (the pass starts here); a failure leaves the group.
    Status run(std::span<const SequenceStep> steps, const Tokens& tk, bool encoder_only,
               std::vector<float>& x, std::vector<float>& pre, V41Trace* trace,
               std::vector<int64_t>& row);
    Status run_layers(std::span<const SequenceStep> steps, const Tokens& tk, bool encoder_only,
                      std::vector<float>& x, std::vector<float>& pre, V41Trace* trace,
                      std::vector<int64_t>& row);
    Status gather(std::span<const SequenceStep> steps, Tokens& tk,
                  std::vector<int64_t>& logit_tokens, std::vector<int64_t>& logit_row);

    // Expert parallelism (model/internal/ep_host.h): layer l's MoE is MoE layer l; null
    // without --ep. The last member: destroyed first, it joins a background weight load
    // that reads the members above.
    std::unique_ptr<internal::EpExperts<internal::Expert>> ep;
    bool grouped() const { return ep != nullptr && ep->grouped(); }
};

// ---- loading ----

Status DeepseekV41Model::Impl::load_layer(int64_t index, V41Layer& L) {
    const ModelConfig& c = cfg;
    const std::string p = "layers." + std::to_string(index) + ".";
    const int64_t mix = (2 + hc()) * hc();
    L.index = index;
    L.ratio = c.compress_ratio(index);
    L.kind = v41_attn_kind(c, index);
    L.kv_src = v41_kv_source_of(c, index);
    L.topk_src = v41_topk_source_of(c, index);
    L.attn.inv_freq = c.v4_rope_inv_freq(index);
    DSI_ASSIGN_OR_RETURN(L.attn_norm, source->vector(p + "attn_norm.weight", H()));
    DSI_ASSIGN_OR_RETURN(L.ffn_norm, source->vector(p + "ffn_norm.weight", H()));
    DSI_RETURN_IF_ERROR(internal::load_hc(loader, p + "hc_attn", mix, 3, hc() * H(), L.hc_attn));
    DSI_RETURN_IF_ERROR(internal::load_hc(loader, p + "hc_ffn", mix, 3, hc() * H(), L.hc_ffn));
    const std::string a = p + "attn.";
    DSI_RETURN_IF_ERROR(internal::load_attn_core(loader, c, a, L.attn));
    const int64_t hd = c.head_dim;
    if (L.kind == V41AttnKind::kFull) {
        DSI_RETURN_IF_ERROR(
            loader.linear(a + "compressor.wkv.weight", hd, H(), WeightClass::kAttn, L.comp_wkv));
        if (L.ratio > 1) {
            DSI_RETURN_IF_ERROR(loader.linear(a + "compressor.wgate.weight", hd, H(),
                                              WeightClass::kAttn, L.comp_wgate));
        }
        DSI_ASSIGN_OR_RETURN(L.comp_norm, source->vector(a + "compressor.norm.weight", hd));
        DSI_RETURN_IF_ERROR(loader.linear(a + "indexer.wk.weight", c.index_head_dim, hd,
                                          WeightClass::kAttn, L.idx_wk));
        DSI_ASSIGN_OR_RETURN(L.idx_k_norm,
                             source->vector(a + "indexer.k_norm.weight", c.index_head_dim));
    }
    if (L.kind == V41AttnKind::kFull || L.kind == V41AttnKind::kReindex) {
        DSI_RETURN_IF_ERROR(loader.linear(a + "indexer.wq_b.weight",
                                          c.index_n_heads * c.index_head_dim, c.q_lora_rank,
                                          WeightClass::kAttn, L.idx_wq_b));
        DSI_RETURN_IF_ERROR(loader.linear(a + "indexer.weights_proj.weight", c.index_n_heads, H(),
                                          WeightClass::kAttn, L.idx_weights));
    }
    // With expert parallelism only this rank's slots.
    const std::vector<int> held =
        ep != nullptr ? ep->held(static_cast<int>(index)) : std::vector<int>{};
    return internal::load_moe(loader, c, p + "ffn.", c.n_routed_experts, c.num_experts_per_tok,
                              false, held, L.moe);
}

Status DeepseekV41Model::Impl::load_engram(int64_t layer, int64_t e, Engram& g) {
    const V41Fields& f = cfg.v41;
    const std::string p = "layers." + std::to_string(layer) + ".engram.";
    const int64_t subtables = (f.engram_max_ngram_size - 1) * f.engram_n_heads;
    const int64_t rows = f.engram_num_embeddings[static_cast<size_t>(e)];
    DSI_ASSIGN_OR_RETURN(g.table, source->matrix(p + "embed.weight", rows, f.engram_head_dim));
    DSI_RETURN_IF_ERROR(loader.linear(p + "wkv.weight", (hc() + 1) * H(),
                                      subtables * f.engram_head_dim, WeightClass::kAttn, g.wkv));
    DSI_ASSIGN_OR_RETURN(g.q_norm, source->vector(p + "q_norm.weight", H()));
    DSI_ASSIGN_OR_RETURN(g.k_norm, source->vector(p + "k_norm.weight", H()));
    g.modulus = v41_engram_moduli(cfg, e);
    int64_t off = 0;
    for (int64_t m : g.modulus) {
        g.offset.push_back(off);
        off += m;
    }
    // Odd multipliers per (sub-table, n-gram slot), fixed by the layer id.
    SplitMix64 rng(0x456e6772616d0000ULL + static_cast<uint64_t>(layer));
    g.mult.resize(static_cast<size_t>(subtables * f.engram_max_ngram_size));
    for (uint64_t& m : g.mult) m = rng.next() | 1u;
    return Status::ok();
}

void DeepseekV41Model::Impl::plan_cache() {
    const ModelConfig& c = cfg;
    main_words = packed() ? (internal::v41_main_row_bytes(c.head_dim) + 3) / 4 : c.head_dim;
    key_words =
        packed() ? (internal::v4_index_row_bytes(c.index_head_dim) + 3) / 4 : c.index_head_dim;
    swa_words = packed() ? (internal::v41_swa_row_bytes(c.head_dim) + 3) / 4 : c.head_dim;
    const int64_t nl = c.num_hidden_layers;
    slots.assign(static_cast<size_t>(nl), LayerSlots{});
    int64_t n2 = 0, n1 = 0;
    for (int64_t i = 0; i < nl; ++i) {
        if (v41_attn_kind(c, i) != V41AttnKind::kFull) continue;
        slots[static_cast<size_t>(i)].group_layer = c.compress_ratio(i) == 2 ? n2++ : n1++;
    }
    layout = KvLayout{};
    int g2 = -1, g1 = -1;
    if (n2 > 0) {
        g2 = static_cast<int>(layout.groups.size());
        layout.groups.push_back({"c2", n2, 2, main_words});
        layout.groups.push_back({"c2_index", n2, 2, key_words});
    }
    if (n1 > 0) {
        g1 = static_cast<int>(layout.groups.size());
        layout.groups.push_back({"c1", n1, 1, main_words});
        layout.groups.push_back({"c1_index", n1, 1, key_words});
    }
    if (layout.groups.empty()) layout.groups.push_back({"positions", 1, 128, 1});
    first_decoder = v41_first_decoder_layer(c);
    // S-KV-8's stored region: the lengths, the Engram ids and the encoder layers' rings
    // (merged where adjacent); the replay words, the decoder rings and the ratio-2
    // pending groups (empty at every unit boundary: 128 is a multiple of 2) are dropped.
    auto store = [&](int64_t begin, int64_t end) {
        if (!layout.swa_stored_ranges.empty() && layout.swa_stored_ranges.back().second == begin) {
            layout.swa_stored_ranges.back().second = end;
        } else {
            layout.swa_stored_ranges.emplace_back(begin, end);
        }
    };
    store(0, internal::kStateHeaderFloats);
    int64_t off = internal::kStateHeaderFloats + kReplayWordsFloats;
    if (!engrams.empty()) {
        ids_ring = off;
        ids_ring_len = c.v41.engram_max_ngram_size - 1;
        off += ids_ring_len;
        store(ids_ring, off);
    }
    for (int64_t i = 0; i < nl; ++i) {
        LayerSlots& s = slots[static_cast<size_t>(i)];
        s.ring = off;
        off += c.sliding_window * swa_words;
        if (i < first_decoder) store(s.ring, off);
        if (v41_attn_kind(c, i) == V41AttnKind::kFull) {
            const int64_t r = c.compress_ratio(i);
            s.entries_group = r == 2 ? g2 : g1;
            s.keys_group = s.entries_group + 1;
            if (r > 1) {
                s.comp = off;
                s.comp_floats = r * c.head_dim;
                off += 2 * s.comp_floats;
            }
        }
    }
    layout.state_floats = off;
    layout.prefix_reusable = false;
    layout.not_reusable_reason =
        "DeepSeek V4.1 keeps a sliding-window ring per layer, the ratio-2 pending groups and "
        "the last token ids per sequence, which paged blocks cannot restore";
    layout.state_snapshot_resumes = true;
    layout.swa_bounded_replay = true;
}

void DeepseekV41Model::Impl::reset_state(float* slot) const {
    for (int i : {0, 1, kEncoderFloor, kDecoderFloor, kReuseEnd}) header_set(slot, i, 0);
    for (const LayerSlots& s : slots) {
        if (s.comp < 0) continue;
        std::fill_n(slot + s.comp, s.comp_floats, 0.0f);
        std::fill_n(slot + s.comp + s.comp_floats, s.comp_floats, -INFINITY);
    }
}

// ---- forward ----

// The id of the token at position p (<= the position of batch token t) of t's sequence.
int32_t DeepseekV41Model::Impl::token_at(const Tokens& tk, int64_t t, int64_t p) const {
    if (p < tk.chunk_start[t]) {
        int32_t id;
        std::memcpy(&id, tk.cache[t]->state() + ids_ring + p % ids_ring_len, sizeof id);
        return id;
    }
    return tk.ids[static_cast<size_t>(tk.chunk_first[t] + p - tk.chunk_start[t])];
}

// Engram (docs/models_v41.md): per sub-table (order n, head k) the compressed ids of the
// n tokens ending at the position are hashed into the sub-table's rows; the rows,
// concatenated, project to one key per stream and one value; stream j gains
// sigmoid(signed_sqrt(<rmsnorm(x_j) q_norm, rmsnorm(key_j) k_norm> / sqrt(hidden))) * value.
void DeepseekV41Model::Impl::engram_forward(const Engram& g, int64_t layer, float* x,
                                            const Tokens& tk, V41Trace* trace) {
    const V41Fields& f = cfg.v41;
    const int64_t n = tk.size();
    const int64_t hcn = hc();
    const int64_t h = H();
    const int64_t ehd = f.engram_head_dim;
    const int64_t nsub = static_cast<int64_t>(g.modulus.size());
    const int64_t maxn = f.engram_max_ngram_size;
    std::vector<float> e(static_cast<size_t>(n * nsub * ehd));
    std::vector<uint64_t> cid(static_cast<size_t>(maxn));
    for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = tk.pos[t];
        for (int64_t i = 0; i < maxn; ++i) {
            const int64_t p = pos - i;
            cid[static_cast<size_t>(i)] =
                p < 0 ? static_cast<uint64_t>(f.engram_pad_token_id)
                      : static_cast<uint64_t>(token_at(tk, t, p) % f.engram_compressed_vocab_size);
        }
        for (int64_t j = 0; j < nsub; ++j) {
            const int64_t order = 2 + j / f.engram_n_heads;
            uint64_t hv = 0;
            for (int64_t i = 0; i < order; ++i) {
                hv ^= (cid[static_cast<size_t>(i)] + 1) * g.mult[static_cast<size_t>(j * maxn + i)];
            }
            const int64_t row =
                g.offset[static_cast<size_t>(j)] +
                static_cast<int64_t>(hv % static_cast<uint64_t>(g.modulus[static_cast<size_t>(j)]));
            g.table.dequantize_row(row, e.data() + (t * nsub + j) * ehd);
        }
    }
    std::vector<float> kv(static_cast<size_t>(n * (hcn + 1) * h));
    matmul(g.wkv, e.data(), n, kv.data());
    const kernels::Isa isa = kernels::active_isa();
    const float eps = static_cast<float>(cfg.rms_norm_eps);
    const float inv_sqrt_h = static_cast<float>(1.0 / std::sqrt(static_cast<double>(h)));
    double gate_sum = 0.0;
    for (int64_t t = 0; t < n; ++t) {
        const float* v = kv.data() + (t * (hcn + 1) + hcn) * h;
        for (int64_t j = 0; j < hcn; ++j) {
            float* xj = x + (t * hcn + j) * h;
            const float* key = kv.data() + (t * (hcn + 1) + j) * h;
            float dot = 0.0f;
            for (int64_t i = 0; i < h; ++i) dot += xj[i] * g.q_norm[i] * g.k_norm[i] * key[i];
            const float rx =
                1.0f / std::sqrt(kernels::dot(isa, xj, xj, h) / static_cast<float>(h) + eps);
            const float rk =
                1.0f / std::sqrt(kernels::dot(isa, key, key, h) / static_cast<float>(h) + eps);
            const float z = dot * rx * rk * inv_sqrt_h;
            const float gate = sigmoid(std::copysign(std::sqrt(std::fabs(z)), z));
            for (int64_t i = 0; i < h; ++i) xj[i] += gate * v[i];
            gate_sum += gate;
        }
    }
    if (trace != nullptr) {
        trace->engram_gate_mean[static_cast<size_t>(layer)] =
            gate_sum / static_cast<double>(n * hcn);
    }
}

// CSA2 (reference §7.3): ratio 1 emits wkv(h) per token; ratio 2 pools each group of two
// tokens per channel with softmax(wgate(h)) weights (no overlap, no APE), the pending
// token in the slot. An entry is normalised, its index key projected from it
// (k_norm(wk(entry))), then both are rotated at the group's first position.
void DeepseekV41Model::Impl::compress(const V41Layer& L, const float* h, const Tokens& tk) {
    const int64_t n = tk.size();
    const int64_t r = L.ratio;
    const int64_t D = cfg.head_dim;
    const int64_t ihd = cfg.index_head_dim;
    std::vector<float> kv(static_cast<size_t>(n * D)), sc;
    matmul(L.comp_wkv, h, n, kv.data());
    if (r > 1) {
        sc.resize(static_cast<size_t>(n * D));
        matmul(L.comp_wgate, h, n, sc.data());
    }
    const LayerSlots& s = slots[static_cast<size_t>(L.index)];
    std::vector<float> entry(static_cast<size_t>(D)), key(static_cast<size_t>(ihd));
    for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = tk.pos[t];
        // S-SWA: a replayed position's block KV is reused as is, never recomputed.
        const int64_t reuse_end = header_get(tk.cache[t]->state(), kReuseEnd);
        if (pos < reuse_end) continue;
        if (r == 1) {
            std::copy_n(kv.data() + t * D, D, entry.data());
        } else {
            float* acc_kv = tk.cache[t]->state() + s.comp;
            float* acc_sc = acc_kv + s.comp_floats;
            std::copy_n(kv.data() + t * D, D, acc_kv + (pos % r) * D);
            std::copy_n(sc.data() + t * D, D, acc_sc + (pos % r) * D);
            if ((pos + 1) % r != 0) continue;
            for (int64_t ch = 0; ch < D; ++ch) {
                float mx = -INFINITY;
                for (int64_t j = 0; j < r; ++j) mx = std::max(mx, acc_sc[j * D + ch]);
                float sum = 0.0f, acc = 0.0f;
                for (int64_t j = 0; j < r; ++j) {
                    const float w = std::exp(acc_sc[j * D + ch] - mx);
                    sum += w;
                    acc += w * acc_kv[j * D + ch];
                }
                entry[static_cast<size_t>(ch)] = acc / sum;
            }
        }
        const int64_t i = pos / r;
        // Never overwrite reused block KV (begin_replays checked that reuse_end is a
        // multiple of every ratio, so a group is either all reused or all computed).
        DSI_CHECK_LE(reuse_end, i * r);
        rms_norm(entry.data(), L.comp_norm.data(), 1, D, entry.data());
        matmul(L.idx_wk, entry.data(), 1, key.data());
        rms_norm(key.data(), L.idx_k_norm.data(), 1, ihd, key.data());
        rope(L, i * r, entry.data(), 1, D, D, false);
        rope(L, i * r, key.data(), 1, ihd, ihd, false);
        float* dst = entry_ptr(L.index, tk.cache[t], i, false);
        float* kdst = entry_ptr(L.index, tk.cache[t], i, true);
        if (!packed()) {
            std::copy(entry.begin(), entry.end(), dst);
            std::copy(key.begin(), key.end(), kdst);
        } else {
            internal::v41_main_encode(entry.data(), D, reinterpret_cast<uint8_t*>(dst));
            internal::hadamard_rotate(key.data(), ihd);
            internal::v4_index_encode(key.data(), ihd, reinterpret_cast<uint8_t*>(kdst));
        }
    }
}

// The entries each token attends to: Full layers score all their visible entries (the
// decoder's also picks the candidate blocks), Reindex layers score the candidates with
// their own query, Reuse layers take their top-k source's choice.
void DeepseekV41Model::Impl::select(const V41Layer& L, const float* h, const std::vector<float>& qr,
                                    const Tokens& tk, Selections& sel, V41Trace* trace) {
    const ModelConfig& c = cfg;
    const int64_t n = tk.size();
    auto& chosen = sel.chosen[static_cast<size_t>(L.index)];
    chosen.assign(static_cast<size_t>(n), {});
    if (L.kind == V41AttnKind::kReuse) {
        chosen = sel.chosen[static_cast<size_t>(L.topk_src)];
        return;
    }
    const internal::IndexQueries iq = internal::index_queries(
        L.idx_wq_b, L.idx_weights, c, pool.get(), qr, h, tk.pos, L.attn.inv_freq, packed());
    const bool candidate_source = L.index == c.v41.candidate_source_layer_id;
    if (candidate_source) sel.candidates.assign(static_cast<size_t>(n), {});
    const int64_t ihd = c.index_head_dim;
    pool->parallel_for(n, 1, [&](int64_t begin, int64_t end) {
        // Keys are scored kScoreChunk at a time (stored compactly: decoded into buf first);
        // in a Full layer a chunk serves up to kTokenGroup consecutive tokens of one
        // sequence, which score the same entries in the same order, so it is read (and
        // decoded) once per group, not per token. A key's score does not depend on the
        // chunk or the group it is scored in (kernels::index_scores), so neither changes
        // a selection.
        constexpr int64_t kScoreChunk = 256, kTokenGroup = 16;
        std::vector<std::vector<float>> scores(static_cast<size_t>(kTokenGroup));
        std::vector<float> buf(static_cast<size_t>(kScoreChunk * ihd));
        std::vector<const float*> keys(static_cast<size_t>(kScoreChunk));
        for (int64_t g0 = begin; g0 < end;) {
            int64_t g1 = g0 + 1;
            while (L.kind != V41AttnKind::kReindex && g1 < end && g1 - g0 < kTokenGroup &&
                   tk.cache[g1] == tk.cache[g0]) {
                ++g1;
            }
            // The entries each token scores: its visible ones, or (Reindex) its candidates.
            const auto scored = [&](int64_t t) {
                return L.kind == V41AttnKind::kReindex
                           ? static_cast<int64_t>(sel.candidates[static_cast<size_t>(t)].size())
                           : (tk.pos[t] + 1) / L.ratio;
            };
            const auto entry_id = [&](int64_t t, int64_t i) {
                return L.kind == V41AttnKind::kReindex
                           ? sel.candidates[static_cast<size_t>(t)][static_cast<size_t>(i)]
                           : static_cast<int32_t>(i);
            };
            int64_t widest = 0;
            for (int64_t t = g0; t < g1; ++t) {
                scores[static_cast<size_t>(t - g0)].assign(static_cast<size_t>(scored(t)), 0.0f);
                widest = std::max(widest, scored(t));
            }
            for (int64_t i0 = 0; i0 < widest; i0 += kScoreChunk) {
                const int64_t cnt = std::min(kScoreChunk, widest - i0);
                for (int64_t i = 0; i < cnt; ++i) {
                    keys[static_cast<size_t>(i)] =
                        read_key(entry_ptr(L.kv_src, tk.cache[g0], entry_id(g0, i0 + i), true),
                                 buf.data() + i * ihd);
                }
                for (int64_t t = g0; t < g1; ++t) {
                    const int64_t m = std::min(cnt, scored(t) - i0);
                    if (m > 0) {
                        iq.score_keys(t, keys.data(), m,
                                      scores[static_cast<size_t>(t - g0)].data() + i0);
                    }
                }
            }
            for (int64_t t = g0; t < g1; ++t) {
                const std::vector<float>& score = scores[static_cast<size_t>(t - g0)];
                const int64_t m = static_cast<int64_t>(score.size());
                std::vector<int32_t>& ids = chosen[static_cast<size_t>(t)];
                ids = internal::top_k_ascending(score, std::min(m, c.index_topk));
                for (int32_t& id : ids) id = entry_id(t, id);
                if (!candidate_source) continue;
                // Candidate blocks: the best candidate_topk_blocks blocks of
                // candidate_block_size entries by their maximum score.
                const int64_t bs = c.v41.candidate_block_size;
                const int64_t nb = (m + bs - 1) / bs;
                std::vector<float> bscore(static_cast<size_t>(nb), -INFINITY);
                for (int64_t i = 0; i < m; ++i) {
                    bscore[static_cast<size_t>(i / bs)] = std::max(
                        bscore[static_cast<size_t>(i / bs)], score[static_cast<size_t>(i)]);
                }
                const std::vector<int32_t> blocks =
                    internal::top_k_ascending(bscore, std::min(nb, c.v41.candidate_topk_blocks));
                std::vector<int32_t>& cand = sel.candidates[static_cast<size_t>(t)];
                for (int32_t b : blocks) {
                    for (int64_t i = b * bs; i < std::min(m, (b + 1) * bs); ++i)
                        cand.push_back(static_cast<int32_t>(i));
                }
            }
            g0 = g1;
        }
    });
    if (trace != nullptr && L.kind == V41AttnKind::kReindex) {
        for (int64_t t = 0; t < n; ++t) {
            trace->candidate_entries[static_cast<size_t>(L.index)] +=
                static_cast<int64_t>(sel.candidates[static_cast<size_t>(t)].size());
        }
    }
}

void DeepseekV41Model::Impl::attention(const V41Layer& L, const float* h, const Tokens& tk,
                                       Selections& sel, float* out, V41Trace* trace) {
    const ModelConfig& c = cfg;
    const int64_t n = tk.size();
    const int64_t hd = c.head_dim;
    std::vector<float> qr, q, kv;
    internal::attn_project(L.attn, c, pool.get(), h, tk.pos, qr, q, kv);
    // e4m3: the window rows as stored (MXFP8), read back as stored by the chunk's queries
    // too, so a chunk equals token-by-token decode bitwise.
    std::vector<float> kvq;
    if (packed()) {
        internal::store_rows(
            kv, n, hd, swa_words,
            [&](const float* x, uint8_t* row) { internal::v41_swa_encode(x, hd, row); },
            [&](const uint8_t* row, float* y) { internal::v41_swa_decode(row, hd, y); }, kvq);
    }
    if (L.kind == V41AttnKind::kFull) compress(L, h, tk);
    if (L.kind != V41AttnKind::kWindow) select(L, h, qr, tk, sel, trace);
    static const std::vector<std::vector<int32_t>> kNone;
    const auto& chosen =
        L.kind == V41AttnKind::kWindow ? kNone : sel.chosen[static_cast<size_t>(L.index)];
    if (trace != nullptr && L.kind != V41AttnKind::kWindow) {
        for (int64_t t = 0; t < n; ++t) {
            trace->visible_entries[static_cast<size_t>(L.index)] += (tk.pos[t] + 1) / L.ratio;
            trace->attended_entries[static_cast<size_t>(L.index)] +=
                static_cast<int64_t>(chosen[static_cast<size_t>(t)].size());
        }
        trace->last_token_entries[static_cast<size_t>(L.index)] = chosen.back();
    }
    // Per token: the chosen entries of the kv source (ascending), the own window
    // (ascending positions), the sink; one softmax in that order.
    std::vector<float> o;
    const std::vector<int32_t> none;
    internal::AttendKeys keys;
    keys.chosen = [&](int64_t t) -> const std::vector<int32_t>& {
        return chosen.empty() ? none : chosen[static_cast<size_t>(t)];
    };
    keys.entry = [&](int64_t t, int32_t e, float* buf) {
        return read_main(entry_ptr(L.kv_src, tk.cache[t], e, false), buf);
    };
    keys.window = [&](int64_t t, int64_t s, float* buf) {
        return read_swa(ring_row(L, tk.cache[t], s), buf);
    };
    keys.window_floor = [&](int64_t t) { return window_floor(L, tk.cache[t]); };
    internal::attend(L.attn, c, pool.get(), tk, q, kv, keys, o);
    // The chunk's window rows into each sequence's ring (after every query read the old).
    const float* rows = packed() ? kvq.data() : kv.data();
    for (int64_t t = 0; t < n; ++t) {
        std::copy_n(rows + t * swa_words, swa_words, ring_row(L, tk.cache[t], tk.pos[t]));
    }
    internal::attn_output(L.attn, c, pool.get(), tk.pos, o, out);
}

// Single-pass mHC (reference §7.4): X' = comb X + post F(pre_prev X), the coefficients
// from this sub-layer's mixes of X, its pre handed to the next sub-layer.
Status DeepseekV41Model::Impl::block(const V41Layer& L, float* x, std::vector<float>& pre,
                                     const Tokens& tk, Selections& sel, V41Trace* trace) {
    const int64_t n = tk.size();
    const int64_t hcn = hc();
    const int64_t hid = H();
    const int64_t mix = (2 + hcn) * hcn;
    std::vector<float> xin(static_cast<size_t>(n * hid)), y(static_cast<size_t>(n * hid));
    std::vector<float> post(static_cast<size_t>(n * hcn)), comb(static_cast<size_t>(n * hcn * hcn));
    std::vector<float> next_pre(static_cast<size_t>(n * hcn)),
        next(static_cast<size_t>(n * hcn * hid));
    std::vector<float> mixes;
    for (int sub = 0; sub < 2; ++sub) {
        const HcParams& p = sub == 0 ? L.hc_attn : L.hc_ffn;
        internal::hc_mixes(p, cfg, pool.get(), x, n, mixes);
        for (int64_t t = 0; t < n; ++t) {
            internal::hc_coefficients(p, cfg, mixes.data() + t * mix, next_pre.data() + t * hcn,
                                      post.data() + t * hcn, comb.data() + t * hcn * hcn);
        }
        internal::hc_mix_in(x, pre.data(), n, hcn, hid, xin.data());
        if (sub == 0) {
            rms_norm(xin.data(), L.attn_norm.data(), n, hid, xin.data());
            attention(L, xin.data(), tk, sel, y.data(), trace);
        } else {
            rms_norm(xin.data(), L.ffn_norm.data(), n, hid, xin.data());
            if (grouped()) {
                DSI_RETURN_IF_ERROR(internal::moe_forward_ep(L.moe, cfg, pool.get(), *ep,
                                                             static_cast<int>(L.index), xin.data(),
                                                             tk.ids, n, y.data()));
            } else {
                internal::moe_forward(L.moe, cfg, pool.get(), xin.data(), tk.ids, n, y.data());
            }
        }
        internal::hc_post(x, y.data(), post.data(), comb.data(), n, hcn, hid, next.data());
        std::copy(next.begin(), next.end(), x);
        pre.swap(next_pre);
    }
    return Status::ok();
}

namespace {

// The tokens `which` of tk (in order; each sequence's tokens contiguous), as a batch.
Tokens token_subset(const Tokens& tk, std::span<const int64_t> which) {
    Tokens sub;
    for (int64_t t : which) {
        const bool first = sub.size() == 0 || sub.cache.back() != tk.cache[t];
        sub.chunk_first.push_back(first ? sub.size() : sub.chunk_first.back());
        sub.chunk_start.push_back(first ? tk.pos[t] : sub.chunk_start.back());
        sub.ids.push_back(tk.ids[static_cast<size_t>(t)]);
        sub.pos.push_back(tk.pos[t]);
        sub.cache.push_back(tk.cache[t]);
    }
    return sub;
}

// Rows `which` of a [tokens, width] array.
std::vector<float> row_subset(const std::vector<float>& a, int64_t width,
                              std::span<const int64_t> which) {
    std::vector<float> out(which.size() * static_cast<size_t>(width));
    for (size_t i = 0; i < which.size(); ++i) {
        std::copy_n(a.data() + which[i] * width, width,
                    out.data() + static_cast<int64_t>(i) * width);
    }
    return out;
}

}  // namespace

Status DeepseekV41Model::Impl::run(std::span<const SequenceStep> steps, const Tokens& tk,
                                   bool encoder_only, std::vector<float>& x,
                                   std::vector<float>& pre, V41Trace* trace,
                                   std::vector<int64_t>& row) {
    Status s = grouped() ? ep->begin_pass(tk.size()) : Status::ok();
    if (s.is_ok()) s = run_layers(steps, tk, encoder_only, x, pre, trace, row);
    // With expert parallelism a failure ends this rank's membership: its peers must not
    // wait for a collective it will not join.
    if (!s.is_ok() && ep != nullptr) ep->abandon();
    return s;
}

Status DeepseekV41Model::Impl::run_layers(std::span<const SequenceStep> steps, const Tokens& tk,
                                          bool encoder_only, std::vector<float>& x,
                                          std::vector<float>& pre, V41Trace* trace,
                                          std::vector<int64_t>& row) {
    const int64_t n = tk.size();
    const int64_t hcn = hc();
    const int64_t nl = cfg.num_hidden_layers;
    x.resize(static_cast<size_t>(n * hcn * H()));
    for (int64_t t = 0; t < n; ++t) {
        float* xt = x.data() + t * hcn * H();
        embed.dequantize_row(tk.ids[static_cast<size_t>(t)], xt);
        for (int64_t j = 1; j < hcn; ++j) std::copy_n(xt, H(), xt + j * H());
    }
    // The first sub-layer reads stream 0.
    pre.assign(static_cast<size_t>(n * hcn), 0.0f);
    for (int64_t t = 0; t < n; ++t) pre[t * hcn] = 1.0f;
    if (trace != nullptr) {
        *trace = V41Trace{};
        for (auto* v :
             {&trace->visible_entries, &trace->attended_entries, &trace->candidate_entries}) {
            v->assign(static_cast<size_t>(nl), 0);
        }
        trace->last_token_entries.assign(static_cast<size_t>(nl), {});
        trace->engram_gate_mean.assign(static_cast<size_t>(nl), 0.0);
    }
    // CED compact prefill (S-SWA): the decoder runs for the tokens at or past their
    // step's decoder_begin; `skipped` are the others (gather_steps keeps step order).
    std::vector<int64_t> skipped, decoded;
    {
        int64_t t = 0;
        for (const SequenceStep& st : steps) {
            for (size_t k = 0; k < st.tokens.size(); ++k, ++t) {
                (!encoder_only && tk.pos[t] >= st.decoder_begin ? decoded : skipped).push_back(t);
            }
        }
    }
    row.assign(static_cast<size_t>(n), -1);
    for (size_t i = 0; i < decoded.size(); ++i)
        row[static_cast<size_t>(decoded[i])] = static_cast<int64_t>(i);
    Selections sel;
    sel.chosen.resize(static_cast<size_t>(nl));
    const Tokens* cur = &tk;
    Tokens sub;
    for (const V41Layer& L : layers) {
        if (L.index == first_decoder && !skipped.empty()) {
            // CED: the decoder's kv source reads the encoder's output through its
            // attention input (the previous sub-layer's pre and attn_norm); for the
            // tokens the decoder skips, that projection is all that runs.
            const Tokens th = token_subset(tk, skipped);
            const std::vector<float> xh = row_subset(x, hcn * H(), skipped);
            const std::vector<float> ph = row_subset(pre, hcn, skipped);
            std::vector<float> h(skipped.size() * static_cast<size_t>(H()));
            internal::hc_mix_in(xh.data(), ph.data(), th.size(), hcn, H(), h.data());
            rms_norm(h.data(), L.attn_norm.data(), th.size(), H(), h.data());
            compress(L, h.data(), th);
            if (decoded.empty()) {
                // The decoder runs none of this rank's tokens; under expert parallelism
                // its MoE layers' exchanges still need this rank.
                if (grouped()) DSI_RETURN_IF_ERROR(ep->join_layers(static_cast<int>(L.index)));
                break;
            }
            // The decoder's Engram reads the skipped tokens' ids from the slot.
            if (ids_ring >= 0) {
                for (int64_t t : skipped) {
                    const int32_t id = tk.ids[static_cast<size_t>(t)];
                    std::memcpy(tk.cache[t]->state() + ids_ring + tk.pos[t] % ids_ring_len, &id,
                                sizeof id);
                }
            }
            sub = token_subset(tk, decoded);
            x = row_subset(x, hcn * H(), decoded);
            pre = row_subset(pre, hcn, decoded);
            cur = &sub;
        }
        if (L.index >= first_decoder) DSI_CHECK(L.topk_src < 0 || L.topk_src >= first_decoder);
        if (L.engram >= 0)
            engram_forward(engrams[static_cast<size_t>(L.engram)], L.index, x.data(), *cur, trace);
        DSI_RETURN_IF_ERROR(block(L, x.data(), pre, *cur, sel, trace));
        if (trace != nullptr) trace->layer_streams.push_back(x);
    }
    for (const SequenceStep& st : steps) {
        float* slot = st.cache->state();
        header_set(slot, 0, header_get(slot, 0) + static_cast<int64_t>(st.tokens.size()));
    }
    if (ids_ring >= 0) {
        for (int64_t t = 0; t < n; ++t) {
            const int32_t id = tk.ids[static_cast<size_t>(t)];
            std::memcpy(tk.cache[t]->state() + ids_ring + tk.pos[t] % ids_ring_len, &id, sizeof id);
        }
    }
    return Status::ok();
}

Status DeepseekV41Model::Impl::begin_replays(std::span<const SequenceStep> steps) {
    for (const SequenceStep& st : steps) {
        float* slot = st.cache->state();
        if (st.replay_end > st.start_pos) {
            // S-SWA encoder side: a fresh state at start_pos; the windows of both halves
            // start at the segment, the block KV below replay_end is read only.
            reset_state(slot);
            header_set(slot, 0, st.start_pos);
            header_set(slot, kEncoderFloor, st.start_pos);
            header_set(slot, kDecoderFloor, st.start_pos);
            header_set(slot, kReuseEnd, st.replay_end);
            if (ids_ring >= 0) {
                const int64_t have = std::min(st.start_pos, ids_ring_len);
                for (int64_t k = 1; k <= have; ++k) {
                    const int32_t id = st.context[st.context.size() - static_cast<size_t>(k)];
                    std::memcpy(slot + ids_ring + (st.start_pos - k) % ids_ring_len, &id,
                                sizeof id);
                }
            }
        }
        if (st.decoder_begin > 0 && st.decoder_begin >= st.start_pos) {
            header_set(slot, kDecoderFloor,
                       std::max(st.decoder_begin, header_get(slot, kDecoderFloor)));
        }
    }
    return Status::ok();
}

Status DeepseekV41Model::Impl::gather(std::span<const SequenceStep> steps, Tokens& tk,
                                      std::vector<int64_t>& logit_tokens,
                                      std::vector<int64_t>& logit_row) {
    for (size_t i = 0; i < steps.size(); ++i) {
        const SequenceStep& st = steps[i];
        const std::string which = "forward: sequence " + std::to_string(i);
        const auto T = static_cast<int64_t>(st.tokens.size());
        if (st.replay_end < 0 || st.decoder_begin < 0) {
            return invalid_argument(which + ": negative replay_end or decoder_begin");
        }
        if (st.replay_end == 0) continue;
        if (st.replay_end <= st.start_pos || st.replay_end > st.start_pos + T) {
            return invalid_argument(which + ": replay_end " + std::to_string(st.replay_end) +
                                    " is not inside the step's positions (" +
                                    std::to_string(st.start_pos) + ", " +
                                    std::to_string(st.start_pos + T) + "]");
        }
        for (const V41Layer& L : layers) {
            if (L.ratio > 1 && (st.start_pos % L.ratio != 0 || st.replay_end % L.ratio != 0)) {
                return invalid_argument(which + ": a replay must start and end on a group of " +
                                        std::to_string(L.ratio) + " tokens");
            }
        }
        if (ids_ring >= 0 &&
            static_cast<int64_t>(st.context.size()) < std::min(st.start_pos, ids_ring_len)) {
            return invalid_argument(which + ": a replay needs the " + std::to_string(ids_ring_len) +
                                    " tokens before its start in `context` (Engram n-grams)");
        }
    }
    DSI_RETURN_IF_ERROR(internal::gather_steps(steps, cfg, "V4.1", tk, logit_tokens, logit_row,
                                               /*bounded_replay=*/true));
    for (const SequenceStep& st : steps) {
        if (st.start_pos == 0) reset_state(st.cache->state());
    }
    return begin_replays(steps);
}

// ---- public API ----

DeepseekV41Model::DeepseekV41Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeepseekV41Model::~DeepseekV41Model() = default;
const ModelConfig& DeepseekV41Model::config() const { return impl_->cfg; }
KvLayout DeepseekV41Model::kv_layout() const { return impl_->layout; }
kernels::KvDtype DeepseekV41Model::kv_dtype() const { return impl_->kv_dtype; }
int64_t DeepseekV41Model::num_draft_tensors() const {
    return static_cast<int64_t>(impl_->draft_matrices.size() + impl_->draft_vectors.size());
}

std::vector<float> DeepseekV41Model::window_row(KvCache& cache, int64_t layer, int64_t pos) const {
    const Impl& m = *impl_;
    DSI_CHECK(layer >= 0 && layer < m.cfg.num_hidden_layers && pos >= 0);
    std::vector<float> out(static_cast<size_t>(m.cfg.head_dim));
    const float* row = m.ring_row(m.layers[static_cast<size_t>(layer)], &cache, pos);
    const float* v = m.read_swa(row, out.data());
    if (v != out.data()) std::copy_n(v, m.cfg.head_dim, out.data());
    return out;
}

std::unique_ptr<KvCache> DeepseekV41Model::new_kv_cache(int64_t capacity) const {
    auto cache = std::make_unique<ContiguousKvCache>(impl_->layout, capacity);
    impl_->reset_state(cache->state());
    return cache;
}

Result<std::unique_ptr<DeepseekV41Model>> DeepseekV41Model::load(
    std::unique_ptr<WeightSource> source, Options options) {
    auto impl = std::make_unique<Impl>();
    impl->cfg = source->config();
    if (!impl->cfg.is_v41()) {
        return invalid_argument(source->description() + ": architecture '" +
                                impl->cfg.architecture + "' is not DeepseekV41ForCausalLM");
    }
    DSI_RETURN_IF_ERROR(impl->cfg.validate());
    if (options.kv_dtype == kernels::KvDtype::kBf16) {
        return invalid_argument("DeepSeek V4.1: kv dtype 'bf16' is not supported (f32 or e4m3)");
    }
    impl->kv_dtype = options.kv_dtype;
    impl->source = std::move(source);
    impl->loader.source = impl->source.get();
    DSI_RETURN_IF_ERROR(
        internal::parse_weight_formats(options.weight_format, impl->loader.formats));
    impl->pool = std::make_unique<ThreadPool>(options.num_threads);
    const ModelConfig& c = impl->cfg;
    WeightSource& src = *impl->source;
    if (impl->packed() && (c.index_head_dim & (c.index_head_dim - 1)) != 0) {
        return invalid_argument(
            "DeepSeek V4.1: kv dtype 'e4m3' needs a power-of-two "
            "index_head_dim (its keys are Hadamard-rotated MXFP4); the "
            "config has " +
            std::to_string(c.index_head_dim));
    }
    impl->layers.resize(static_cast<size_t>(c.num_hidden_layers));
    if (options.expert_parallel.enabled()) {
        // Joined before the weights load: a rank whose load fails leaves the group at
        // once, so its peers fail fast instead of at their attach deadline.
        DSI_ASSIGN_OR_RETURN(
            impl->ep, internal::join_expert_parallel(options.expert_parallel, impl->cfg,
                                                     impl->loader, impl->pool.get(), impl->layers));
    }
    DSI_ASSIGN_OR_RETURN(impl->embed, src.matrix("embed.weight", c.vocab_size, c.hidden_size));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        V41Layer& L = impl->layers[static_cast<size_t>(i)];
        DSI_RETURN_IF_ERROR(impl->load_layer(i, L));
        if (const int64_t e = v41_engram_index(c, i); e >= 0) {
            L.engram = static_cast<int64_t>(impl->engrams.size());
            impl->engrams.emplace_back();
            DSI_RETURN_IF_ERROR(impl->load_engram(i, e, impl->engrams.back()));
        }
    }
    DSI_ASSIGN_OR_RETURN(impl->final_norm, src.vector("norm.weight", c.hidden_size));
    DSI_RETURN_IF_ERROR(impl->loader.linear("head.weight", c.vocab_size, c.hidden_size,
                                            WeightClass::kHead, impl->head));
    // DSpark: every tensor checked and held, none packed (speculative decoding's issue).
    // Expert parallelism leaves them out (their experts would be every rank's).
    for (const V4TensorSpec& spec : deepseek_v41_tensor_specs(c)) {
        if (!spec.name.starts_with("mtp.") || impl->ep != nullptr) continue;
        if (spec.shape.size() == 1) {
            DSI_ASSIGN_OR_RETURN(std::vector<float> v, src.vector(spec.name, spec.shape[0]));
            impl->draft_vectors.push_back(std::move(v));
        } else {
            DSI_ASSIGN_OR_RETURN(WeightMatrix m,
                                 src.matrix(spec.name, spec.shape[0], spec.shape[1]));
            impl->draft_matrices.push_back(m);
        }
    }
    impl->plan_cache();
    return std::unique_ptr<DeepseekV41Model>(new DeepseekV41Model(std::move(impl)));
}

Status DeepseekV41Model::forward_batch(std::span<const SequenceStep> steps, BatchOutput& out) {
    return forward_batch(steps, out, nullptr);
}

Status DeepseekV41Model::forward_batch(std::span<const SequenceStep> steps, BatchOutput& out,
                                       V41Trace* trace) {
    Impl& m = *impl_;
    Tokens tk;
    std::vector<int64_t> logit_tokens;
    if (Status s = m.gather(steps, tk, logit_tokens, out.logit_row); !s.is_ok()) {
        if (m.ep != nullptr) m.ep->abandon();  // bad input ends this rank's membership too
        return s;
    }
    std::vector<float> x, pre;
    std::vector<int64_t> row;
    DSI_RETURN_IF_ERROR(m.run(steps, tk, false, x, pre, trace, row));
    // The last sub-layer's pre collapses the streams; then norm and head. A token the
    // decoder did not run for (below its step's decoder_begin) has a NaN row.
    const int64_t rows = static_cast<int64_t>(logit_tokens.size());
    const int64_t hcn = m.hc();
    const int64_t h = m.H();
    const int64_t V = m.cfg.vocab_size;
    std::vector<int64_t> have;  // logit rows the decoder ran for
    for (int64_t r = 0; r < rows; ++r) {
        if (row[static_cast<size_t>(logit_tokens[static_cast<size_t>(r)])] >= 0) have.push_back(r);
    }
    const auto nh = static_cast<int64_t>(have.size());
    std::vector<float> xs(static_cast<size_t>(nh * hcn * h)), ps(static_cast<size_t>(nh * hcn));
    std::vector<float> y(static_cast<size_t>(nh * h)), lg(static_cast<size_t>(nh * V));
    for (int64_t k = 0; k < nh; ++k) {
        const int64_t t = row[static_cast<size_t>(logit_tokens[static_cast<size_t>(have[k])])];
        std::copy_n(x.data() + t * hcn * h, hcn * h, xs.data() + k * hcn * h);
        std::copy_n(pre.data() + t * hcn, hcn, ps.data() + k * hcn);
    }
    out.logits.assign(static_cast<size_t>(rows * V), std::numeric_limits<float>::quiet_NaN());
    if (nh > 0) {
        internal::hc_mix_in(xs.data(), ps.data(), nh, hcn, h, y.data());
        m.rms_norm(y.data(), m.final_norm.data(), nh, h, y.data());
        m.matmul(m.head, y.data(), nh, lg.data());
        for (int64_t k = 0; k < nh; ++k) {
            std::copy_n(lg.data() + k * V, V, out.logits.data() + have[k] * V);
        }
    }
    out.hidden.clear();
    return Status::ok();
}

Result<CausalLm::GroupStep> DeepseekV41Model::group_idle_step(bool leaving) {
    return internal::group_idle_step(impl_->ep.get(), leaving);
}

std::optional<ExpertParallelStats> DeepseekV41Model::expert_parallel_stats(
    size_t max_windows) const {
    return internal::group_stats(impl_->ep.get(), max_windows);
}

Status DeepseekV41Model::forward_encoder(std::span<const SequenceStep> steps) {
    Impl& m = *impl_;
    Tokens tk;
    std::vector<int64_t> logit_tokens, logit_row;
    if (Status s = m.gather(steps, tk, logit_tokens, logit_row); !s.is_ok()) {
        if (m.ep != nullptr) m.ep->abandon();  // bad input ends this rank's membership too
        return s;
    }
    std::vector<float> x, pre;
    std::vector<int64_t> row;
    return m.run(steps, tk, true, x, pre, nullptr, row);
}

}  // namespace dsi
