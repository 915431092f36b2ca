// DeepSeek V4: config parsing and checks, the official tensor layout, the HF
// checkpoint round trip (FP8 + ue8m0, FP4 experts), and the forward pass against a
// double-precision reference written here from the reference notes
// (../shared/reference/deepseek_v4.md §2), compared layer by layer; prefill chunking,
// token-by-token decode, batch and thread invariance (bitwise); bad input.
//
// The reference computes each quantity directly from its definition over the whole
// sequence (compressed entries from their groups, top-k from all visible keys), not
// with the model's incremental state machine.
#include "model/deepseek_v4.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "base/env.h"
#include "model/causal_lm.h"
#include "model/checkpoint_writer.h"
#include "model/gguf.h"
#include "model/gguf_names.h"
#include "model/memory_plan.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace dsi {
namespace {

using Tensors = std::map<std::string, MemoryWeightSource::Tensor>;
using Vec = std::vector<double>;

// DeepSeek-V4-Flash's config.json (reference deepseek_v4.md §1).
constexpr const char* kV4FlashConfig = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
  "num_nextn_predict_layers": 1, "num_attention_heads": 64, "num_key_value_heads": 1,
  "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_lora_rank": 1024,
  "o_groups": 8, "sliding_window": 128,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 128, 4, 0],
  "compress_rope_theta": 160000, "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 1048576, "index_n_heads": 64, "index_head_dim": 128,
  "index_topk": 512, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
  "moe_intermediate_size": 2048, "num_hash_layers": 3, "scoring_func": "sqrtsoftplus",
  "topk_method": "noaux_tc", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
  "swiglu_limit": 10.0, "hidden_act": "silu", "hc_mult": 4, "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "expert_dtype": "fp4", "torch_dtype": "bfloat16",
  "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
})";

std::string with_field(std::string json, const std::string& key, const std::string& value) {
    const std::string k = "\"" + key + "\": ";
    const size_t at = json.find(k);
    EXPECT_NE(at, std::string::npos) << key;
    size_t end = at + k.size();
    int depth = 0;
    for (; end < json.size(); ++end) {
        const char ch = json[end];
        if (ch == '[' || ch == '{') ++depth;
        if (ch == ']' || ch == '}') {
            if (depth == 0) break;
            --depth;
        }
        if (ch == ',' && depth == 0) break;
    }
    return json.substr(0, at + k.size()) + value + json.substr(end);
}

TEST(V4ConfigTest, ParsesV4Flash) {
    Result<ModelConfig> r = parse_hf_config(kV4FlashConfig);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const ModelConfig& c = *r;
    EXPECT_TRUE(c.is_v4());
    EXPECT_EQ(c.head_dim, 512);
    EXPECT_EQ(c.qk_nope_head_dim, 448);
    EXPECT_EQ(c.o_groups, 8);
    EXPECT_EQ(c.o_lora_rank, 1024);
    EXPECT_EQ(c.compress_ratios.size(), 44u);
    EXPECT_EQ(c.compress_ratio(0), 0);
    EXPECT_EQ(c.compress_ratio(2), 4);
    EXPECT_EQ(c.compress_ratio(3), 128);
    EXPECT_EQ(c.compress_ratio(43), 0);
    EXPECT_EQ(c.index_topk, 512);
    EXPECT_EQ(c.num_hash_layers, 3);
    EXPECT_EQ(c.scoring_func, ScoringFunc::kSqrtSoftplus);
    EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
    EXPECT_EQ(c.hc_mult, 4);
    EXPECT_EQ(c.hc_sinkhorn_iters, 20);
    EXPECT_TRUE(c.expert_fp4);
    EXPECT_TRUE(c.fp8 && c.fp8_scale_ue8m0);
    EXPECT_TRUE(c.rope_scaling.yarn);
    // Window-only layers: plain theta 10000; compressed: 160000 with YaRN (factor 16
    // slows the lowest frequency by 16).
    std::vector<double> f0 = c.v4_rope_inv_freq(0);
    std::vector<double> f2 = c.v4_rope_inv_freq(2);
    EXPECT_DOUBLE_EQ(f0[0], 1.0);
    EXPECT_NEAR(f0[31], std::pow(10000.0, -62.0 / 64.0), 1e-15);
    EXPECT_DOUBLE_EQ(f2[0], 1.0);  // high frequencies are kept
    EXPECT_NEAR(f2[31], std::pow(160000.0, -62.0 / 64.0) / 16.0, 1e-15);
    // Round trip through our writer.
    Result<ModelConfig> back = parse_hf_config(to_hf_config_json(c));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->compress_ratios, c.compress_ratios);
    EXPECT_EQ(back->index_n_heads, 64);
    EXPECT_EQ(back->hc_eps, c.hc_eps);
}

TEST(V4ConfigTest, ErrorsNameTheField) {
    struct Case {
        std::string key, value, want;
    } cases[] = {
        {"compress_ratios", "[0, 4, 128]", "'compress_ratios' has 3 entries, expected"},
        {"compress_ratios",
         "[0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, "
         "128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, "
         "4, 4]",
         "MTP layer entry 43"},
        {"num_key_value_heads", "8", "'num_key_value_heads' must be 1"},
        {"o_groups", "7", "'o_groups' must divide"},
        {"scoring_func", "\"sigmoid\"", "'scoring_func'"},
        {"hc_mult", "0", "'hc_mult' must be > 0"},
        {"index_topk", "0", "'index_topk' must be > 0"},
        {"num_hash_layers", "50", "'num_hash_layers'"},
        {"expert_dtype", "\"int3\"", "'expert_dtype'"},
        {"o_lora_rank", "1000", "'o_lora_rank' must be a multiple"},
        {"head_dim", "\"big\"", "'head_dim' has the wrong type"},
    };
    for (const Case& k : cases) {
        Result<ModelConfig> r = parse_hf_config(with_field(kV4FlashConfig, k.key, k.value));
        ASSERT_FALSE(r.is_ok()) << k.key;
        EXPECT_NE(r.status().message().find(k.want), std::string::npos)
            << k.key << ": " << r.status().to_string();
    }
    // A required field missing.
    std::string missing = kV4FlashConfig;
    missing.replace(missing.find("\"hc_sinkhorn_iters\": 20,"), 24, "");
    Result<ModelConfig> r = parse_hf_config(missing);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("'hc_sinkhorn_iters'"), std::string::npos);
}

// small-v4 is the benchmark shape: V4-Flash's head, hidden >= 1024, >= 64 experts; every
// layer kind and an MTP layer.
TEST(V4ConfigTest, SmallV4IsTheBenchmarkShape) {
    Result<ModelConfig> r = synthetic_preset("small-v4");
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->head_dim, 512);
    EXPECT_EQ(r->qk_rope_head_dim, 64);
    EXPECT_GE(r->hidden_size, 1024);
    EXPECT_GE(r->n_routed_experts, 64);
    EXPECT_EQ(r->compress_ratios, (std::vector<int64_t>{0, 4, 128, 4, 0}));
    EXPECT_TRUE(r->expert_fp4 && r->fp8 && r->fp8_scale_ue8m0);
    // Its memory plan: FP4 experts are 0.53 bytes per weight.
    MemoryPlan p = plan_memory(*r, 4096);
    int64_t fp4 = 0;
    for (const auto& w : p.weights) {
        if (w.format.rfind("fp4", 0) == 0) fp4 = w.bytes;
    }
    const int64_t per_expert = 3 * 512 * 1024;
    EXPECT_EQ(fp4, 5 * 64 * (per_expert / 2 + per_expert / 32));  // 4 layers + MTP
}

// Reference §3: 69,187 tensors in the official checkpoint (weights, and one scale per
// FP8 / FP4 weight), 1,575 of them under mtp.0.
TEST(V4LayoutTest, TensorCountMatchesTheOfficialCheckpoint) {
    ModelConfig c = parse_hf_config(kV4FlashConfig).value();
    int64_t total = 0, mtp = 0;
    for (const V4TensorSpec& s : deepseek_v4_tensor_specs(c)) {
        const int64_t n = s.storage == V4Storage::kFp8 || s.storage == V4Storage::kFp4 ? 2 : 1;
        total += n;
        if (s.name.rfind("mtp.0.", 0) == 0) mtp += n;
    }
    EXPECT_EQ(total, 69187);
    EXPECT_EQ(mtp, 1575);
}

