// V4.1 bounded replay figures (issue 16, S-SWA; bench/RESULTS.md), on the model itself
// (DeepseekV41Model, tiny-v41's synthetic weights, f32 KV, one thread):
//
//   hit-cost  the cost of a prefix hit whose SWA state is missing, per context C: the
//             sequence holds the block KV of [0, C + 128); the hit replays [C, C + 128)
//             with truncated attention and computes the 134-token suffix (S-KV-10's
//             shortest one) in one step. Against it: the exact alternative, computing
//             [0, C + 262) from nothing.
//   prefill   a cold prompt of N tokens with CED compact prefill (the decoder only over
//             the last keep tokens) against every layer over every token: time and
//             counted FLOPs (matmul shapes of each layer times the tokens it ran, plus
//             the indexer's scored entries and the attended keys from V41Trace).
//   kl        bounded vs exact replay over P prompts of L tokens: the exact next-token
//             distribution from a cold prefill; the bounded one from the same block KV,
//             the window state lost, [L1 - 128, L) replayed. KL(exact || bounded) and
//             top-1 agreement; and the same for CED compact vs every-layer prefill.
//   hit-cost-wide DIR T C...
//             the same hit on the `v41-flash-4l` preset (V4.1-Flash's real widths on 4
//             layers), written to DIR as an HF checkpoint on first use and loaded from
//             it (FP8 / FP4 weights as stored), T threads. The block KV of [0, C + 128)
//             is filled with random entries instead of a prefill (the hit only reads
//             it; computing it at these widths would take hours), so there is no
//             exact-alternative column. One warm-up hit, then 3 repetitions alternating
//             over the contexts; medians with min-max, and the hit's counted FLOPs split
//             into the constant part and the indexer's scoring.
//   flops C...
//             counted FLOPs of the same hit, per context, for V4.1-Flash's real 40-layer
//             config (reference deepseek_v4.md §7.1), v41-flash-4l and tiny-v41: the constant
//             part (projections, MoE, mHC, attention over top-512 + window) and the
//             indexers' scoring, from the shapes alone (no weights).
//   scorer M...
//             the Full layers' index scoring alone at V4.1-Flash's shape (32 heads x 128)
//             for one token against M keys (f32, random), one thread: the per-head dots
//             (`IndexQueries::score`, V4) against the register-tiled kernel
//             (`IndexQueries::score_keys`, kernels::index_scores, V4.1); one warm-up,
//             then 5 repetitions alternating, medians with min-max and GFLOP/s.
//
// Usage: v41_replay_bench hit-cost C... | prefill N... | kl P L | hit-cost-wide DIR T C...
//        | flops C... | scorer M...
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/env.h"
#include "kernels/ops.h"
#include "model/checkpoint_writer.h"
#include "model/deepseek_v41.h"
#include "model/internal/v4_blocks.h"
#include "model/synthetic.h"
#include "model/v41_config.h"

