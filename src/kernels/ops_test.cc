// Attention and small ops: every ISA variant bitwise equal to the scalar
// reference on random inputs (odd sizes, tails), accuracy against plain double
// math, and invariance of attention to head grouping, KV layout and context split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/ops.h"

namespace dsi::kernels {
namespace {

std::vector<float> random_vec(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng);
    return v;
}

const int64_t kSizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 100, 129, 513};

TEST(OpsTest, ExpIsAccurate) {
    std::vector<float> x = random_vec(10000, 1, -85.0f, 88.0f);
    x.push_back(0.0f);
    x.push_back(-INFINITY);
    std::vector<float> y(x.size());
    exp_n(Isa::kScalar, x.data(), static_cast<int64_t>(x.size()), y.data());
    for (size_t i = 0; i + 1 < x.size(); ++i) {
        const double want = std::exp(static_cast<double>(x[i]));
        EXPECT_NEAR(y[i], want, 3e-7 * want) << x[i];
    }
    EXPECT_EQ(y.back(), 0.0f);
}

TEST(OpsTest, VariantsMatchScalarBitwise) {
    for (Isa isa : supported_isas()) {
        for (int64_t n : kSizes) {
            SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n));
            const auto a = random_vec(n, 10 + static_cast<uint32_t>(n), -20.0f, 20.0f);
            const auto b = random_vec(n, 20 + static_cast<uint32_t>(n));
            EXPECT_EQ(dot(isa, a.data(), b.data(), n), dot(Isa::kScalar, a.data(), b.data(), n));
            std::vector<float> y1(n), y2(n);
            exp_n(isa, a.data(), n, y1.data());
            exp_n(Isa::kScalar, a.data(), n, y2.data());
            EXPECT_EQ(y1, y2);
            rms_norm(isa, a.data(), b.data(), n, 1e-6f, y1.data());
            rms_norm(Isa::kScalar, a.data(), b.data(), n, 1e-6f, y2.data());
            EXPECT_EQ(y1, y2);
            silu_mul(isa, a.data(), b.data(), n, y1.data());
            silu_mul(Isa::kScalar, a.data(), b.data(), n, y2.data());
            EXPECT_EQ(y1, y2);
            y1 = a;
            y2 = a;
            softmax(isa, y1.data(), n);
            softmax(Isa::kScalar, y2.data(), n);
            EXPECT_EQ(y1, y2);
            EXPECT_NEAR(std::accumulate(y1.begin(), y1.end(), 0.0), 1.0, 1e-5);
            EXPECT_EQ(argmax(isa, a.data(), n), argmax(Isa::kScalar, a.data(), n));
            if (n % 2 == 0) {
                const int64_t pairs = n / 2;
                std::vector<double> inv(pairs);
                for (int64_t i = 0; i < pairs; ++i) inv[i] = std::pow(10000.0, -2.0 * i / n);
                std::vector<float> cc(n), ss(n);
                rope_table(37, inv.data(), pairs, 1.0, cc.data(), ss.data());
                std::vector<float> v1 = random_vec(3 * (n + 5), 7), v2 = v1;
                rope_apply(isa, v1.data(), 3, n + 5, cc.data(), ss.data(), pairs);
                rope_apply(Isa::kScalar, v2.data(), 3, n + 5, cc.data(), ss.data(), pairs);
                EXPECT_EQ(v1, v2);
            }
        }
    }
}

TEST(OpsTest, ArgmaxTiesAndTopK) {
    std::vector<float> x = {1, 5, 2, 5, -1, 5, 0};
    for (Isa isa : supported_isas()) EXPECT_EQ(argmax(isa, x.data(), 7), 1);
    const auto r = random_vec(1000, 3);
    std::vector<float> v(r.begin(), r.end());
    v[10] = v[500] = 2.0f;  // a tie at the top
    for (int64_t k : {0, 1, 2, 8, 100}) {
        std::vector<int32_t> ids(static_cast<size_t>(k));
        top_k(v.data(), 1000, k, ids.data());
        std::vector<int32_t> want(1000);
        std::iota(want.begin(), want.end(), 0);
        std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
        want.resize(static_cast<size_t>(k));
        EXPECT_EQ(ids, want) << k;
    }
}

// A latent cache of `positions` rows of lora + rope floats, stored as scattered
// 128-token blocks (paged) or one buffer (contiguous), same values.
struct TestKv {
    std::vector<std::vector<float>> storage;
    std::vector<const float*> blocks;
    int64_t stride = 0;
};

