// Tests of the reference forward pass against an independent, deliberately naive
// implementation written here from the HF modelling code's definitions (explicit
// per-head keys and values, HF's de-interleaved rotate-half rope, full recompute, no
// cache), plus incremental decoding, batch and thread invariance, and bad input.
#include "model/deepseek.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "model/synthetic.h"

namespace dsi {
namespace {

using Tensors = std::map<std::string, MemoryWeightSource::Tensor>;

ModelConfig small_vocab(std::string_view preset) {
    ModelConfig c = synthetic_preset(preset).value();
    c.vocab_size = 512;
    return c;
}

// ---- naive reference -------------------------------------------------------------

struct Naive {
    const ModelConfig& c;
    const Tensors& w;

    const std::vector<float>& t(const std::string& name) const {
        auto it = w.find(name);
        EXPECT_NE(it, w.end()) << name;
        return it->second.data;
    }
    // y[o] = sum_i W[o][i] x[i] in double.
    std::vector<float> linear(const std::string& name, const std::vector<float>& x) const {
        const auto& W = t(name);
        size_t in = x.size();
        size_t out = W.size() / in;
        std::vector<float> y(out);
        for (size_t o = 0; o < out; ++o) {
            double acc = 0;
            for (size_t i = 0; i < in; ++i) acc += static_cast<double>(W[o * in + i]) * x[i];
            y[o] = static_cast<float>(acc);
        }
        return y;
    }
    std::vector<float> norm(const std::string& name, const std::vector<float>& x) const {
        const auto& g = t(name);
        double ss = 0;
        for (float v : x) ss += static_cast<double>(v) * v;
        double inv = 1.0 / std::sqrt(ss / x.size() + c.rms_norm_eps);
        std::vector<float> y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i] * inv * g[i]);
        return y;
    }
    // HF: de-interleave [x0 x2 x4 .. | x1 x3 ..], then rotate_half with cos/sin.
    std::vector<double> rope_hf(const float* x, int64_t pos) const {
        const int64_t d = c.qk_rope_head_dim;
        std::vector<double> v(d), out(d);
        for (int64_t i = 0; i < d / 2; ++i) {
            v[i] = x[2 * i];
            v[i + d / 2] = x[2 * i + 1];
        }
        std::vector<double> f = c.rope_inv_freq();
        double af = c.rope_attention_factor();
        for (int64_t i = 0; i < d; ++i) {
            double ang = pos * f[i % (d / 2)];
            double rot = i < d / 2 ? -v[i + d / 2] : v[i - d / 2];
            out[i] = v[i] * std::cos(ang) * af + rot * std::sin(ang) * af;
        }
        return out;
    }
    std::vector<float> mlp(const std::string& p, const std::vector<float>& x) const {
        auto g = linear(p + "gate_proj.weight", x);
        auto u = linear(p + "up_proj.weight", x);
        for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
        return linear(p + "down_proj.weight", g);
    }
    std::vector<float> moe(const std::string& p, const std::vector<float>& x) const {
        const int64_t E = c.n_routed_experts;
        auto logits = linear(p + "mlp.gate.weight", x);
        std::vector<double> s(E);
        if (c.scoring_func == ScoringFunc::kSoftmax) {
            double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
            for (int64_t e = 0; e < E; ++e) sum += s[e] = std::exp(logits[e] - mx);
            for (double& v : s) v /= sum;
        } else {
            for (int64_t e = 0; e < E; ++e) s[e] = 1 / (1 + std::exp(-static_cast<double>(logits[e])));
        }
        std::vector<double> choice = s;
        if (c.topk_method == TopkMethod::kNoauxTc) {
            const auto& b = t(p + "mlp.gate.e_score_correction_bias");
            for (int64_t e = 0; e < E; ++e) choice[e] += b[e];
        }
        if (c.topk_method != TopkMethod::kGreedy && c.n_group > 1) {
            int64_t per = E / c.n_group;
            std::vector<std::pair<double, int64_t>> gs;
            for (int64_t g = 0; g < c.n_group; ++g) {
                std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
                std::sort(v.rbegin(), v.rend());
                gs.push_back({c.topk_method == TopkMethod::kNoauxTc ? v[0] + v[1] : v[0], g});
            }
            std::sort(gs.begin(), gs.end(), [](auto a, auto b) { return a.first > b.first; });
            for (int64_t k = c.topk_group; k < c.n_group; ++k) {
                for (int64_t e = gs[k].second * per; e < (gs[k].second + 1) * per; ++e) choice[e] = -1e30;
            }
        }
        std::vector<int64_t> idx(E);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return choice[a] > choice[b]; });
        idx.resize(c.num_experts_per_tok);
        double wsum = 0;
        for (int64_t e : idx) wsum += s[e];
        std::vector<double> y(x.size(), 0.0);
        for (int64_t e : idx) {
            double wgt = s[e];
            if (c.norm_topk_prob) wgt /= wsum;
            wgt *= c.routed_scaling_factor;
            auto o = mlp(p + "mlp.experts." + std::to_string(e) + ".", x);
            for (size_t i = 0; i < y.size(); ++i) y[i] += wgt * o[i];
        }
        std::vector<float> out(y.begin(), y.end());
        if (c.n_shared_experts > 0) {
            auto sh = mlp(p + "mlp.shared_experts.", x);
            for (size_t i = 0; i < out.size(); ++i) out[i] += sh[i];
        }
        return out;
    }
    // One decoder block over all tokens (full recompute).
    void block(int64_t layer, std::vector<std::vector<float>>& xs) const {
        const std::string p = "model.layers." + std::to_string(layer) + ".";
        const int64_t nh = c.num_attention_heads, nope = c.qk_nope_head_dim,
                      rd = c.qk_rope_head_dim, vd = c.v_head_dim, lora = c.kv_lora_rank;
        const size_t T = xs.size();
        std::vector<std::vector<float>> q(T), kn(T), v(T);
        std::vector<std::vector<double>> kpe(T);
        for (size_t i = 0; i < T; ++i) {
            auto h = norm(p + "input_layernorm.weight", xs[i]);
            q[i] = c.q_lora_rank > 0
                       ? linear(p + "self_attn.q_b_proj.weight",
                                norm(p + "self_attn.q_a_layernorm.weight",
                                     linear(p + "self_attn.q_a_proj.weight", h)))
                       : linear(p + "self_attn.q_proj.weight", h);
            auto kv = linear(p + "self_attn.kv_a_proj_with_mqa.weight", h);
            std::vector<float> lat(kv.begin(), kv.begin() + lora);
            kpe[i] = rope_hf(kv.data() + lora, static_cast<int64_t>(i));
            auto kvb = linear(p + "self_attn.kv_b_proj.weight", norm(p + "self_attn.kv_a_layernorm.weight", lat));
            kn[i] = kvb;  // per head [k_nope(nope), v(vd)]
        }
        const double scale = c.softmax_scale();
        for (size_t i = 0; i < T; ++i) {
            std::vector<float> attn(nh * vd);
            for (int64_t hd = 0; hd < nh; ++hd) {
                const float* qh = q[i].data() + hd * (nope + rd);
                auto qpe = rope_hf(qh + nope, static_cast<int64_t>(i));
                std::vector<double> sc(i + 1);
                double mx = -1e300;
                for (size_t s = 0; s <= i; ++s) {
                    double acc = 0;
                    for (int64_t d = 0; d < nope; ++d) acc += qh[d] * kn[s][hd * (nope + vd) + d];
                    for (int64_t d = 0; d < rd; ++d) acc += qpe[d] * kpe[s][d];
                    sc[s] = acc * scale;
                    mx = std::max(mx, sc[s]);
                }
                double sum = 0;
                for (double& x : sc) sum += x = std::exp(x - mx);
                for (int64_t j = 0; j < vd; ++j) {
                    double acc = 0;
                    for (size_t s = 0; s <= i; ++s) acc += sc[s] / sum * kn[s][hd * (nope + vd) + nope + j];
                    attn[hd * vd + j] = static_cast<float>(acc);
                }
            }
            auto o = linear(p + "self_attn.o_proj.weight", attn);
            for (size_t k = 0; k < o.size(); ++k) xs[i][k] += o[k];
        }
        for (size_t i = 0; i < T; ++i) {
            auto h = norm(p + "post_attention_layernorm.weight", xs[i]);
            auto f = c.is_moe_layer(layer) ? moe(p, h) : mlp(p + "mlp.", h);
            for (size_t k = 0; k < f.size(); ++k) xs[i][k] += f[k];
        }
    }
    std::vector<float> embed(const std::string& name, int32_t tok) const {
        const auto& E = t(name);
        return std::vector<float>(E.begin() + tok * c.hidden_size, E.begin() + (tok + 1) * c.hidden_size);
    }
    // Final-normed hidden states of every token.
    std::vector<std::vector<float>> hidden(const std::vector<int32_t>& toks) const {
        std::vector<std::vector<float>> xs;
        for (int32_t tok : toks) xs.push_back(embed("model.embed_tokens.weight", tok));
        for (int64_t l = 0; l < c.num_hidden_layers; ++l) block(l, xs);
        for (auto& x : xs) x = norm("model.norm.weight", x);
        return xs;
    }
};