namespace dsi {
namespace {

constexpr int64_t kUnit = 128;
constexpr int64_t kKeep = 140;  // DSINFER_YOCO_PREFILL_KEEP_TOKENS' default

std::unique_ptr<DeepseekV41Model> load_tiny() {
    const ModelConfig c = synthetic_preset("tiny-v41").value();
    DeepseekV41Model::Options o;
    o.num_threads = 1;
    auto m = DeepseekV41Model::load(synthetic_v4_memory_model(c, 1), o);
    if (!m.is_ok()) {
        std::fprintf(stderr, "%s\n", m.status().to_string().c_str());
        std::exit(1);
    }
    return std::move(m).value();
}

std::vector<int32_t> random_ids(int64_t n, uint64_t seed, int64_t vocab) {
    SplitMix64 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
    return ids;
}

void forward(DeepseekV41Model& m, SequenceStep st, BatchOutput& out, V41Trace* trace = nullptr) {
    const Status s = m.forward_batch(std::span(&st, 1), out, trace);
    if (!s.is_ok()) {
        std::fprintf(stderr, "forward: %s\n", s.to_string().c_str());
        std::exit(1);
    }
}

// Prefills ids[0, n) into cache in chunks of 512 (every layer).
void prefill(DeepseekV41Model& m, KvCache& cache, std::span<const int32_t> ids, int64_t n) {
    BatchOutput out;
    for (int64_t b = 0; b < n; b += 512) {
        const int64_t e = std::min<int64_t>(b + 512, n);
        forward(m, {ids.subspan(static_cast<size_t>(b), static_cast<size_t>(e - b)), b, &cache},
                out);
    }
}

double ms_since(int64_t t0) { return static_cast<double>(steady_clock_ns() - t0) / 1e6; }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

void hit_cost(const std::vector<int64_t>& contexts) {
    auto m = load_tiny();
    const int64_t vocab = m->config().vocab_size;
    std::printf(
        "| context C | hit (replay [C, C+128) + 134-token suffix), ms | tokens run | indexer "
        "entries scored in the hit | exact: [0, C+262) cold, ms |\n|---|---|---|---|---|\n");
    for (int64_t C : contexts) {
        const int64_t L = C + kUnit + 134, L1 = C + kUnit;
        const std::vector<int32_t> ids = random_ids(L, static_cast<uint64_t>(C), vocab);
        auto cache = m->new_kv_cache(L);
        int64_t t0 = steady_clock_ns();
        prefill(*m, *cache, ids, L);
        const double cold = ms_since(t0);
        std::vector<double> hit;
        V41Trace tr;
        for (int r = 0; r < 5; ++r) {
            SequenceStep st{std::span(ids).subspan(static_cast<size_t>(C)), C, cache.get()};
            st.replay_end = L1;
            st.context = std::span(ids).subspan(static_cast<size_t>(C - 16), 16);
            st.decoder_begin = L - kKeep;  // compact prefill of the suffix
            BatchOutput out;
            t0 = steady_clock_ns();
            forward(*m, st, out, &tr);
            hit.push_back(ms_since(t0));
        }
        int64_t scored = 0;
        for (size_t l = 0; l < tr.visible_entries.size(); ++l) {
            const V41AttnKind kind = v41_attn_kind(m->config(), static_cast<int64_t>(l));
            if (kind == V41AttnKind::kFull) scored += tr.visible_entries[l];
            if (kind == V41AttnKind::kReindex) scored += tr.candidate_entries[l];
        }
        std::printf("| %lld | %.1f (min %.1f) | %lld | %lld | %.0f |\n", static_cast<long long>(C),
                    median(hit), *std::min_element(hit.begin(), hit.end()),
                    static_cast<long long>(L - C), static_cast<long long>(scored), cold);
        std::fflush(stdout);
    }
}

// Multiply-adds of one token through layer l's dense parts (projections, compressor,
// indexer projections, MoE, mHC mixes, Engram), times 2.
double dense_flops(const ModelConfig& c, int64_t l) {
    const double H = static_cast<double>(c.hidden_size),
                 nh = static_cast<double>(c.num_attention_heads),
                 hd = static_cast<double>(c.head_dim), ql = static_cast<double>(c.q_lora_rank),
                 ol = static_cast<double>(c.o_lora_rank), G = static_cast<double>(c.o_groups),
                 hcn = static_cast<double>(c.hc_mult), ih = static_cast<double>(c.index_n_heads),
                 ihd = static_cast<double>(c.index_head_dim);
    double mac = H * ql + ql * nh * hd + H * hd + nh * hd * ol + G * ol * H;  // attention
    mac += 2 * (2 + hcn) * hcn * hcn * H;                                     // mHC mixes
    const V41AttnKind kind = v41_attn_kind(c, l);
    if (kind == V41AttnKind::kFull) {
        const double r = static_cast<double>(c.compress_ratio(l));
        mac += H * hd * (r > 1 ? 2 : 1) + hd * ihd / r;  // compressor + index key per entry
    }
    if (kind == V41AttnKind::kFull || kind == V41AttnKind::kReindex) mac += ql * ih * ihd + H * ih;
    const double E = static_cast<double>(c.n_routed_experts),
                 k = static_cast<double>(c.num_experts_per_tok + c.n_shared_experts),
                 I = static_cast<double>(c.moe_intermediate_size);
    mac += H * E + k * 3 * H * I;
    if (v41_engram_index(c, l) >= 0) {
        const double sub =
            static_cast<double>((c.v41.engram_max_ngram_size - 1) * c.v41.engram_n_heads);
        mac += sub * static_cast<double>(c.v41.engram_head_dim) * (hcn + 1) * H;
    }
    return 2 * mac;
}

// Counted FLOPs of one forward call, in three parts: the dense work that is the same
// at every context (projections, MoE, mHC, Engram, the decoder's kv-source projection
// of the tokens it skipped, the head), the indexers' scoring (Full layers: every
// visible entry; Reindex layers: the candidates) and attention (the chosen entries and
// the window, QK and PV).
struct Flops {
    double dense = 0, indexer = 0, attention = 0;
    double total() const { return dense + indexer + attention; }
};

// One query's index score of one entry (all index heads), and its attention to one key
// (QK and PV over every head).
double index_flops_per_entry(const ModelConfig& c) {
    return 2.0 * static_cast<double>(c.index_n_heads * c.index_head_dim);
}
double attention_flops_per_key(const ModelConfig& c) {
    return 4.0 * static_cast<double>(c.num_attention_heads * c.head_dim);
}

// Window keys of a query at offset k (0-based) from where its window floor is.
double window_keys(const ModelConfig& c, int64_t k) {
    return static_cast<double>(std::min<int64_t>(k + 1, c.sliding_window));
}

// The dense part shared by a prefill and a hit: n tokens through the encoder, the last
// `tail` of them through the decoder.
double dense_part(const ModelConfig& c, int64_t n, int64_t tail) {
    const int64_t dec = v41_first_decoder_layer(c);
    double f = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        f += static_cast<double>(l < dec ? n : tail) * dense_flops(c, l);
    // The decoder's kv source projection for the tokens the decoder skipped.
    f += static_cast<double>(n - tail) * 2 *
         (static_cast<double>(c.hidden_size * c.head_dim) +
          static_cast<double>(c.head_dim * c.index_head_dim) /
              static_cast<double>(c.compress_ratio(dec)));
    f += 2 * static_cast<double>(c.hidden_size * c.vocab_size);  // the head, last token
    return f;
}

// From a trace of one call that ran n tokens whose decoder ran for the last `tail` of
// them (the windows floored at the first token of each half: a cold prefill, or a hit
// whose replay starts the call).
Flops trace_flops(const ModelConfig& c, const V41Trace& tr, int64_t n, int64_t tail) {
    const int64_t dec = v41_first_decoder_layer(c);
    const double per_entry = index_flops_per_entry(c), per_key = attention_flops_per_key(c);
    Flops f;
    f.dense = dense_part(c, n, tail);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        const size_t i = static_cast<size_t>(l);
        const V41AttnKind kind = v41_attn_kind(c, l);
        if (kind == V41AttnKind::kFull)
            f.indexer += static_cast<double>(tr.visible_entries[i]) * per_entry;
        if (kind == V41AttnKind::kReindex)
            f.indexer += static_cast<double>(tr.candidate_entries[i]) * per_entry;
        double window = 0;
        const int64_t first = l < dec ? 0 : n - tail;
        for (int64_t p = first; p < n; ++p) window += window_keys(c, p - first);
        f.attention += per_key * (static_cast<double>(tr.attended_entries[i]) + window);
    }
    return f;
}

// The same for the hit of hit_cost at context C (replay [C, C + 128) and the 134-token
// suffix in one call, the decoder over the last kKeep tokens), from the shapes alone:
// what trace_flops counts, with the visible entries, candidates and top-k sizes
// worked out per position.
Flops shape_hit_flops(const ModelConfig& c, int64_t C) {
    const int64_t n = kUnit + 134, tail = kKeep, dec = v41_first_decoder_layer(c);
    const double per_entry = index_flops_per_entry(c), per_key = attention_flops_per_key(c);
    Flops f;
    f.dense = dense_part(c, n, tail);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        const int64_t first = l < dec ? 0 : n - tail;
        const V41AttnKind kind = v41_attn_kind(c, l);
        const int64_t r = c.compress_ratio(l);
        for (int64_t k = first; k < n; ++k) {
            const int64_t pos = C + k;
            double attended = 0;
            if (kind != V41AttnKind::kWindow) {
                const int64_t visible = (pos + 1) / r;
                const int64_t bs = c.v41.candidate_block_size;
                const int64_t pool = std::min((visible + bs - 1) / bs, c.v41.candidate_topk_blocks);
                const int64_t candidates = std::min(visible, pool * bs);
                if (kind == V41AttnKind::kFull)
                    f.indexer += static_cast<double>(visible) * per_entry;
                if (kind == V41AttnKind::kReindex)
                    f.indexer += static_cast<double>(candidates) * per_entry;
                attended = static_cast<double>(std::min(visible, c.index_topk));
            }
            f.attention += per_key * (attended + window_keys(c, k - first));
        }
    }
    return f;
}