// Hand arithmetic (reference deepseek_v4.md §3, §4.2) for the real V4-Flash config.
TEST(V4PlanTest, V4FlashByHand) {
    ModelConfig c = parse_hf_config(kV4FlashConfig).value();
    MemoryPlan p = plan_memory(c, 8192);
    // The official checkpoint's total_size: BF16, FP8 + ue8m0 per 128x128, FP4 pairs +
    // ue8m0 per 32, F32, I64 tid2eid.
    EXPECT_EQ(p.weight_bytes, 159609485896);
    ASSERT_EQ(p.kinds.size(), 3u);
    // window: 2 + MTP; ratio 4: 21 layers; ratio 128: 20 layers.
    EXPECT_EQ(p.kinds[0].layers, 3);
    EXPECT_EQ(p.kinds[1].layers, 21);
    EXPECT_EQ(p.kinds[2].layers, 20);
    // Compact: 21 x (584/4 + 68/4) + 20 x 584/128 = 3514.25 B per token.
    EXPECT_DOUBLE_EQ(p.kinds[1].compact_bytes_per_token + p.kinds[2].compact_bytes_per_token,
                     3514.25);
    // dsinfer f32: 21 x (512 + 128) x 4 / 4 + 20 x 512 x 4 / 128.
    EXPECT_DOUBLE_EQ(p.kinds[1].dsinfer_bytes_per_token + p.kinds[2].dsinfer_bytes_per_token,
                     13760.0);
    // State: 44 window rings of 128 rows (584 B compact); accumulators kv + score in f32:
    // ratio 4: 2 x (8 x 1024) + 2 x (8 x 256) floats, ratio 128: 2 x (128 x 512) floats.
    const int64_t rings = 44 * 128 * 584;
    const int64_t acc = 21 * (2 * 8 * 1024 + 2 * 8 * 256) * 4 + 20 * 2 * 128 * 512 * 4;
    EXPECT_EQ(p.kinds[0].compact_state_bytes + p.kinds[1].compact_state_bytes +
                  p.kinds[2].compact_state_bytes,
              rings + acc);
    // 8192 tokens: 2048 ratio-4 entries + keys, 64 ratio-128 entries, plus the state.
    EXPECT_EQ(p.compact_kv_bytes, 21 * 2048 * (584 + 68) + 20 * 64 * 584 + rings + acc);
    EXPECT_EQ(p.dsinfer_kv_bytes,
              21 * 2048 * (512 + 128) * 4 + 20 * 64 * 512 * 4 + 44 * 128 * 512 * 4 + acc);
    const std::string text = format_memory_plan(p, 1);
    EXPECT_NE(text.find("does NOT fit"), std::string::npos) << text;
    EXPECT_NE(text.find("fp4-e2m1"), std::string::npos) << text;
}

// ---- double-precision reference ----------------------------------------------------

ModelConfig tiny_v4() {
    ModelConfig c = synthetic_preset("tiny-v4").value();
    c.vocab_size = 512;
    return c;
}

// The reference's simulated quantisation of cached KV (deepseek_v4.md §2.2-§2.4),
// written from the format definitions: x rounded to `bits` significant bits at or
// above 2^min_exp (below: the subnormal step), ties to even, saturating at max.
double round_float(double x, int bits, int min_exp, double max) {
    if (std::isnan(x)) return x;
    const double a = std::min(std::fabs(x), max);
    int e = 0;
    std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
    const int step_exp = std::max(e, min_exp + 1) - bits;
    const double r = std::ldexp(std::nearbyint(std::ldexp(a, -step_exp)), step_exp);
    return std::copysign(std::min(r, max), x);
}
double e4m3_round(double x) { return round_float(x, 4, -6, 448.0); }
double e2m1_round(double x) { return round_float(x, 2, 0, 6.0); }
double bf16_round(double x) { return round_float(x, 8, -126, 3.0e38); }
// Per group of `g` values: scale 2^ceil(log2(max(amax, floor) / max)), value rounded.
void simulate_groups(double* v, int64_t n, int64_t g, double floor, double max,
                     double (*round)(double)) {
    for (int64_t b = 0; b < n; b += g) {
        const int64_t len = std::min(g, n - b);
        double amax = 0;
        for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(v[b + i]));
        const double scale = std::exp2(std::ceil(std::log2(std::max(amax, floor) / max)));
        for (int64_t i = 0; i < len; ++i) v[b + i] = round(v[b + i] / scale) * scale;
    }
}
// A main row: nope dims e4m3 per 64, rope dims bf16.
void simulate_main(double* v, int64_t dim, int64_t rope) {
    simulate_groups(v, dim - rope, 64, 1e-4, 448.0, e4m3_round);
    for (int64_t i = dim - rope; i < dim; ++i) v[i] = bf16_round(v[i]);
}
// An indexer query or key: Hadamard rotation (normalised, Sylvester order), then FP4
// per 32.
void simulate_index(double* v, int64_t dim) {
    std::vector<double> y(static_cast<size_t>(dim), 0.0);
    for (int64_t i = 0; i < dim; ++i) {
        for (int64_t j = 0; j < dim; ++j) {
            y[i] += (__builtin_popcountll(static_cast<uint64_t>(i & j)) % 2 ? -v[j] : v[j]);
        }
    }
    for (int64_t i = 0; i < dim; ++i) v[i] = y[i] / std::sqrt(static_cast<double>(dim));
    simulate_groups(v, dim, 32, 6 * std::exp2(-126), 6.0, e2m1_round);
}

struct Ref {
    const ModelConfig& c;
    const Tensors& w;
    bool fp8 = false;  // simulate the reference's KV quantisation (kv dtype e4m3)

