// A double-precision reference of DeepSeek V4's blocks written from the reference notes
// (../shared/reference/deepseek_v4.md §2), for the V4 and V4.1 model tests
// (deepseek_v4_test.cc, deepseek_v41_test.cc): each quantity from its definition over the
// whole sequence (compressed entries from their groups, top-k from all visible keys), not
// with the models' incremental state machines. Test-only (gtest). Thread model: none.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace dsi::test {

using Tensors = std::map<std::string, MemoryWeightSource::Tensor>;
using Vec = std::vector<double>;

// The reference's simulated quantisation of cached KV (deepseek_v4.md §2.2-§2.4),
// written from the format definitions: x rounded to `bits` significant bits at or
// above 2^min_exp (below: the subnormal step), ties to even, saturating at max.
inline double round_float(double x, int bits, int min_exp, double max) {
    if (std::isnan(x)) return x;
    const double a = std::min(std::fabs(x), max);
    int e = 0;
    std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
    const int step_exp = std::max(e, min_exp + 1) - bits;
    const double r = std::ldexp(std::nearbyint(std::ldexp(a, -step_exp)), step_exp);
    return std::copysign(std::min(r, max), x);
}
inline double e4m3_round(double x) { return round_float(x, 4, -6, 448.0); }
inline double e2m1_round(double x) { return round_float(x, 2, 0, 6.0); }
inline double bf16_round(double x) { return round_float(x, 8, -126, 3.0e38); }
// Per group of `g` values: scale 2^ceil(log2(max(amax, floor) / max)), value rounded.
inline void simulate_groups(double* v, int64_t n, int64_t g, double floor, double max,
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
inline void simulate_main(double* v, int64_t dim, int64_t rope) {
    simulate_groups(v, dim - rope, 64, 1e-4, 448.0, e4m3_round);
    for (int64_t i = dim - rope; i < dim; ++i) v[i] = bf16_round(v[i]);
}
// An indexer query or key: Hadamard rotation (normalised, Sylvester order), then FP4
// per 32.
inline void simulate_index(double* v, int64_t dim) {
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
            for (size_t i = 0; i < in; ++i)
                acc += static_cast<double>(W[(row0 + o) * in + i]) * x[i];
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
        auto dim_of = [&](double rot) {
            return d * std::log(L / (rot * 2 * M_PI)) / (2 * std::log(theta));
        };
        double lo = std::max(0.0, std::floor(dim_of(c.rope_scaling.beta_fast)));
        double hi =
            std::min(static_cast<double>(d - 1), std::ceil(dim_of(c.rope_scaling.beta_slow)));
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
    // With pre_out: the pre coefficients too (V4.1's single-pass mHC uses them later).
    void hc_pre(const std::string& p, const std::vector<Vec>& h, Vec& xin, Vec& post,
                std::vector<Vec>& C, Vec* pre_out = nullptr) const {
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
        if (pre_out != nullptr) pre_out->resize(static_cast<size_t>(hc));
        for (int64_t j = 0; j < hc; ++j) {
            const double pre = sigm(mix[j] * scale[0] + base[j]) + c.hc_eps;
            if (pre_out != nullptr) (*pre_out)[j] = pre;
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
                        for (int64_t s = (g - 1) * r; s < g * r; ++s)
                            cand.push_back({sc[s][ch], kv[s][ch]});
                    }
                    for (int64_t s = g * r; s < (g + 1) * r; ++s)
                        cand.push_back({sc[s][D + ch], kv[s][D + ch]});
                } else {
                    for (int64_t s = g * r; s < (g + 1) * r; ++s)
                        cand.push_back({sc[s][ch], kv[s][ch]});
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

    // The queries (q_lora latent qr, per-head normalised and rotated q) and the shared
    // head's rotated kv of every position; a = "layers.N.attn.".
    void project(const std::string& a, const Vec& f, const std::vector<Vec>& x,
                 std::vector<Vec>& qr, std::vector<Vec>& q, std::vector<Vec>& kv) const {
        const int64_t T = static_cast<int64_t>(x.size());
        const int64_t nh = c.num_attention_heads, hd = c.head_dim;
        qr.resize(x.size());
        q.resize(x.size());
        kv.resize(x.size());
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
        }
    }
    // The indexer's rotated per-head queries of position s and its head weights.
    void index_query(const std::string& a, const Vec& f, const Vec& qr, const Vec& x, int64_t s,
                     bool simulate, Vec& qi, Vec& wi) const {
        const int64_t ih = c.index_n_heads, ihd = c.index_head_dim;
        qi = linear(a + "indexer.wq_b.weight", qr);
        wi = linear(a + "indexer.weights_proj.weight", x);
        for (int64_t h = 0; h < ih; ++h) {
            rope(qi.data() + h * ihd, ihd, s, f, false);
            if (simulate) simulate_index(qi.data() + h * ihd, ihd);
        }
    }
    double index_score(const Vec& qi, const Vec& wi, const Vec& key) const {
        const int64_t ih = c.index_n_heads, ihd = c.index_head_dim;
        double v = 0;
        for (int64_t h = 0; h < ih; ++h) {
            double d = 0;
            for (int64_t i = 0; i < ihd; ++i) d += qi[h * ihd + i] * key[i];
            v += std::max(d, 0.0) * wi[h] / std::sqrt(double(ihd)) / std::sqrt(double(ih));
        }
        return v;
    }
    // The k best (ties: the lower id) of (score, id) pairs, ascending ids.
    static std::vector<int64_t> top_ids(std::vector<std::pair<double, int64_t>> sc, int64_t k) {
        for (auto& [v, id] : sc) v = -v;  // ascending = best first, ties lower id
        std::sort(sc.begin(), sc.end());
        std::vector<int64_t> ids;
        for (int64_t i = 0; i < std::min<int64_t>(static_cast<int64_t>(sc.size()), k); ++i)
            ids.push_back(sc[i].second);
        std::sort(ids.begin(), ids.end());
        return ids;
    }
    // Position s attends to `keys` and the sink; inverse RoPE; grouped low-rank output.
    Vec attend(const std::string& a, const Vec& f, const Vec& qs, int64_t s,
               const std::vector<const Vec*>& keys) const {
        const int64_t nh = c.num_attention_heads, hd = c.head_dim;
        const auto& sink = t(a + "attn_sink");
        Vec o(static_cast<size_t>(nh * hd), 0.0);
        for (int64_t h = 0; h < nh; ++h) {
            Vec logit;
            double mx = sink[h];
            for (const Vec* k : keys) {
                double d = 0;
                for (int64_t i = 0; i < hd; ++i) d += qs[h * hd + i] * (*k)[i];
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
        Vec out = linear(a + "wo_b.weight", low);
        EXPECT_EQ(static_cast<int64_t>(out.size()), c.hidden_size);
        return out;
    }

    std::vector<Vec> attention(const std::string& p, int64_t layer,
                               const std::vector<Vec>& x) const {
        const int64_t T = static_cast<int64_t>(x.size());
        const int64_t hd = c.head_dim;
        const int64_t r = c.compress_ratios[static_cast<size_t>(layer)];
        const Vec f = inv_freq(layer);
        const std::string a = p + "attn.";
        std::vector<Vec> qr, q, kv;
        project(a, f, x, qr, q, kv);
        if (fp8) {
            for (Vec& k : kv) simulate_main(k.data(), hd, c.qk_rope_head_dim);
        }
        std::vector<Vec> entries, ikeys;
        if (r > 0) entries = compress_all(a + "compressor.", x, r, hd, f);
        if (r == 4) ikeys = compress_all(a + "indexer.compressor.", x, 4, c.index_head_dim, f);
        if (fp8) {
            for (Vec& e : entries) simulate_main(e.data(), hd, c.qk_rope_head_dim);
            for (Vec& k : ikeys) simulate_index(k.data(), c.index_head_dim);
        }
        std::vector<Vec> out;
        for (int64_t s = 0; s < T; ++s) {
            std::vector<const Vec*> keys;
            const int64_t visible = r > 0 ? (s + 1) / r : 0;
            if (r == 128) {
                for (int64_t e = 0; e < visible; ++e) keys.push_back(&entries[e]);
            } else if (r == 4) {
                Vec qi, wi;
                index_query(a, f, qr[s], x[s], s, fp8, qi, wi);
                std::vector<std::pair<double, int64_t>> sc;
                for (int64_t e = 0; e < visible; ++e)
                    sc.push_back({index_score(qi, wi, ikeys[e]), e});
                for (int64_t e : top_ids(sc, c.index_topk)) keys.push_back(&entries[e]);
            }
            for (int64_t k = std::max<int64_t>(0, s - c.sliding_window + 1); k <= s; ++k)
                keys.push_back(&kv[k]);
            out.push_back(attend(a, f, q[s], s, keys));
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
            for (int64_t j = 0; j < k; ++j)
                ids.push_back(static_cast<int64_t>(t(f + "gate.tid2eid")[token * k + j]));
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

    Vec logits(const std::string& p, const std::vector<Vec>& h,
               const std::string& norm_name) const {
        Vec xf;
        for (const Vec& s : h) xf.insert(xf.end(), s.begin(), s.end());
        double ms = 0;
        for (double v : xf) ms += v * v;
        const double rs = 1 / std::sqrt(ms / static_cast<double>(xf.size()) + c.rms_norm_eps);
        Vec mix = linear(p + "hc_head_fn", xf);
        Vec y(h[0].size(), 0.0);
        for (int64_t j = 0; j < c.hc_mult; ++j) {
            const double pre =
                sigm(mix[j] * rs * t(p + "hc_head_scale")[0] + t(p + "hc_head_base")[j]) + c.hc_eps;
            for (size_t i = 0; i < y.size(); ++i) y[i] += pre * h[j][i];
        }
        return linear("head.weight", norm(norm_name, y));
    }
};

}  // namespace dsi::test