void prefill_figure(const std::vector<int64_t>& sizes) {
    auto m = load_tiny();
    const ModelConfig& c = m->config();
    std::printf(
        "| prompt N | every layer: ms, GFLOP | CED compact (keep %lld): ms, GFLOP | time ratio | "
        "FLOP ratio |\n|---|---|---|---|---|\n",
        static_cast<long long>(kKeep));
    for (int64_t n : sizes) {
        const std::vector<int32_t> ids = random_ids(n, static_cast<uint64_t>(n) + 5, c.vocab_size);
        double ms[2], gf[2];
        for (int compact = 0; compact < 2; ++compact) {
            std::vector<double> t;
            V41Trace tr;
            for (int r = 0; r < 3; ++r) {
                auto cache = m->new_kv_cache(n);
                SequenceStep st{ids, 0, cache.get()};
                st.decoder_begin = compact ? std::max<int64_t>(0, n - kKeep) : 0;
                BatchOutput out;
                const int64_t t0 = steady_clock_ns();
                forward(*m, st, out, &tr);
                t.push_back(ms_since(t0));
            }
            ms[compact] = median(t);
            gf[compact] = trace_flops(c, tr, n, compact ? std::min(n, kKeep) : n).total() / 1e9;
        }
        std::printf("| %lld | %.0f, %.3f | %.0f, %.3f | %.2f | %.2f |\n", static_cast<long long>(n),
                    ms[0], gf[0], ms[1], gf[1], ms[1] / ms[0], gf[1] / gf[0]);
        std::fflush(stdout);
    }
}