    const std::vector<float>& t(const std::string& name) const {
        auto it = w.find(name);
        EXPECT_NE(it, w.end()) << name;
        return it->second.data;
    }
    // y = W x for W [out, in] (rows [row0, row0 + out) when given).
    Vec linear(const std::string& name, const Vec& x, int64_t row0 = 0, int64_t out = -1) const {
        const auto& W = t(name);
        const size_t in = x.size();
        if (out < 0) out = static_cast<int64_t>(W.size() / in);
        Vec y(static_cast<size_t>(out));
        for (int64_t o = 0; o < out; ++o) {
            double acc = 0;
            for (size_t i = 0; i < in; ++i) acc += static_cast<double>(W[(row0 + o) * in + i]) * x[i];
            y[static_cast<size_t>(o)] = acc;
        }
        return y;
    }
    Vec norm(const std::string& name, const Vec& x) const {
        double ss = 0;
        for (double v : x) ss += v * v;
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c.rms_norm_eps);
        Vec y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * (name.empty() ? 1.0 : t(name)[i]);
        return y;
    }
    // RoPE frequencies written from the notes: theta^(-2i/d); compressed layers use
    // compress_rope_theta with YaRN's linear ramp between the correction dims.
    Vec inv_freq(int64_t layer) const {
        const int64_t d = c.qk_rope_head_dim;
        const bool compressed = c.compress_ratios[static_cast<size_t>(layer)] > 0;
        const double theta = compressed ? c.compress_rope_theta : c.rope_theta;
        Vec f(static_cast<size_t>(d / 2));
        for (int64_t i = 0; i < d / 2; ++i) f[i] = std::pow(theta, -2.0 * i / d);
        if (!compressed) return f;
        const double L = c.rope_scaling.original_max_position_embeddings;
        auto dim_of = [&](double rot) { return d * std::log(L / (rot * 2 * M_PI)) / (2 * std::log(theta)); };
        double lo = std::max(0.0, std::floor(dim_of(c.rope_scaling.beta_fast)));
        double hi = std::min(static_cast<double>(d - 1), std::ceil(dim_of(c.rope_scaling.beta_slow)));
        if (lo == hi) hi += 0.001;
        for (int64_t i = 0; i < d / 2; ++i) {
            const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
            f[i] = f[i] / c.rope_scaling.factor * ramp + f[i] * (1 - ramp);
        }
        return f;
    }
    // Interleaved pairs (GPT-J) on the last rope dims of v.
    void rope(double* v, int64_t dim, int64_t pos, const Vec& f, bool inverse) const {
        double* r = v + dim - c.qk_rope_head_dim;
        for (size_t i = 0; i < f.size(); ++i) {
            const double a = (inverse ? -1.0 : 1.0) * pos * f[i];
            const double x = r[2 * i], y = r[2 * i + 1];
            r[2 * i] = x * std::cos(a) - y * std::sin(a);
            r[2 * i + 1] = x * std::sin(a) + y * std::cos(a);
        }
    }
    static double sigm(double x) { return 1 / (1 + std::exp(-x)); }

    // mHC pre: the sub-layer input, post [hc] and comb [hc][hc] (source j, dest k).
    void hc_pre(const std::string& p, const std::vector<Vec>& h, Vec& xin, Vec& post,
                std::vector<Vec>& C) const {
        const int64_t hc = c.hc_mult, H = c.hidden_size;
        Vec xf;
        for (const Vec& s : h) xf.insert(xf.end(), s.begin(), s.end());
        double ms = 0;
        for (double v : xf) ms += v * v;
        const double rs = 1 / std::sqrt(ms / static_cast<double>(xf.size()) + c.rms_norm_eps);
        Vec mix = linear(p + "_fn", xf);
        for (double& m : mix) m *= rs;
        const auto& base = t(p + "_base");
        const auto& scale = t(p + "_scale");
        xin.assign(static_cast<size_t>(H), 0.0);
        post.resize(static_cast<size_t>(hc));
        for (int64_t j = 0; j < hc; ++j) {
            const double pre = sigm(mix[j] * scale[0] + base[j]) + c.hc_eps;
            post[j] = 2 * sigm(mix[hc + j] * scale[1] + base[hc + j]);
            for (int64_t i = 0; i < H; ++i) xin[i] += pre * h[j][i];
        }
        C.assign(static_cast<size_t>(hc), Vec(static_cast<size_t>(hc)));
        for (int64_t j = 0; j < hc; ++j) {
            double mx = -1e300, sum = 0;
            for (int64_t k = 0; k < hc; ++k) {
                C[j][k] = mix[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
                mx = std::max(mx, C[j][k]);
            }
            for (int64_t k = 0; k < hc; ++k) sum += C[j][k] = std::exp(C[j][k] - mx);
            for (int64_t k = 0; k < hc; ++k) C[j][k] = C[j][k] / sum + c.hc_eps;
        }
        for (int64_t it = 0; it < c.hc_sinkhorn_iters; ++it) {
            if (it > 0) {
                for (int64_t j = 0; j < hc; ++j) {
                    double s = 0;
                    for (int64_t k = 0; k < hc; ++k) s += C[j][k];
                    for (int64_t k = 0; k < hc; ++k) C[j][k] /= s + c.hc_eps;
                }
            }
            for (int64_t k = 0; k < hc; ++k) {
                double s = 0;
                for (int64_t j = 0; j < hc; ++j) s += C[j][k];
                for (int64_t j = 0; j < hc; ++j) C[j][k] /= s + c.hc_eps;
            }
        }
    }

    // Compressed entries of the whole sequence from their definition.
    std::vector<Vec> compress_all(const std::string& p, const std::vector<Vec>& x, int64_t r,
                                  int64_t D, const Vec& f) const {
        const int64_t T = static_cast<int64_t>(x.size());
        const int64_t coff = r == 4 ? 2 : 1;
        const auto& ape = t(p + "ape");
        std::vector<Vec> kv(x.size()), sc(x.size());
        for (int64_t s = 0; s < T; ++s) {
            kv[s] = linear(p + "wkv.weight", x[s]);
            sc[s] = linear(p + "wgate.weight", x[s]);
            for (int64_t i = 0; i < coff * D; ++i) sc[s][i] += ape[(s % r) * coff * D + i];
        }
        std::vector<Vec> out;
        for (int64_t g = 0; g < T / r; ++g) {
            Vec e(static_cast<size_t>(D));
            for (int64_t ch = 0; ch < D; ++ch) {
                std::vector<std::pair<double, double>> cand;  // (score, value)
                if (r == 4) {
                    if (g > 0) {
                        for (int64_t s = (g - 1) * r; s < g * r; ++s) cand.push_back({sc[s][ch], kv[s][ch]});
                    }
                    for (int64_t s = g * r; s < (g + 1) * r; ++s) cand.push_back({sc[s][D + ch], kv[s][D + ch]});
                } else {
                    for (int64_t s = g * r; s < (g + 1) * r; ++s) cand.push_back({sc[s][ch], kv[s][ch]});
                }
                double mx = -1e300, sum = 0, acc = 0;
                for (auto& [s, v] : cand) mx = std::max(mx, s);
                for (auto& [s, v] : cand) {
                    sum += std::exp(s - mx);
                    acc += std::exp(s - mx) * v;
                }
                e[ch] = acc / sum;
            }
            e = norm(p + "norm.weight", e);
            rope(e.data(), D, g * r, f, false);
            out.push_back(e);
        }
        return out;
    }

    std::vector<Vec> attention(const std::string& p, int64_t layer, const std::vector<Vec>& x) const {
        const int64_t T = static_cast<int64_t>(x.size());
        const int64_t nh = c.num_attention_heads, hd = c.head_dim, H = c.hidden_size;
        const int64_t r = c.compress_ratios[static_cast<size_t>(layer)];
        const Vec f = inv_freq(layer);
        const std::string a = p + "attn.";
        std::vector<Vec> qr(x.size()), q(x.size()), kv(x.size());
        for (int64_t s = 0; s < T; ++s) {
            qr[s] = norm(a + "q_norm.weight", linear(a + "wq_a.weight", x[s]));
            q[s] = linear(a + "wq_b.weight", qr[s]);
            for (int64_t h = 0; h < nh; ++h) {
                Vec qh(q[s].begin() + h * hd, q[s].begin() + (h + 1) * hd);
                qh = norm("", qh);
                rope(qh.data(), hd, s, f, false);
                std::copy(qh.begin(), qh.end(), q[s].begin() + h * hd);
            }
            kv[s] = norm(a + "kv_norm.weight", linear(a + "wkv.weight", x[s]));
            rope(kv[s].data(), hd, s, f, false);
            if (fp8) simulate_main(kv[s].data(), hd, c.qk_rope_head_dim);
        }
        std::vector<Vec> entries, ikeys;
        if (r > 0) entries = compress_all(a + "compressor.", x, r, hd, f);
        if (r == 4) ikeys = compress_all(a + "indexer.compressor.", x, 4, c.index_head_dim, f);
        if (fp8) {
            for (Vec& e : entries) simulate_main(e.data(), hd, c.qk_rope_head_dim);
            for (Vec& k : ikeys) simulate_index(k.data(), c.index_head_dim);
        }
        std::vector<Vec> out;
        const auto& sink = t(a + "attn_sink");
        for (int64_t s = 0; s < T; ++s) {
            std::vector<const Vec*> keys;
            const int64_t visible = r > 0 ? (s + 1) / r : 0;
            if (r == 128) {
                for (int64_t e = 0; e < visible; ++e) keys.push_back(&entries[e]);
            } else if (r == 4) {
                const int64_t ih = c.index_n_heads, ihd = c.index_head_dim;
                Vec qi = linear(a + "indexer.wq_b.weight", qr[s]);
                Vec wi = linear(a + "indexer.weights_proj.weight", x[s]);
                for (int64_t h = 0; h < ih; ++h) {
                    rope(qi.data() + h * ihd, ihd, s, f, false);
                    if (fp8) simulate_index(qi.data() + h * ihd, ihd);
                }
                std::vector<std::pair<double, int64_t>> sc;
                for (int64_t e = 0; e < visible; ++e) {
                    double v = 0;
                    for (int64_t h = 0; h < ih; ++h) {
                        double d = 0;
                        for (int64_t i = 0; i < ihd; ++i) d += qi[h * ihd + i] * ikeys[e][i];
                        v += std::max(d, 0.0) * wi[h] / std::sqrt(double(ihd)) / std::sqrt(double(ih));
                    }
                    sc.push_back({-v, e});  // ascending = best first, ties lower index
                }
                std::sort(sc.begin(), sc.end());
                std::vector<int64_t> ids;
                for (int64_t i = 0; i < std::min<int64_t>(visible, c.index_topk); ++i) ids.push_back(sc[i].second);
                std::sort(ids.begin(), ids.end());
                for (int64_t e : ids) keys.push_back(&entries[e]);
            }
            for (int64_t k = std::max<int64_t>(0, s - c.sliding_window + 1); k <= s; ++k) keys.push_back(&kv[k]);
            Vec o(static_cast<size_t>(nh * hd), 0.0);
            for (int64_t h = 0; h < nh; ++h) {
                Vec logit;
                double mx = sink[h];
                for (const Vec* k : keys) {
                    double d = 0;
                    for (int64_t i = 0; i < hd; ++i) d += q[s][h * hd + i] * (*k)[i];
                    logit.push_back(d / std::sqrt(double(hd)));
                    mx = std::max(mx, logit.back());
                }
                double sum = std::exp(sink[h] - mx);
                for (double l : logit) sum += std::exp(l - mx);
                for (size_t i = 0; i < keys.size(); ++i) {
                    const double pw = std::exp(logit[i] - mx) / sum;
                    for (int64_t d = 0; d < hd; ++d) o[h * hd + d] += pw * (*keys[i])[d];
                }
                rope(o.data() + h * hd, hd, s, f, true);
            }
            const int64_t G = c.o_groups, olr = c.o_lora_rank, gw = nh / G * hd;
            Vec low;
            for (int64_t g = 0; g < G; ++g) {
                Vec og(o.begin() + g * gw, o.begin() + (g + 1) * gw);
                Vec y = linear(a + "wo_a.weight", og, g * olr, olr);
                low.insert(low.end(), y.begin(), y.end());
            }
            out.push_back(linear(a + "wo_b.weight", low));
            EXPECT_EQ(static_cast<int64_t>(out.back().size()), H);
        }
        return out;
    }

    Vec expert(const std::string& p, const Vec& x) const {
        Vec g = linear(p + "w1.weight", x), u = linear(p + "w3.weight", x);
        const double lim = c.swiglu_limit;
        for (size_t i = 0; i < g.size(); ++i) {
            if (lim > 0) {
                g[i] = std::min(g[i], lim);
                u[i] = std::clamp(u[i], -lim, lim);
            }
            g[i] = g[i] * sigm(g[i]) * u[i];
        }
        return linear(p + "w2.weight", g);
    }

    Vec moe(const std::string& p, int64_t layer, const Vec& x, int32_t token) const {
        const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
        const std::string f = p + "ffn.";
        Vec l = linear(f + "gate.weight", x);
        Vec s(l.size());
        for (int64_t e = 0; e < E; ++e) s[e] = std::sqrt(std::log1p(std::exp(l[e])));
        std::vector<int64_t> ids;
        if (layer < c.num_hash_layers) {
            for (int64_t j = 0; j < k; ++j) ids.push_back(static_cast<int64_t>(t(f + "gate.tid2eid")[token * k + j]));
        } else {
            std::vector<std::pair<double, int64_t>> ch;
            for (int64_t e = 0; e < E; ++e) ch.push_back({-(s[e] + t(f + "gate.bias")[e]), e});
            std::sort(ch.begin(), ch.end());
            for (int64_t j = 0; j < k; ++j) ids.push_back(ch[j].second);
        }
        double sum = 0;
        for (int64_t e : ids) sum += s[e];
        Vec y = expert(f + "shared_experts.", x);
        for (int64_t e : ids) {
            const double wt = s[e] / sum * c.routed_scaling_factor;
            Vec ye = expert(f + "experts." + std::to_string(e) + ".", x);
            for (size_t i = 0; i < y.size(); ++i) y[i] += wt * ye[i];
        }
        return y;
    }

    // One block over the whole sequence: h[s][stream] -> new streams.
    void block(const std::string& p, int64_t layer, std::vector<std::vector<Vec>>& h,
               const std::vector<int32_t>& ids) const {
        const int64_t T = static_cast<int64_t>(h.size()), hc = c.hc_mult;
        std::vector<Vec> xin(h.size()), post(h.size());
        std::vector<std::vector<Vec>> C(h.size());
        for (int64_t s = 0; s < T; ++s) {
            hc_pre(p + "hc_attn", h[s], xin[s], post[s], C[s]);
            xin[s] = norm(p + "attn_norm.weight", xin[s]);
        }
        std::vector<Vec> y = attention(p, layer, xin);
        auto apply = [&](int64_t s, const Vec& ys) {
            std::vector<Vec> nh(h[s].size());
            for (int64_t k = 0; k < hc; ++k) {
                nh[k].assign(ys.size(), 0.0);
                for (size_t i = 0; i < ys.size(); ++i) {
                    double v = post[s][k] * ys[i];
                    for (int64_t j = 0; j < hc; ++j) v += C[s][j][k] * h[s][j][i];
                    nh[k][i] = v;
                }
            }
            h[s] = nh;
        };
        for (int64_t s = 0; s < T; ++s) apply(s, y[s]);
        for (int64_t s = 0; s < T; ++s) {
            hc_pre(p + "hc_ffn", h[s], xin[s], post[s], C[s]);
            Vec x = norm(p + "ffn_norm.weight", xin[s]);
            apply(s, moe(p, layer, x, ids[s]));
        }
    }

    Vec logits(const std::string& p, const std::vector<Vec>& h, const std::string& norm_name) const {
        Vec xf;
        for (const Vec& s : h) xf.insert(xf.end(), s.begin(), s.end());
        double ms = 0;
        for (double v : xf) ms += v * v;
        const double rs = 1 / std::sqrt(ms / static_cast<double>(xf.size()) + c.rms_norm_eps);
        Vec mix = linear(p + "hc_head_fn", xf);
        Vec y(h[0].size(), 0.0);
        for (int64_t j = 0; j < c.hc_mult; ++j) {
            const double pre = sigm(mix[j] * rs * t(p + "hc_head_scale")[0] + t(p + "hc_head_base")[j]) + c.hc_eps;
            for (size_t i = 0; i < y.size(); ++i) y[i] += pre * h[j][i];
        }
        return linear("head.weight", norm(norm_name, y));
    }
};