void expect_close(const float* a, const float* b, size_t n, double rel, const std::string& what) {
    double maxabs = 0, maxdiff = 0;
    for (size_t i = 0; i < n; ++i) {
        maxabs = std::max(maxabs, std::fabs(static_cast<double>(b[i])));
        maxdiff = std::max(maxdiff, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    EXPECT_LE(maxdiff, rel * maxabs) << what << ": max diff " << maxdiff << " vs max " << maxabs;
}

std::unique_ptr<DeepseekModel> load_model(const ModelConfig& c, int threads,
                                          const MemoryWeightSource** src_out = nullptr) {
    auto src = synthetic_memory_model(c, 1234);
    if (src_out) *src_out = src.get();
    auto m = DeepseekModel::load(std::move(src), {threads});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return std::move(m).value();
}

class ForwardVsNaive : public ::testing::TestWithParam<const char*> {};

TEST_P(ForwardVsNaive, LogitsMatch) {
    ModelConfig c = small_vocab(GetParam());
    const MemoryWeightSource* src = nullptr;
    auto model = load_model(c, 2, &src);
    std::vector<int32_t> toks = {0, 17, 301, 5, 5, 99, 511, 42, 7};
    auto cache = model->new_kv_cache(64);
    ForwardOutput out;
    ASSERT_TRUE(model->forward(toks, 0, *cache, /*all_logits=*/true, out).is_ok());
    Naive naive{c, src->tensors()};
    auto hs = naive.hidden(toks);
    for (size_t i = 0; i < toks.size(); ++i) {
        auto logits = naive.linear("lm_head.weight", hs[i]);
        expect_close(out.logits.data() + i * c.vocab_size, logits.data(), logits.size(), 2e-4,
                     "token " + std::to_string(i));
        expect_close(out.hidden.data() + i * c.hidden_size, hs[i].data(), hs[i].size(), 2e-4,
                     "hidden " + std::to_string(i));
    }
}

INSTANTIATE_TEST_SUITE_P(Presets, ForwardVsNaive, ::testing::Values("tiny", "tiny-v3"));

TEST(ForwardTest, MtpMatchesNaive) {
    ModelConfig c = small_vocab("tiny-v3");
    const MemoryWeightSource* src = nullptr;
    auto model = load_model(c, 1, &src);
    std::vector<int32_t> toks = {3, 14, 15, 92, 65};
    auto cache = model->new_kv_cache(16);
    ForwardOutput out;
    ASSERT_TRUE(model->forward(toks, 0, *cache, true, out).is_ok());
    // Draft for position i uses hidden(i) and the token at i + 1.
    std::vector<int32_t> next(toks.begin() + 1, toks.end());
    next.push_back(100);
    std::vector<float> draft;
    ASSERT_TRUE(model->mtp_forward(next, out.hidden, 0, *cache, draft).is_ok());

    Naive naive{c, src->tensors()};
    auto hs = naive.hidden(toks);
    const std::string p = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    std::vector<std::vector<float>> xs;
    for (size_t i = 0; i < toks.size(); ++i) {
        auto e = naive.norm(p + "enorm.weight", naive.embed(p + "embed_tokens.weight", next[i]));
        auto h = naive.norm(p + "hnorm.weight", hs[i]);
        e.insert(e.end(), h.begin(), h.end());
        xs.push_back(naive.linear(p + "eh_proj.weight", e));
    }
    naive.block(c.num_hidden_layers, xs);
    for (size_t i = 0; i < toks.size(); ++i) {
        auto l = naive.linear(p + "shared_head.head.weight", naive.norm(p + "shared_head.norm.weight", xs[i]));
        expect_close(draft.data() + i * c.vocab_size, l.data(), l.size(), 2e-4, "mtp " + std::to_string(i));
    }
}

TEST(ForwardTest, IncrementalDecodeIsBitwiseEqualToPrefill) {
    ModelConfig c = small_vocab("tiny-v3");
    auto model = load_model(c, 2);
    std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    auto full_cache = model->new_kv_cache(32);
    ForwardOutput full;
    ASSERT_TRUE(model->forward(toks, 0, *full_cache, true, full).is_ok());
    // Prefill in two chunks, then decode one token at a time.
    auto cache = model->new_kv_cache(32);
    ForwardOutput part;
    ASSERT_TRUE(model->forward(std::span(toks).subspan(0, 4), 0, *cache, true, part).is_ok());
    EXPECT_TRUE(std::equal(part.logits.begin(), part.logits.end(), full.logits.begin()));
    ASSERT_TRUE(model->forward(std::span(toks).subspan(4, 3), 4, *cache, true, part).is_ok());
    EXPECT_TRUE(std::equal(part.logits.begin(), part.logits.end(), full.logits.begin() + 4 * c.vocab_size));
    for (size_t i = 7; i < toks.size(); ++i) {
        ASSERT_TRUE(model->forward(std::span(toks).subspan(i, 1), static_cast<int64_t>(i), *cache, false, part).is_ok());
        EXPECT_TRUE(std::equal(part.logits.begin(), part.logits.end(), full.logits.begin() + i * c.vocab_size))
            << "position " << i;
    }
}

TEST(ForwardTest, BatchedSequencesAreBitwiseEqualToAlone) {
    ModelConfig c = small_vocab("tiny-v3");
    auto model = load_model(c, 2);
    const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {9}, {7, 7, 7, 300, 2, 11, 4}};
    // Alone: prefill, then one decode step each.
    std::vector<std::vector<float>> alone_prefill, alone_decode;
    for (const auto& p : prompts) {
        auto cache = model->new_kv_cache(16);
        ForwardOutput o;
        ASSERT_TRUE(model->forward(p, 0, *cache, true, o).is_ok());
        alone_prefill.push_back(o.logits);
        std::vector<int32_t> next = {42};
        ASSERT_TRUE(model->forward(next, static_cast<int64_t>(p.size()), *cache, false, o).is_ok());
        alone_decode.push_back(o.logits);
    }
    // Together: all prefills in one batch; then a mixed batch (decode of 0 and 2,
    // with a fresh prefill of prompt 1 in the middle).
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<SequenceStep> steps;
    for (const auto& p : prompts) {
        caches.push_back(model->new_kv_cache(16));
        steps.push_back({p, 0, caches.back().get(), true});
    }
    BatchOutput b;
    ASSERT_TRUE(model->forward_batch(steps, b).is_ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<float> got(b.logits.begin() + b.logit_row[i] * c.vocab_size,
                               b.logits.begin() + (b.logit_row[i] + prompts[i].size()) * c.vocab_size);
        EXPECT_EQ(got, alone_prefill[i]) << "sequence " << i;
    }
    std::vector<int32_t> next = {42};
    auto fresh = model->new_kv_cache(16);
    std::vector<SequenceStep> mixed = {{next, 5, caches[0].get(), false},
                                       {prompts[1], 0, fresh.get(), true},
                                       {next, 7, caches[2].get(), false}};
    ASSERT_TRUE(model->forward_batch(mixed, b).is_ok());
    auto row = [&](size_t i) {
        return std::vector<float>(b.logits.begin() + b.logit_row[i] * c.vocab_size,
                                  b.logits.begin() + (b.logit_row[i] + 1) * c.vocab_size);
    };
    EXPECT_EQ(row(0), alone_decode[0]);
    EXPECT_EQ(row(1), alone_prefill[1]);
    EXPECT_EQ(row(2), alone_decode[2]);
    // Two entries on one cache are rejected.
    std::vector<SequenceStep> dup = {{next, 5, caches[0].get(), false}, {next, 6, caches[0].get(), false}};
    EXPECT_EQ(model->forward_batch(dup, b).code(), StatusCode::kInvalidArgument);
}

TEST(ForwardTest, ThreadCountDoesNotChangeBits) {
    ModelConfig c = small_vocab("tiny");
    auto m1 = load_model(c, 1);
    auto m3 = load_model(c, 3);
    std::vector<int32_t> toks = {5, 4, 3, 2, 1, 0, 100, 200};
    auto c1 = m1->new_kv_cache(16);
    auto c3 = m3->new_kv_cache(16);
    ForwardOutput o1, o3;
    ASSERT_TRUE(m1->forward(toks, 0, *c1, true, o1).is_ok());
    ASSERT_TRUE(m3->forward(toks, 0, *c3, true, o3).is_ok());
    EXPECT_EQ(o1.logits, o3.logits);
}

TEST(ForwardTest, RejectsBadInput) {
    ModelConfig c = small_vocab("tiny");
    auto model = load_model(c, 1);
    auto cache = model->new_kv_cache(4);
    ForwardOutput out;
    std::vector<int32_t> bad = {1, 512};
    Status s = model->forward(bad, 0, *cache, false, out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("512"), std::string::npos);
    std::vector<int32_t> five = {1, 2, 3, 4, 5};
    EXPECT_EQ(model->forward(five, 0, *cache, false, out).code(), StatusCode::kOutOfRange);
    EXPECT_EQ(model->forward({}, 0, *cache, false, out).code(), StatusCode::kInvalidArgument);
    std::vector<float> logits;
    std::vector<float> hidden(c.hidden_size);
    std::vector<int32_t> one = {1};
    EXPECT_EQ(model->mtp_forward(one, hidden, 0, *cache, logits).code(),
              StatusCode::kFailedPrecondition);
}

TEST(ForwardTest, MissingTensorIsNamed) {
    ModelConfig c = small_vocab("tiny");
    auto src = std::make_unique<MemoryWeightSource>(c);
    for (const TensorSpec& spec : deepseek_tensor_specs(c)) {
        if (spec.name == "model.layers.1.mlp.experts.3.up_proj.weight") continue;
        src->add(spec.name, spec.shape, synthetic_tensor(c, spec, 1));
    }
    auto m = DeepseekModel::load(std::move(src), {1});
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("model.layers.1.mlp.experts.3.up_proj.weight"),
              std::string::npos);
}

TEST(SyntheticTest, DeterministicAndFp8Exact) {
    ModelConfig c = small_vocab("tiny-v3");
    TensorSpec spec{"model.layers.1.mlp.experts.0.gate_proj.weight", {128, 256}, true};
    auto a = synthetic_tensor(c, spec, 7);
    auto b = synthetic_tensor(c, spec, 7);
    EXPECT_EQ(a, b);
    Fp8Matrix m = synthetic_fp8(c, spec, 7);
    ASSERT_EQ(m.scale_inv.size(), 2u);
    for (size_t i = 0; i < a.size(); ++i) {
        float ref = e4m3_to_f32(m.codes[i]) * m.scale_inv[(i % 256) / 128];
        ASSERT_EQ(a[i], ref);
    }
}

}  // namespace
}  // namespace dsi