// V4.1-Flash's 40 layers (reference deepseek_v4.md §7.1, §7.2) on the widths of
// v41-flash-4l, for counting only: the shapes, no weights.
ModelConfig v41_flash_config() {
    ModelConfig c = synthetic_preset("v41-flash-4l").value();
    c.vocab_size = 129280;
    c.num_hidden_layers = 40;
    c.n_routed_experts = 384;
    c.compress_ratios = {0, 0};
    c.compress_ratios.insert(c.compress_ratios.end(), 18, 2);
    c.compress_ratios.insert(c.compress_ratios.end(), 20, 1);
    c.v41.kv_source_layer_ids = {2, 8, 14, 20};
    c.v41.index_source_layer_ids = {2, 8, 14, 20, 24, 28, 32, 36};
    c.v41.candidate_source_layer_id = 20;
    c.v41.engram_layer_ids = {1, 14};
    c.v41.engram_max_ngram_size = 4;
    c.v41.engram_n_heads = 8;
    c.v41.engram_head_dim = 256;
    return c;
}

void flops_figure(const std::vector<int64_t>& contexts) {
    const ModelConfig real = v41_flash_config();
    const ModelConfig four = synthetic_preset("v41-flash-4l").value();
    const ModelConfig tiny = synthetic_preset("tiny-v41").value();
    const int64_t n = kUnit + 134;
    // Per token, the constant part: one encoder token, one decoder token (dense only).
    const int64_t dec = v41_first_decoder_layer(real);
    double enc_tok = 0, dec_tok = 0;
    for (int64_t l = 0; l < real.num_hidden_layers; ++l)
        (l < dec ? enc_tok : dec_tok) += dense_flops(real, l);
    std::printf("V4.1-Flash (40 layers): dense GFLOP per token: encoder %.2f, decoder %.2f\n",
                enc_tok / 1e9, dec_tok / 1e9);
    std::printf(
        "| model | context C | dense GFLOP | attention GFLOP | indexer GFLOP | total | "
        "indexer share | total / first |\n|---|---|---|---|---|---|---|---|\n");
    for (const auto& [name, c] : {std::pair<const char*, const ModelConfig*>{"V4.1-Flash", &real},
                                  {"v41-flash-4l", &four},
                                  {"tiny-v41", &tiny}}) {
        double first = 0;
        for (int64_t C : contexts) {
            const Flops f = shape_hit_flops(*c, C);
            if (first == 0) first = f.total();
            std::printf("| %s | %lld | %.1f | %.2f | %.2f | %.1f | %.1f %% | %.3f |\n", name,
                        static_cast<long long>(C), f.dense / 1e9, f.attention / 1e9,
                        f.indexer / 1e9, f.total() / 1e9, 100 * f.indexer / f.total(),
                        f.total() / first);
        }
    }
    std::printf("(the hit: %lld tokens through the encoder, the last %lld through the decoder)\n",
                static_cast<long long>(n), static_cast<long long>(kKeep));
}