std::vector<int32_t> prompt(int64_t n, int32_t vocab, uint64_t seed = 7) {
    SplitMix64 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& t : ids) t = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
    return ids;
}

std::unique_ptr<DeepseekV4Model> load_memory(const ModelConfig& c, int threads = 1,
                                             const std::string& fmt = "auto",
                                             kernels::KvDtype kv = kernels::KvDtype::kF32) {
    DeepseekV4Model::Options o;
    o.num_threads = threads;
    o.weight_format = fmt;
    o.kv_dtype = kv;
    auto m = DeepseekV4Model::load(synthetic_v4_memory_model(c, 1), o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return std::move(m).value();
}

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
    return m;
}

// Every layer's streams and the last logits (main and MTP) against the reference,
// on 300 tokens: the window (128) is full, the ratio-4 layers' indexer chooses 16 of
// 75 entries, the ratio-128 layer attends to 2 entries.
// kv e4m3: against the reference with its simulated KV quantisation (every layer from
// the model's own input streams), to a tolerance that allows the odd value our f32
// arithmetic rounds to the neighbouring e4m3 / FP4 code (the f32 cache's logits
// differ from these by ~10 % of their std).
void check_against_reference(kernels::KvDtype kv, int64_t T, double layer_tol, double logit_tol) {
    const ModelConfig c = tiny_v4();
    auto mem = synthetic_v4_memory_model(c, 1);
    Ref ref{c, mem->tensors(), kv == kernels::KvDtype::kE4m3};
    auto model = load_memory(c, 1, "auto", kv);
    
    std::vector<int32_t> ids = prompt(T, static_cast<int32_t>(c.vocab_size));
    auto st = model->new_state(T + 8);
    V4Output out;
    out.capture_layers = true;
    ASSERT_TRUE(model->forward(ids, 0, *st, false, out).is_ok());
    ASSERT_EQ(out.layer_streams.size(), static_cast<size_t>(c.num_hidden_layers));

    const int64_t hc = c.hc_mult, H = c.hidden_size;
    std::vector<std::vector<Vec>> h(static_cast<size_t>(T));
    for (int64_t s = 0; s < T; ++s) {
        const auto& e = ref.t("embed.weight");
        h[s].assign(static_cast<size_t>(hc), Vec(e.begin() + ids[s] * H, e.begin() + (ids[s] + 1) * H));
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        if (ref.fp8 && l > 0) {
            // Teacher forcing per layer: the model's own input streams, so that a value
            // rounded to the neighbouring code upstream does not cascade (each one
            // moves the next layer's inputs and so its codes and indexer choices).
            for (int64_t s = 0; s < T; ++s) {
                for (int64_t j = 0; j < hc; ++j) {
                    for (int64_t i = 0; i < H; ++i) h[s][j][i] = out.layer_streams[l - 1][(s * hc + j) * H + i];
                }
            }
        }
        ref.block("layers." + std::to_string(l) + ".", l, h, ids);
        double worst = 0, scale = 0;
        for (int64_t s = 0; s < T; ++s) {
            for (int64_t j = 0; j < hc; ++j) {
                for (int64_t i = 0; i < H; ++i) {
                    const double want = h[s][j][i];
                    const double got = out.layer_streams[l][(s * hc + j) * H + i];
                    worst = std::max(worst, std::fabs(got - want));
                    scale = std::max(scale, std::fabs(want));
                }
            }
        }
        EXPECT_LT(worst, layer_tol * (1 + scale))
            << "layer " << l << " (ratio " << c.compress_ratio(l) << "): max |diff| " << worst
            << ", max |ref| " << scale;
    }
    Vec want = ref.logits("", h[T - 1], "norm.weight");
    double worst = 0, sd = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(out.logits[i] - want[i]));
        sd += want[i] * want[i];
    }
    sd = std::sqrt(sd / static_cast<double>(want.size()));
    EXPECT_LT(worst, logit_tol * sd) << "logits; std " << sd;

    // MTP at every position (teacher forcing: the next token is the prompt's).
    std::vector<int32_t> next(ids.begin() + 1, ids.end());
    next.push_back(3);
    std::vector<float> draft;
    ASSERT_TRUE(model->mtp_forward(next, out.streams, 0, *st, draft).is_ok());
    std::vector<std::vector<Vec>> x(static_cast<size_t>(T));
    for (int64_t s = 0; s < T; ++s) {
        const auto& e = ref.t("embed.weight");
        Vec en = ref.norm("mtp.0.enorm.weight", Vec(e.begin() + next[s] * H, e.begin() + (next[s] + 1) * H));
        Vec ep = ref.linear("mtp.0.e_proj.weight", en);
        for (int64_t j = 0; j < hc; ++j) {
            Vec hp = ref.linear("mtp.0.h_proj.weight", ref.norm("mtp.0.hnorm.weight", h[s][j]));
            for (int64_t i = 0; i < H; ++i) hp[i] += ep[i];
            x[s].push_back(hp);
        }
    }
    ref.block("mtp.0.", c.num_hidden_layers, x, next);
    Vec dwant = ref.logits("mtp.0.", x[T - 1], "mtp.0.norm.weight");
    worst = 0;
    for (size_t i = 0; i < dwant.size(); ++i) {
        worst = std::max(worst, std::fabs(draft[(T - 1) * c.vocab_size + i] - dwant[i]));
    }
    EXPECT_LT(worst, logit_tol * sd) << "MTP logits";
}