TestKv make_kv(int64_t positions, int64_t row, uint32_t seed, bool paged) {
    TestKv kv;
    const auto all = random_vec(positions * row, seed);
    kv.stride = paged ? row + 3 : row;  // paged: padded rows in separate blocks
    const int64_t nb = (positions + kKvBlockTokens - 1) / kKvBlockTokens;
    if (paged) {
        for (int64_t b = 0; b < nb; ++b) {
            kv.storage.emplace_back(static_cast<size_t>(kKvBlockTokens * kv.stride), NAN);
            for (int64_t i = 0; i < kKvBlockTokens && b * kKvBlockTokens + i < positions; ++i) {
                std::copy_n(all.data() + (b * kKvBlockTokens + i) * row, row,
                            kv.storage.back().data() + i * kv.stride);
            }
        }
        // Blocks in reverse allocation order, as a pool might hand them out.
        for (int64_t b = 0; b < nb; ++b) kv.blocks.push_back(kv.storage[b].data());
    } else {
        kv.storage.push_back(all);
        for (int64_t b = 0; b < nb; ++b) {
            kv.blocks.push_back(kv.storage[0].data() + b * kKvBlockTokens * row);
        }
    }
    return kv;
}

struct AttnCase {
    int64_t lora, rope, heads, positions;
};

std::vector<float> run_mla(Isa isa, const TestKv& kv, const AttnCase& c, const float* q_lat,
                           const float* q_pe, int64_t h_begin, int64_t h_count) {
    std::vector<float> o(static_cast<size_t>(h_count * c.lora));
    MlaHeads h{h_count, q_lat + h_begin * c.lora, q_pe + h_begin * (c.rope + 2), c.rope + 2,
               o.data()};
    mla_attention(isa, {kv.blocks.data(), kv.stride}, c.positions, c.lora, c.rope, 0.3f, h);
    return o;
}

TEST(MlaAttentionTest, VariantsMatchScalarAndDouble) {
    const AttnCase cases[] = {{16, 4, 1, 1},     {37, 5, 3, 127},  {64, 8, 20, 128},
                              {33, 2, 2, 129},  {512, 64, 4, 300}, {17, 3, 17, 257}};
    for (const AttnCase& c : cases) {
        const int64_t row = c.lora + c.rope;
        const TestKv kv = make_kv(c.positions, row, 5, /*paged=*/true);
        const auto q_lat = random_vec(c.heads * c.lora, 6, -2.0f, 2.0f);
        const auto q_pe = random_vec(c.heads * (c.rope + 2), 7, -2.0f, 2.0f);
        const auto ref = run_mla(Isa::kScalar, kv, c, q_lat.data(), q_pe.data(), 0, c.heads);
        for (Isa isa : supported_isas()) {
            EXPECT_EQ(run_mla(isa, kv, c, q_lat.data(), q_pe.data(), 0, c.heads), ref)
                << isa_name(isa) << " lora " << c.lora << " positions " << c.positions;
        }
        // Plain double softmax attention.
        for (int64_t h = 0; h < c.heads; ++h) {
            std::vector<double> s(c.positions), o(c.lora, 0.0);
            double mx = -1e300, sum = 0;
            for (int64_t p = 0; p < c.positions; ++p) {
                const float* r = kv.blocks[p / kKvBlockTokens] + (p % kKvBlockTokens) * kv.stride;
                double d = 0;
                for (int64_t k = 0; k < c.lora; ++k) d += double(q_lat[h * c.lora + k]) * r[k];
                for (int64_t k = 0; k < c.rope; ++k) {
                    d += double(q_pe[h * (c.rope + 2) + k]) * r[c.lora + k];
                }
                s[p] = d * 0.3;
                mx = std::max(mx, s[p]);
            }
            for (int64_t p = 0; p < c.positions; ++p) sum += s[p] = std::exp(s[p] - mx);
            for (int64_t p = 0; p < c.positions; ++p) {
                const float* r = kv.blocks[p / kKvBlockTokens] + (p % kKvBlockTokens) * kv.stride;
                for (int64_t k = 0; k < c.lora; ++k) o[k] += s[p] / sum * r[k];
            }
            for (int64_t k = 0; k < c.lora; ++k) {
                EXPECT_NEAR(ref[h * c.lora + k], o[k], 2e-5) << h << " " << k;
            }
        }
    }
}

TEST(MlaAttentionTest, InvariantToHeadGroupingAndLayout) {
    const AttnCase c{48, 8, 21, 300};
    const TestKv paged = make_kv(c.positions, c.lora + c.rope, 9, true);
    const TestKv flat = make_kv(c.positions, c.lora + c.rope, 9, false);
    const auto q_lat = random_vec(c.heads * c.lora, 10, -3.0f, 3.0f);
    const auto q_pe = random_vec(c.heads * (c.rope + 2), 11, -3.0f, 3.0f);
    for (Isa isa : supported_isas()) {
        const auto all = run_mla(isa, paged, c, q_lat.data(), q_pe.data(), 0, c.heads);
        EXPECT_EQ(run_mla(isa, flat, c, q_lat.data(), q_pe.data(), 0, c.heads), all);
        for (int64_t h = 0; h < c.heads; h += 5) {
            const int64_t n = std::min<int64_t>(5, c.heads - h);
            const auto part = run_mla(isa, paged, c, q_lat.data(), q_pe.data(), h, n);
            EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + h * c.lora))
                << isa_name(isa) << " heads from " << h;
        }
    }
}

}  // namespace
}  // namespace dsi::kernels