// Writes v41-flash-4l to `dir` unless a config.json is there, and loads it.
std::unique_ptr<DeepseekV41Model> load_wide(const std::string& dir, int threads) {
    Env* env = Env::default_env();
    const auto fail = [](const Status& s) {
        std::fprintf(stderr, "%s\n", s.to_string().c_str());
        std::exit(1);
    };
    if (!env->file_exists(dir + "/config.json")) {
        const ModelConfig c = synthetic_preset("v41-flash-4l").value();
        const int64_t t0 = steady_clock_ns();
        if (Status s = env->create_dirs(dir); !s.is_ok()) fail(s);
        // No tokenizer: the bench feeds token ids.
        if (Status s = write_hf_checkpoint(env, c, 1, TokenizerFiles{"{}", "{}"}, dir);
            !s.is_ok()) {
            fail(s);
        }
        std::printf("wrote v41-flash-4l to %s in %.0f s\n", dir.c_str(), ms_since(t0) / 1e3);
    }
    Result<std::unique_ptr<WeightSource>> src = open_checkpoint(env, dir);
    if (!src.is_ok()) fail(src.status());
    DeepseekV41Model::Options o;
    o.num_threads = threads;
    auto m = DeepseekV41Model::load(std::move(src).value(), o);
    if (!m.is_ok()) fail(m.status());
    return std::move(m).value();
}

// Random block KV for positions [0, end): every entry of every group (N(0, 1), the
// scale of the normalised entries and keys the compressor writes).
void fill_block_kv(const KvLayout& layout, KvCache& cache, int64_t end, uint64_t seed) {
    SplitMix64 rng(seed);
    for (size_t g = 0; g < layout.groups.size(); ++g) {
        const KvGroupLayout& gl = layout.groups[g];
        for (int64_t l = 0; l < gl.num_layers; ++l) {
            for (int64_t p = 0; p < end; p += gl.tokens_per_entry) {
                float* e = cache.entry(g, l, p);
                for (int64_t i = 0; i < gl.floats_per_entry; ++i)
                    e[i] = static_cast<float>(rng.next_normal());
            }
        }
    }
}