TEST(V4ForwardTest, MatchesDoubleReferencePerLayer) {
    check_against_reference(kernels::KvDtype::kF32, 300, 2e-4, 1e-4);
}

TEST(V4ForwardTest, E4m3MatchesSimulatedReferencePerLayer) {
    check_against_reference(kernels::KvDtype::kE4m3, 300, 2e-3, 2e-3);
}

// One chunk = uneven chunks = token by token, bitwise (streams of every token and the
// last logits), with 2 threads against 1; for each KV dtype.
class V4KvDtypeTest : public ::testing::TestWithParam<kernels::KvDtype> {};
std::string kv_dtype_param_name(const ::testing::TestParamInfo<kernels::KvDtype>& p) {
    return kernels::kv_dtype_name(p.param);
}
INSTANTIATE_TEST_SUITE_P(KvDtypes, V4KvDtypeTest,
                         ::testing::Values(kernels::KvDtype::kF32, kernels::KvDtype::kE4m3),
                         kv_dtype_param_name);

TEST_P(V4KvDtypeTest, ChunkingDecodeAndThreadsAreBitwiseInvariant) {
    const ModelConfig c = tiny_v4();
    auto one = load_memory(c, 1, "auto", GetParam());
    auto two = load_memory(c, 2, "auto", GetParam());
    const int64_t T = 300;
    std::vector<int32_t> ids = prompt(T, static_cast<int32_t>(c.vocab_size), 11);
    auto run = [&](DeepseekV4Model& m, const std::vector<int64_t>& chunks) {
        auto st = m.new_state(T);
        std::vector<float> streams, last;
        int64_t at = 0;
        for (int64_t n : chunks) {
            V4Output out;
            std::span<const int32_t> part(ids.data() + at, static_cast<size_t>(n));
            EXPECT_TRUE(m.forward(part, at, *st, false, out).is_ok());
            streams.insert(streams.end(), out.streams.begin(), out.streams.end());
            last = out.logits;
            at += n;
        }
        EXPECT_EQ(at, T);
        EXPECT_EQ(st->length(), T);
        return std::make_pair(streams, last);
    };
    const auto whole = run(*one, {T});
    std::vector<int64_t> singles(static_cast<size_t>(T), 1);
    EXPECT_EQ(run(*one, {1, 127, 1, 3, 125, 43}), whole);
    EXPECT_EQ(run(*one, singles), whole);
    EXPECT_EQ(run(*two, {T}), whole);
    EXPECT_EQ(run(*two, {129, 171}), whole);
}

// A sequence's results do not depend on the other sequences in its step.
TEST_P(V4KvDtypeTest, BatchInvariant) {
    const ModelConfig c = tiny_v4();
    auto m = load_memory(c, 2, "auto", GetParam());
    std::vector<int32_t> a = prompt(140, static_cast<int32_t>(c.vocab_size), 1);
    std::vector<int32_t> b = prompt(70, static_cast<int32_t>(c.vocab_size), 2);
    std::vector<int32_t> d = prompt(9, static_cast<int32_t>(c.vocab_size), 3);
    auto sa = m->new_state(200);
    V4Output alone;
    ASSERT_TRUE(m->forward(a, 0, *sa, true, alone).is_ok());
    auto sa2 = m->new_state(200), sb = m->new_state(200), sd = m->new_state(200);
    // b and d run a first chunk alone, then all three share a step.
    V4Output tmp;
    ASSERT_TRUE(m->forward(std::span(b).first(30), 0, *sb, false, tmp).is_ok());
    V4Step steps[] = {{std::span(d), 0, sd.get(), false},
                      {std::span(a), 0, sa2.get(), true},
                      {std::span(b).subspan(30), 30, sb.get(), true}};
    V4Output batched;
    ASSERT_TRUE(m->forward_batch(steps, batched).is_ok());
    const size_t V = static_cast<size_t>(c.vocab_size);
    std::vector<float> mine(batched.logits.begin() + batched.logit_row[1] * V,
                            batched.logits.begin() + (batched.logit_row[1] + 140) * V);
    EXPECT_EQ(mine, alone.logits);
}

