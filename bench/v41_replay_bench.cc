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
//
// Usage: v41_replay_bench hit-cost C... | prefill N... | kl P L
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/env.h"
#include "model/deepseek_v41.h"
#include "model/synthetic.h"

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

// Counted FLOPs of a prefill of n tokens whose decoder ran for the last `tail` of them.
double prefill_flops(const ModelConfig& c, const V41Trace& tr, int64_t n, int64_t tail) {
    const int64_t dec = v41_first_decoder_layer(c);
    const double ih = static_cast<double>(c.index_n_heads),
                 ihd = static_cast<double>(c.index_head_dim),
                 nh = static_cast<double>(c.num_attention_heads),
                 hd = static_cast<double>(c.head_dim);
    double f = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        const int64_t tokens = l < dec ? n : tail;
        f += static_cast<double>(tokens) * dense_flops(c, l);
        const size_t i = static_cast<size_t>(l);
        const V41AttnKind kind = v41_attn_kind(c, l);
        if (kind == V41AttnKind::kFull)
            f += 2 * static_cast<double>(tr.visible_entries[i]) * ih * ihd;
        if (kind == V41AttnKind::kReindex)
            f += 2 * static_cast<double>(tr.candidate_entries[i]) * ih * ihd;
        // Attention: the chosen entries and the window (min(pos + 1, W), truncated at the
        // tail's start in the decoder), QK and PV.
        double window = 0;
        const int64_t first = l < dec ? 0 : n - tail;
        for (int64_t p = first; p < n; ++p)
            window += static_cast<double>(std::min<int64_t>(p - first + 1, c.sliding_window));
        f += 4 * nh * hd * (static_cast<double>(tr.attended_entries[i]) + window);
    }
    // The decoder's kv source projection for the tokens the decoder skipped.
    f += static_cast<double>(n - tail) * 2 *
         (static_cast<double>(c.hidden_size * c.head_dim) +
          static_cast<double>(c.head_dim * c.index_head_dim) /
              static_cast<double>(c.compress_ratio(dec)));
    f += 2 * static_cast<double>(c.hidden_size * c.vocab_size);  // the head, last token
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
            gf[compact] = prefill_flops(c, tr, n, compact ? std::min(n, kKeep) : n) / 1e9;
        }
        std::printf("| %lld | %.0f, %.3f | %.0f, %.3f | %.2f | %.2f |\n", static_cast<long long>(n),
                    ms[0], gf[0], ms[1], gf[1], ms[1] / ms[0], gf[1] / gf[0]);
        std::fflush(stdout);
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
    if (argc < 3) {
        std::fprintf(stderr, "usage: v41_replay_bench hit-cost C... | prefill N... | kl P L\n");
        return 2;
    }
    const std::string what = argv[1];
    std::vector<int64_t> nums;
    for (int i = 2; i < argc; ++i) nums.push_back(std::atoll(argv[i]));
    if (what == "hit-cost") {
        hit_cost(nums);
    } else if (what == "prefill") {
        prefill_figure(nums);
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