void hit_cost_wide(const std::string& dir, int threads, const std::vector<int64_t>& contexts) {
    auto m = load_wide(dir, threads);
    const ModelConfig& c = m->config();
    struct Context {
        int64_t C = 0;
        std::vector<int32_t> ids;
        std::unique_ptr<KvCache> cache;
        std::vector<double> ms;
        Flops flops;
    };
    std::vector<Context> ctx;
    for (int64_t C : contexts) {
        Context x;
        x.C = C;
        const int64_t L = C + kUnit + 134;
        x.ids = random_ids(L, static_cast<uint64_t>(C), c.vocab_size);
        x.cache = m->new_kv_cache(L);
        fill_block_kv(m->kv_layout(), *x.cache, C + kUnit, static_cast<uint64_t>(C) + 1);
        ctx.push_back(std::move(x));
    }
    const auto hit = [&](Context& x, V41Trace* trace) {
        const int64_t L = x.C + kUnit + 134;
        SequenceStep st{std::span(x.ids).subspan(static_cast<size_t>(x.C)), x.C, x.cache.get()};
        st.replay_end = x.C + kUnit;
        st.context = std::span(x.ids).subspan(static_cast<size_t>(x.C - 16), 16);
        st.decoder_begin = L - kKeep;
        BatchOutput out;
        const int64_t t0 = steady_clock_ns();
        forward(*m, st, out, trace);
        return ms_since(t0);
    };
    // Warm-up (untimed), which also records each context's trace for the FLOP count.
    for (Context& x : ctx) {
        V41Trace tr;
        const double ms = hit(x, &tr);
        x.flops = trace_flops(c, tr, kUnit + 134, kKeep);
        std::printf("warm-up C=%lld: %.0f ms\n", static_cast<long long>(x.C), ms);
        std::fflush(stdout);
    }
    for (int r = 0; r < 3; ++r) {
        for (Context& x : ctx) x.ms.push_back(hit(x, nullptr));
    }
    std::printf(
        "| context C | hit ms, median (min-max) | counted GFLOP: dense + attention + indexer | "
        "indexer share | GFLOP/s | time / first |\n|---|---|---|---|---|---|\n");
    const double first = median(ctx.front().ms);
    for (const Context& x : ctx) {
        const double med = median(x.ms);
        std::printf("| %lld | %.0f (%.0f-%.0f) | %.0f + %.1f + %.1f | %.1f %% | %.1f | %.3f |\n",
                    static_cast<long long>(x.C), med, *std::min_element(x.ms.begin(), x.ms.end()),
                    *std::max_element(x.ms.begin(), x.ms.end()), x.flops.dense / 1e9,
                    x.flops.attention / 1e9, x.flops.indexer / 1e9,
                    100 * x.flops.indexer / x.flops.total(), x.flops.total() / med / 1e6,
                    med / first);
    }
}