// e4m3 KV stores what the reference simulates: rows take the compact sizes (584
// bytes at head_dim 512: a small-v4-shaped head here), the logits move off the f32
// cache's by a quantisation-sized amount (not zero: the rows really are quantised;
// not more: nothing else changed), and the MTP layer runs on the same cache.
TEST(V4ForwardTest, E4m3CacheIsCompactAndCloseToF32) {
    ModelConfig c = tiny_v4();
    c.head_dim = 512;  // V4-Flash's head: 448 nope + 64 rope
    c.qk_rope_head_dim = 64;
    c.index_head_dim = 128;
    auto f32 = load_memory(c, 2);
    auto fp8 = load_memory(c, 2, "auto", kernels::KvDtype::kE4m3);
    EXPECT_EQ(fp8->kv_dtype(), kernels::KvDtype::kE4m3);
    const KvLayout lf = f32->kv_layout(), l8 = fp8->kv_layout();
    ASSERT_EQ(l8.groups.size(), 3u);
    EXPECT_EQ(l8.groups[0].floats_per_entry * 4, 584);  // c4
    EXPECT_EQ(l8.groups[1].floats_per_entry * 4, 68);   // c4_index
    EXPECT_EQ(l8.groups[2].floats_per_entry * 4, 584);  // c128
    EXPECT_EQ(lf.groups[0].floats_per_entry * 4, 2048);
    // State: per layer (4 + MTP) a ring of 128 rows, plus the f32 accumulators.
    EXPECT_EQ((lf.state_floats - l8.state_floats) * 4, 5 * 128 * (2048 - 584));
    // The plan's compact column is what the engine allocates with e4m3.
    const MemoryPlan p = plan_memory(c, 4096);
    double compact = 0, engine = 0;
    int64_t compact_state = 0;
    for (const MemoryPlan::LayerKind& k : p.kinds) {
        compact += k.compact_bytes_per_token;
        compact_state += k.compact_state_bytes;
    }
    for (const KvGroupLayout& g : l8.groups) {
        engine += static_cast<double>(g.num_layers * g.floats_per_entry * 4) /
                  static_cast<double>(g.tokens_per_entry);
    }
    EXPECT_DOUBLE_EQ(compact, engine);
    EXPECT_EQ(compact_state + 16, l8.state_floats * 4);

    const int64_t T = 300;
    std::vector<int32_t> ids = prompt(T, static_cast<int32_t>(c.vocab_size), 5);
    auto run = [&](DeepseekV4Model& m, std::vector<float>& draft) {
        auto st = m.new_state(T);
        V4Output out;
        EXPECT_TRUE(m.forward(ids, 0, *st, true, out).is_ok());
        std::vector<int32_t> next(ids.begin() + 1, ids.end());
        next.push_back(1);
        EXPECT_TRUE(m.mtp_forward(next, out.streams, 0, *st, draft).is_ok());
        return out.logits;
    };
    std::vector<float> df, d8;
    const std::vector<float> a = run(*f32, df), b = run(*fp8, d8);
    ASSERT_EQ(a.size(), b.size());
    // Per position the largest logit difference (main and MTP), as a share of the
    // logits' std. A random model is sensitive (a 6 % error per cached value moves its
    // logits by ~8 % of their std; a changed indexer choice by more), so this bounds
    // the median and asks for the same argmax almost everywhere; the exact check is
    // E4m3MatchesSimulatedReferencePerLayer.
    double sd = 0;
    int64_t argmax_same = 0;
    std::vector<double> worst(static_cast<size_t>(T)), dworst(static_cast<size_t>(T));
    const int64_t V = c.vocab_size;
    for (int64_t t = 0; t < T; ++t) {
        const float* x = a.data() + t * V;
        const float* y = b.data() + t * V;
        argmax_same += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
        for (int64_t v = 0; v < V; ++v) {
            sd += double(x[v]) * x[v];
            worst[t] = std::max(worst[t], std::fabs(double(x[v]) - y[v]));
            dworst[t] = std::max(dworst[t], std::fabs(double(df[t * V + v]) - d8[t * V + v]));
        }
    }
    sd = std::sqrt(sd / static_cast<double>(a.size()));
    std::sort(worst.begin(), worst.end());
    std::sort(dworst.begin(), dworst.end());
    EXPECT_GT(worst[0], 1e-4 * sd) << "e4m3 logits equal the f32 cache's: nothing was quantised";
    EXPECT_LT(worst[T / 2], 0.15 * sd) << "median; logit std " << sd;
    EXPECT_GT(dworst[0], 1e-4 * sd);
    EXPECT_LT(dworst[T / 2], 0.15 * sd);
    EXPECT_GE(argmax_same, T * 9 / 10);
}

// The HF directory written by make-model (FP8 + ue8m0 scales, FP4 I8 experts) loads
// to the same values as the in-memory model: experts repacked as f32 give the same
// logits to f32 rounding; kept as MXFP4 (activations quantised to Q8_0 per 32, as in
// llama.cpp) they stay close.
class V4CheckpointTest : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = std::filesystem::temp_directory_path() /
               ("dsi_v4_test_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::remove_all(dir_);
        config_ = tiny_v4();
        TokenizerFiles tok{"{}", "{}"};
        ASSERT_TRUE(write_hf_checkpoint(Env::default_env(), config_, 1, tok, dir_.string(), 8 << 20).is_ok());
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }

    Result<std::unique_ptr<DeepseekV4Model>> open(const std::string& fmt = "auto") {
        DSI_ASSIGN_OR_RETURN(auto src, open_checkpoint(Env::default_env(), dir_.string()));
        DeepseekV4Model::Options o;
        o.weight_format = fmt;
        return DeepseekV4Model::load(std::move(src), o);
    }

    std::filesystem::path dir_;
    ModelConfig config_;
};

TEST_F(V4CheckpointTest, LoadsTheOfficialLayout) {
    auto mem = load_memory(config_);
    auto f32 = open("experts=f32");
    ASSERT_TRUE(f32.is_ok()) << f32.status().to_string();
    auto mx = open();
    ASSERT_TRUE(mx.is_ok()) << mx.status().to_string();
    std::vector<int32_t> ids = prompt(150, static_cast<int32_t>(config_.vocab_size), 5);
    auto logits = [&](DeepseekV4Model& m) {
        auto st = m.new_state(200);
        V4Output out;
        EXPECT_TRUE(m.forward(ids, 0, *st, true, out).is_ok());
        return out.logits;
    };
    const std::vector<float> want = logits(*mem);
    double sd = 0;
    for (float v : want) sd += double(v) * v;
    sd = std::sqrt(sd / want.size());
    auto diff = [&](const std::vector<float>& got) {
        double w = 0;
        for (size_t i = 0; i < want.size(); ++i) w = std::max(w, std::fabs(double(got[i]) - want[i]));
        return w;
    };
    EXPECT_LT(diff(logits(**f32)), 1e-4 * sd);
    // MXFP4 experts quantise activations to Q8_0 (as llama.cpp): typically ~2% of the
    // logit std per position; a routing or indexer top-k flip moves a few positions more.
    const std::vector<float> got = logits(**mx);
    const size_t V = static_cast<size_t>(config_.vocab_size);
    size_t far = 0;
    for (size_t t = 0; t < got.size() / V; ++t) {
        double w = 0;
        for (size_t i = 0; i < V; ++i) w = std::max(w, std::fabs(double(got[t * V + i]) - want[t * V + i]));
        far += w > 0.1 * sd;
    }
    EXPECT_LE(far, got.size() / V / 10) << "positions beyond 0.1 of the logit std";
    EXPECT_GT(max_abs(want), 1.0);
}

TEST_F(V4CheckpointTest, BadFilesGiveClearErrors) {
    // A truncated shard.
    std::string shard;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
        if (e.path().extension() == ".safetensors") shard = e.path().string();
    }
    ASSERT_FALSE(shard.empty());
    const auto size = std::filesystem::file_size(shard);
    std::filesystem::resize_file(shard, size / 2);
    Result<std::unique_ptr<WeightSource>> r = open_checkpoint(Env::default_env(), dir_.string());
    Status s = r.is_ok() ? DeepseekV4Model::load(std::move(r).value(), {}).status() : r.status();
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.to_string().find(".safetensors"), std::string::npos) << s.to_string();

    // An inconsistent config names config.json and the field.
    std::string cfg = to_hf_config_json(config_);
    cfg.replace(cfg.find("\"compress_ratios\""), 17, "\"compress_ratiox\"");
    std::ofstream(dir_ / "config.json") << cfg;
    r = open_checkpoint(Env::default_env(), dir_.string());
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().to_string().find("config.json"), std::string::npos);
    EXPECT_NE(r.status().to_string().find("compress_ratios"), std::string::npos);
}

// GGUF deepseek4 written from the same values: F32 matrices give the in-memory model's
// logits bit for bit; MXFP4 experts equal the in-memory model with its experts
// repacked as MXFP4 (the FP4 values are exact in llama.cpp's MXFP4 rounding). The MTP
// layer travels too (block num_hidden_layers, e_proj | h_proj as nextn.eh_proj): its
// drafts equal the in-memory model's whose MTP hc_head is the trunk's, the one thing
// llama.cpp's layout has no slot for.
TEST(V4GgufTest, RoundTripIsExact) {
    const ModelConfig c = tiny_v4();
    const std::string dir = std::filesystem::temp_directory_path() /
                            ("dsi_v4_gguf_" + std::to_string(::getpid()));
    TokenizerFiles tok{R"({"model": {"vocab": {"a": 0, "b": 1}, "merges": []}})", "{}"};
    ASSERT_TRUE(write_gguf_checkpoint(Env::default_env(), c, 1, tok, DType::kF32,
                                      dir + "/f32.gguf").is_ok());
    ASSERT_TRUE(write_gguf_checkpoint(Env::default_env(), c, 1, tok, DType::kF32,
                                      dir + "/mx.gguf", DType::kMXFP4).is_ok());
    std::vector<int32_t> ids = prompt(140, static_cast<int32_t>(c.vocab_size), 9);
    auto logits = [&](std::unique_ptr<DeepseekV4Model> m) {
        auto st = m->new_state(160);
        V4Output out;
        EXPECT_TRUE(m->forward(ids, 0, *st, true, out).is_ok());
        return out.logits;
    };
    auto drafts = [&](std::unique_ptr<DeepseekV4Model> m) {
        auto st = m->new_state(160);
        V4Output out;
        EXPECT_TRUE(m->forward(ids, 0, *st, true, out).is_ok());
        std::vector<int32_t> next(ids.begin() + 1, ids.end());
        next.push_back(5);
        std::vector<float> draft;
        EXPECT_TRUE(m->mtp_forward(next, out.streams, 0, *st, draft).is_ok());
        return draft;
    };
    auto open_gguf = [&](const std::string& file) {
        auto src = open_checkpoint(Env::default_env(), dir + "/" + file);
        EXPECT_TRUE(src.is_ok()) << src.status().to_string();
        EXPECT_TRUE(src->get()->config().is_v4());
        EXPECT_EQ(src->get()->config().num_nextn_predict_layers, 1);
        EXPECT_TRUE(src->get()->has("mtp.0.e_proj.weight"));
        EXPECT_FALSE(src->get()->has("mtp.0.hc_head_fn"));
        auto m = DeepseekV4Model::load(std::move(src).value(), {});
        EXPECT_TRUE(m.is_ok()) << m.status().to_string();
        return std::move(m).value();
    };
    // The in-memory model with the trunk's hc_head in the MTP layer.
    auto trunk_head = [&](const std::string& fmt) {
        auto full = synthetic_v4_memory_model(c, 1);
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : full->tensors()) {
            const std::string trunk = name.starts_with("mtp.0.hc_head_") ? name.substr(6) : name;
            const auto& from = full->tensors().at(trunk);
            src->add(name, from.shape, from.data);
        }
        DeepseekV4Model::Options o;
        o.weight_format = fmt;
        auto m = DeepseekV4Model::load(std::move(src), o);
        EXPECT_TRUE(m.is_ok()) << m.status().to_string();
        return std::move(m).value();
    };
    EXPECT_EQ(logits(open_gguf("f32.gguf")), logits(load_memory(c)));
    EXPECT_EQ(logits(open_gguf("mx.gguf")), logits(load_memory(c, 1, "experts=mxfp4")));
    const std::vector<float> gguf_drafts = drafts(open_gguf("f32.gguf"));
    EXPECT_EQ(gguf_drafts, drafts(trunk_head("auto")));
    EXPECT_NE(gguf_drafts, drafts(load_memory(c)));  // the MTP hc_head does matter
    EXPECT_EQ(drafts(open_gguf("mx.gguf")), drafts(trunk_head("experts=mxfp4")));

    // A file that declares an MTP block without its tensors has none (llama.cpp's rule).
    {
        auto f = GgufFile::open(Env::default_env(), dir + "/f32.gguf");
        ASSERT_TRUE(f.is_ok());
        GgufWriter w;
        for (const auto& [k, v] : gguf_metadata_for_config(c, "no mtp tensors")) w.add_kv(k, v);
        for (const GgufTensorInfo& t : f->tensors()) {
            if (t.name.starts_with("blk." + std::to_string(c.num_hidden_layers) + ".")) continue;
            auto view = f->view(t.name);
            ASSERT_TRUE(view.is_ok());
            w.add_tensor(t.name, view->dtype, t.shape,
                         std::vector<uint8_t>(view->data.begin(), view->data.end()));
        }
        ASSERT_TRUE(w.write(Env::default_env(), dir + "/nomtp.gguf").is_ok());
        auto src = open_checkpoint(Env::default_env(), dir + "/nomtp.gguf");
        ASSERT_TRUE(src.is_ok()) << src.status().to_string();
        EXPECT_EQ(src->get()->config().num_nextn_predict_layers, 0);
        auto m = DeepseekV4Model::load(std::move(src).value(), {});
        ASSERT_TRUE(m.is_ok()) << m.status().to_string();
        EXPECT_EQ(logits(std::move(m).value()), logits(load_memory(c)));
    }
    std::filesystem::remove_all(dir);
}

TEST(V4LoadTest, MissingOrMisshapedTensorsAreNamed) {
    const ModelConfig c = tiny_v4();
    const auto full = synthetic_v4_memory_model(c, 1);
    {
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : full->tensors()) {
            if (name != "layers.1.attn.indexer.compressor.ape") src->add(name, t.shape, t.data);
        }
        auto m = DeepseekV4Model::load(std::move(src), {});
        ASSERT_FALSE(m.is_ok());
        EXPECT_NE(m.status().message().find("layers.1.attn.indexer.compressor.ape"), std::string::npos);
    }
    {
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : full->tensors()) {
            if (name == "layers.2.attn.wq_a.weight") {
                src->add(name, {t.shape[1], t.shape[0]}, t.data);
            } else {
                src->add(name, t.shape, t.data);
            }
        }
        auto m = DeepseekV4Model::load(std::move(src), {});
        ASSERT_FALSE(m.is_ok());
        EXPECT_NE(m.status().message().find("layers.2.attn.wq_a.weight"), std::string::npos);
    }
    {
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : full->tensors()) {
            std::vector<float> d = t.data;
            if (name == "layers.0.ffn.gate.tid2eid") d[5] = static_cast<float>(c.n_routed_experts);
            src->add(name, t.shape, d);
        }
        auto m = DeepseekV4Model::load(std::move(src), {});
        ASSERT_FALSE(m.is_ok());
        EXPECT_NE(m.status().message().find("tid2eid"), std::string::npos);
    }
}

// Why MXFP4 experts agree with llama.cpp less closely than f32 ones (docs/models.md,
// "llama.cpp agreement"): expert inputs are rounded to Q8_0 per 32 values (on both sides,
// as llama.cpp's vec_dot_mxfp4_q8_0), and that rounding turns a last-bit difference
// upstream into a whole quantisation step wherever a value sits near a rounding
// boundary. Here one norm weight moved by one ulp (what a different f32 summation
// order does everywhere in another implementation) changes f32-expert logits by
// round-off only, and MXFP4-expert logits by orders of magnitude more.
TEST(V4ForwardTest, Q8ExpertInputsAmplifyLastBitDifferences) {
    const ModelConfig c = tiny_v4();
    const std::vector<int32_t> ids = prompt(300, static_cast<int32_t>(c.vocab_size), 21);
    const auto base = synthetic_v4_memory_model(c, 1);
    auto logits = [&](const std::string& fmt, bool perturb) {
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : base->tensors()) {
            std::vector<float> d = t.data;
            if (perturb && name == "layers.0.attn_norm.weight") d[3] = std::nextafter(d[3], 10.0f);
            src->add(name, t.shape, d);
        }
        DeepseekV4Model::Options o;
        o.weight_format = fmt;
        auto m = DeepseekV4Model::load(std::move(src), o);
        EXPECT_TRUE(m.is_ok()) << m.status().to_string();
        auto st = (*m)->new_state(static_cast<int64_t>(ids.size()));
        V4Output out;
        EXPECT_TRUE((*m)->forward(ids, 0, *st, true, out).is_ok());
        return out.logits;
    };
    // Per position: max |logit change| over the vocabulary; then the median and the
    // maximum over positions.
    auto spread = [&](const std::vector<float>& a, const std::vector<float>& b) {
        const size_t v = static_cast<size_t>(c.vocab_size);
        std::vector<double> per(a.size() / v, 0.0);
        for (size_t i = 0; i < a.size(); ++i) {
            per[i / v] = std::max(per[i / v], std::fabs(double{a[i]} - b[i]));
        }
        std::sort(per.begin(), per.end());
        return std::pair<double, double>{per[per.size() / 2], per.back()};
    };
    const auto f32 = spread(logits("auto", false), logits("auto", true));
    const auto mx = spread(logits("experts=mxfp4", false), logits("experts=mxfp4", true));
    std::printf("one-ulp change of one norm weight, 300 positions, max |logit change| per "
                "position: f32 experts median %.2e max %.2e; MXFP4 experts (Q8_0 inputs) median "
                "%.2e max %.2e\n", f32.first, f32.second, mx.first, mx.second);
    EXPECT_LT(f32.second, 1e-3);
    EXPECT_GT(mx.first, 10 * f32.first);
    EXPECT_GT(mx.second, 30 * f32.second);
}