void scorer_figure(const std::vector<int64_t>& sizes) {
    constexpr int64_t kHeads = 32, kDim = 128;
    SplitMix64 rng(7);
    internal::IndexQueries iq;
    iq.heads = kHeads;
    iq.dim = kDim;
    for (int64_t i = 0; i < kHeads * kDim; ++i)
        iq.q.push_back(static_cast<float>(rng.next_normal()));
    for (int64_t h = 0; h < kHeads; ++h) iq.w.push_back(static_cast<float>(rng.next_normal()));
    iq.packed_heads = kernels::index_packed_heads(kHeads);
    iq.qt.resize(static_cast<size_t>(kDim * iq.packed_heads));
    iq.wt.resize(static_cast<size_t>(iq.packed_heads));
    kernels::index_pack_queries(iq.q.data(), iq.w.data(), kHeads, kDim, iq.qt.data(), iq.wt.data());
    std::printf("isa %s, one thread, %lld heads x %lld\n",
                std::string(kernels::isa_name(kernels::active_isa())).c_str(),
                static_cast<long long>(kHeads), static_cast<long long>(kDim));
    std::printf(
        "| keys M | per-head dots ms (min-max) | GFLOP/s | tiled ms (min-max) | GFLOP/s | "
        "speed-up | max rel. diff |\n|---|---|---|---|---|---|---|\n");
    for (int64_t M : sizes) {
        std::vector<float> rows(static_cast<size_t>(M * kDim));
        for (float& x : rows) x = static_cast<float>(rng.next_normal());
        std::vector<const float*> keys(static_cast<size_t>(M));
        for (int64_t k = 0; k < M; ++k) keys[static_cast<size_t>(k)] = rows.data() + k * kDim;
        std::vector<float> a(static_cast<size_t>(M)), b(static_cast<size_t>(M));
        const auto dots = [&] {
            const int64_t t0 = steady_clock_ns();
            for (int64_t k = 0; k < M; ++k)
                a[static_cast<size_t>(k)] = iq.score(0, keys[static_cast<size_t>(k)]);
            return ms_since(t0);
        };
        const auto tiled = [&] {
            const int64_t t0 = steady_clock_ns();
            iq.score_keys(0, keys.data(), M, b.data());
            return ms_since(t0);
        };
        dots();
        tiled();
        std::vector<double> ta, tb;
        for (int r = 0; r < 5; ++r) {
            ta.push_back(dots());
            tb.push_back(tiled());
        }
        double diff = 0, mag = 0;
        for (int64_t k = 0; k < M; ++k) {
            diff = std::max(
                diff, std::abs(double(a[static_cast<size_t>(k)]) - b[static_cast<size_t>(k)]));
            mag = std::max(mag, std::abs(double(a[static_cast<size_t>(k)])));
        }
        const double gflop = 2.0 * kHeads * kDim * static_cast<double>(M) / 1e9;
        std::printf("| %lld | %.2f (%.2f-%.2f) | %.1f | %.2f (%.2f-%.2f) | %.1f | %.2fx | %.1e |\n",
                    static_cast<long long>(M), median(ta), *std::min_element(ta.begin(), ta.end()),
                    *std::max_element(ta.begin(), ta.end()), gflop / median(ta) * 1e3, median(tb),
                    *std::min_element(tb.begin(), tb.end()),
                    *std::max_element(tb.begin(), tb.end()), gflop / median(tb) * 1e3,
                    median(ta) / median(tb), diff / mag);
    }
}

// KL(p || q) of two logit rows, and whether their argmax agrees.
std::pair<double, bool> compare(std::span<const float> p_logits, std::span<const float> q_logits) {
    auto logsoftmax = [](std::span<const float> x) {
        const double mx = *std::max_element(x.begin(), x.end());
        double s = 0;
        for (float v : x) s += std::exp(v - mx);
        std::vector<double> out(x.size());
        for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - mx - std::log(s);
        return out;
    };
    const std::vector<double> lp = logsoftmax(p_logits), lq = logsoftmax(q_logits);
    double kl = 0;
    for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    const auto top = [](std::span<const float> x) {
        return std::max_element(x.begin(), x.end()) - x.begin();
    };
    return {kl, top(p_logits) == top(q_logits)};
}