// The engine's seam (model/causal_lm.h): load_causal_lm picks the family; V4 through
// CausalLm::forward_batch on its own cache layout equals the V4State path bitwise; bad
// caches and options are refused.
TEST(V4CausalLmTest, SeamMatchesV4StateAndRefusesBadInput) {
    const ModelConfig c = tiny_v4();
    ModelOptions o;
    o.num_threads = 2;
    auto lm = load_causal_lm(synthetic_v4_memory_model(c, 1), o);
    ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
    CausalLm& m = **lm;
    const KvLayout layout = m.kv_layout();
    EXPECT_FALSE(layout.prefix_reusable);
    EXPECT_GT(layout.state_floats, 0);
    const std::vector<int32_t> ids = prompt(140, static_cast<int32_t>(c.vocab_size), 3);
    // Two chunks through the seam vs one call on a V4State.
    auto cache = m.new_kv_cache(160);
    BatchOutput bo;
    const SequenceStep a{std::span(ids).first(100), 0, cache.get(), false};
    ASSERT_TRUE(m.forward_batch(std::span(&a, 1), bo).is_ok());
    const SequenceStep b{std::span(ids).subspan(100), 100, cache.get(), false};
    ASSERT_TRUE(m.forward_batch(std::span(&b, 1), bo).is_ok());
    EXPECT_TRUE(bo.hidden.empty());
    auto ref = load_memory(c, 2);
    auto st = ref->new_state(160);
    V4Output out;
    ASSERT_TRUE(ref->forward(ids, 0, *st, false, out).is_ok());
    EXPECT_EQ(bo.logits, out.logits);
    // Starting again at 0 resets the state: the same logits as a fresh cache.
    const SequenceStep again{std::span(ids), 0, cache.get(), false};
    ASSERT_TRUE(m.forward_batch(std::span(&again, 1), bo).is_ok());
    EXPECT_EQ(bo.logits, out.logits);
    // A step that does not continue the sequence, a cache without a state slot.
    const SequenceStep gap{std::span(ids).first(3), 200, cache.get(), false};
    EXPECT_EQ(m.forward_batch(std::span(&gap, 1), bo).code(), StatusCode::kInvalidArgument);
    ContiguousKvCache plain(4, 128, 16);
    const SequenceStep stateless{std::span(ids).first(3), 0, &plain, false};
    EXPECT_EQ(m.forward_batch(std::span(&stateless, 1), bo).code(), StatusCode::kInvalidArgument);
    // Options V4 does not take: a bf16 cache; e4m3 loads.
    ModelOptions bf16 = o;
    bf16.kv_dtype = "bf16";
    auto bad = load_causal_lm(synthetic_v4_memory_model(c, 1), bf16);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("kv dtype 'bf16'"), std::string::npos);
    ModelOptions e4m3 = o;
    e4m3.kv_dtype = "fp8";
    auto fp8 = load_causal_lm(synthetic_v4_memory_model(c, 1), e4m3);
    ASSERT_TRUE(fp8.is_ok()) << fp8.status().to_string();
    EXPECT_EQ((*fp8)->kv_dtype(), kernels::KvDtype::kE4m3);
    ModelConfig odd = c;
    odd.index_head_dim = 48;
    DeepseekV4Model::Options oo;
    oo.kv_dtype = kernels::KvDtype::kE4m3;
    auto odd_m = DeepseekV4Model::load(synthetic_v4_memory_model(odd, 1), oo);
    ASSERT_FALSE(odd_m.is_ok());
    EXPECT_NE(odd_m.status().message().find("index_head_dim"), std::string::npos);
    ModelOptions ref_kernels = o;
    ref_kernels.reference_kernels = true;
    EXPECT_EQ(load_causal_lm(synthetic_v4_memory_model(c, 1), ref_kernels).status().code(),
              StatusCode::kInvalidArgument);
    // A V3 checkpoint gets the MLA layout: one group, no state, reusable prefixes.
    ModelConfig v3 = synthetic_preset("tiny-v3").value();
    v3.vocab_size = 512;
    auto mla = load_causal_lm(synthetic_memory_model(v3, 1), o);
    ASSERT_TRUE(mla.is_ok()) << mla.status().to_string();
    const KvLayout ml = (*mla)->kv_layout();
    ASSERT_EQ(ml.groups.size(), 1u);
    EXPECT_EQ(ml.groups[0].name, "mla");
    EXPECT_EQ(ml.state_floats, 0);
    EXPECT_TRUE(ml.prefix_reusable);
}

// `dsinfer plan` describes what the engine really allocates for a V4 sequence: the
// paged groups' bytes per token and the state slot (plus its 16-byte length header).
TEST(V4CausalLmTest, MemoryPlanMatchesTheEnginesLayout) {
    const ModelConfig c = tiny_v4();
    const KvLayout l = load_memory(c)->kv_layout();
    double per_token = 0;
    for (const KvGroupLayout& g : l.groups) {
        per_token += static_cast<double>(g.num_layers * g.floats_per_entry * 4) /
                     static_cast<double>(g.tokens_per_entry);
    }
    const MemoryPlan p = plan_memory(c, 4096);
    double plan_per_token = 0;
    int64_t plan_state = 0;
    for (const MemoryPlan::LayerKind& k : p.kinds) {
        plan_per_token += k.dsinfer_bytes_per_token;
        plan_state += k.dsinfer_state_bytes;
    }
    EXPECT_DOUBLE_EQ(plan_per_token, per_token);
    EXPECT_EQ(plan_state + 16, l.state_floats * 4);
}

TEST(V4ForwardTest, BadCallsAreRejected) {
    const ModelConfig c = tiny_v4();
    auto m = load_memory(c);
    auto st = m->new_state(16);
    V4Output out;
    std::vector<int32_t> ok = {1, 2, 3};
    std::vector<int32_t> bad = {1, static_cast<int32_t>(c.vocab_size)};
    EXPECT_FALSE(m->forward(bad, 0, *st, false, out).is_ok());
    EXPECT_FALSE(m->forward(ok, 1, *st, false, out).is_ok());  // not the state's length
    EXPECT_FALSE(m->forward({}, 0, *st, false, out).is_ok());
    std::vector<int32_t> many(17, 1);
    EXPECT_EQ(m->forward(many, 0, *st, false, out).code(), StatusCode::kOutOfRange);
    ASSERT_TRUE(m->forward(ok, 0, *st, false, out).is_ok());
    EXPECT_EQ(st->length(), 3);
    V4Step twice[] = {{std::span(ok), 3, st.get(), false}, {std::span(ok), 3, st.get(), false}};
    EXPECT_FALSE(m->forward_batch(twice, out).is_ok());
    std::vector<float> logits;
    EXPECT_FALSE(m->mtp_forward(ok, std::vector<float>(5), 0, *st, logits).is_ok());
    // A V3 checkpoint is not V4.
    ModelConfig v3 = synthetic_preset("tiny-v3").value();
    v3.vocab_size = 512;
    EXPECT_FALSE(DeepseekV4Model::load(synthetic_memory_model(v3, 1), {}).is_ok());
}

}  // namespace
}  // namespace dsi