void kl_figure(int64_t prompts, int64_t L) {
    auto m = load_tiny();
    const int64_t V = m->config().vocab_size;
    const int64_t L1 = (L - 134) / kUnit * kUnit, s = L1 - kUnit;  // S-KV-10, kReplay
    if (s < 0 || L1 <= 0) {
        std::fprintf(stderr, "L must be >= 262\n");
        std::exit(2);
    }
    std::vector<double> kl_replay, kl_compact;
    int64_t agree_replay = 0, agree_compact = 0;
    const int64_t t0 = steady_clock_ns();
    for (int64_t i = 0; i < prompts; ++i) {
        const std::vector<int32_t> ids = random_ids(L, 1000 + static_cast<uint64_t>(i), V);
        auto cache = m->new_kv_cache(L);
        BatchOutput exact, bounded, compact;
        forward(*m, {ids, 0, cache.get()}, exact);  // every layer, exact
        // Bounded replay: same block KV of [0, L1), the window state lost.
        std::fill_n(cache->state(), m->kv_layout().state_floats, std::nanf(""));
        SequenceStep st{std::span(ids).subspan(static_cast<size_t>(s)), s, cache.get()};
        st.replay_end = L1;
        st.context = std::span(ids).subspan(static_cast<size_t>(s - 16), 16);
        forward(*m, st, bounded);
        auto c2 = m->new_kv_cache(L);
        SequenceStep cs{ids, 0, c2.get()};
        cs.decoder_begin = L - kKeep;
        forward(*m, cs, compact);
        const auto [k1, a1] = compare(std::span(exact.logits).first(static_cast<size_t>(V)),
                                      std::span(bounded.logits).first(static_cast<size_t>(V)));
        const auto [k2, a2] = compare(std::span(exact.logits).first(static_cast<size_t>(V)),
                                      std::span(compact.logits).first(static_cast<size_t>(V)));
        kl_replay.push_back(k1);
        kl_compact.push_back(k2);
        agree_replay += a1;
        agree_compact += a2;
    }
    auto mean = [](const std::vector<double>& v) {
        double s2 = 0;
        for (double x : v) s2 += x;
        return s2 / static_cast<double>(v.size());
    };
    std::printf("%lld prompts of %lld tokens (replay [%lld, %lld) + suffix to %lld), %.0f s\n",
                static_cast<long long>(prompts), static_cast<long long>(L),
                static_cast<long long>(s), static_cast<long long>(L1), static_cast<long long>(L),
                ms_since(t0) / 1e3);
    std::printf(
        "| vs exact | KL mean | KL median | KL max | top-1 agreement |\n|---|---|---|---|---|\n");
    std::printf("| encoder bounded replay | %.3g | %.3g | %.3g | %lld / %lld |\n", mean(kl_replay),
                median(kl_replay), *std::max_element(kl_replay.begin(), kl_replay.end()),
                static_cast<long long>(agree_replay), static_cast<long long>(prompts));
    std::printf("| CED compact prefill (keep %lld) | %.3g | %.3g | %.3g | %lld / %lld |\n",
                static_cast<long long>(kKeep), mean(kl_compact), median(kl_compact),
                *std::max_element(kl_compact.begin(), kl_compact.end()),
                static_cast<long long>(agree_compact), static_cast<long long>(prompts));
}

int run(int argc, char** argv) {
    const char* usage =
        "usage: v41_replay_bench hit-cost C... | prefill N... | kl P L | hit-cost-wide DIR T C... "
        "| flops C... | scorer M...\n";
    if (argc < 3) {
        std::fprintf(stderr, "%s", usage);
        return 2;
    }
    const std::string what = argv[1];
    if (what == "hit-cost-wide") {
        std::vector<int64_t> contexts;
        for (int i = 4; i < argc; ++i) contexts.push_back(std::atoll(argv[i]));
        if (contexts.empty()) {
            std::fprintf(stderr, "%s", usage);
            return 2;
        }
        hit_cost_wide(argv[2], std::atoi(argv[3]), contexts);
        return 0;
    }
    std::vector<int64_t> nums;
    for (int i = 2; i < argc; ++i) nums.push_back(std::atoll(argv[i]));
    if (what == "hit-cost") {
        hit_cost(nums);
    } else if (what == "prefill") {
        prefill_figure(nums);
    } else if (what == "flops") {
        flops_figure(nums);
    } else if (what == "scorer") {
        scorer_figure(nums);
    } else if (what == "kl" && nums.size() == 2) {
        kl_figure(nums[0], nums[1]);
    } else {
        std::fprintf(stderr, "unknown figure '%s'\n", what.c_str());
        return 2;
    }
    return 0;
}

}  // namespace
}  // namespace dsi

int main(int argc, char** argv) { return dsi::run(argc, argv); }
