// V4's compact KV rows (model/internal/v4_kv_format.h) against the reference notes
// (deepseek_v4.md §2.2–§2.4, §4.2), computed here independently: the scale rule, the
// nearest representable value by search over every code, the byte layout.
#include "model/internal/v4_kv_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/env.h"
#include "tensor/dtype.h"

namespace dsi::internal {
namespace {

std::vector<float> values(int64_t n, uint64_t seed, float spread) {
    SplitMix64 rng(seed);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
        const double u = static_cast<double>(rng.next() >> 11) / 9007199254740992.0;  // [0, 1)
        const double w = static_cast<double>(rng.next() >> 11) / 9007199254740992.0;
        x = static_cast<float>((2 * u - 1) * std::exp2(spread * (w - 0.5)));
    }
    return v;
}

// 2^ceil(log2(x)) as a double.
double pow2_ceil(double x) { return std::exp2(std::ceil(std::log2(x))); }

// The representable value nearest to v among `grid` (ties: the one listed first
// among equals is not assumed; the even code wins, as round-to-nearest-even).
double nearest(double v, const std::vector<std::pair<double, int>>& grid) {
    double best = 0, best_d = std::numeric_limits<double>::infinity();
    int best_code = 0;
    for (const auto& [g, code] : grid) {
        const double d = std::fabs(v - g);
        if (d < best_d || (d == best_d && (code & 1) == 0 && (best_code & 1) != 0)) {
            best = g;
            best_d = d;
            best_code = code;
        }
    }
    return best;
}

std::vector<std::pair<double, int>> e4m3_grid() {
    std::vector<std::pair<double, int>> g;
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7f) == 0x7f) continue;  // NaN
        g.emplace_back(e4m3_to_f32(static_cast<uint8_t>(c)), c & 0x7f);
    }
    return g;
}

std::vector<std::pair<double, int>> e2m1_grid() {
    const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    std::vector<std::pair<double, int>> g;
    for (int c = 0; c < 8; ++c) {
        g.emplace_back(mag[c], c);
        g.emplace_back(-mag[c], c);
    }
    return g;
}

TEST(V4KvFormatTest, MainRowIs584BytesAtV4FlashShape) {
    EXPECT_EQ(v4_main_row_bytes(512, 64), 584);
    EXPECT_EQ(v4_index_row_bytes(128), 68);
    EXPECT_EQ(v4_main_row_bytes(128, 32), 164);  // tiny-v4: 96 + 64 + 2 scales, padded
}

TEST(V4KvFormatTest, MainRowMatchesTheReferenceQuantisation) {
    const auto grid = e4m3_grid();
    for (uint64_t seed = 1; seed <= 20; ++seed) {
        const int64_t dim = 512, rope = 64, nope = 448;
        std::vector<float> x = values(dim, seed, seed % 2 ? 8.0f : 30.0f);
        if (seed == 3) std::fill(x.begin(), x.begin() + 64, 0.0f);  // an all-zero group
        std::vector<uint8_t> row(584, 0xee);
        v4_main_encode(x.data(), dim, rope, row.data());
        std::vector<float> y(dim);
        v4_main_decode(row.data(), dim, rope, y.data());
        for (int64_t g = 0; g < nope / 64; ++g) {
            double amax = 0;
            for (int64_t i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(double(x[g * 64 + i])));
            const double scale = pow2_ceil(std::max(amax, 1e-4) / 448.0);
            EXPECT_EQ(row[static_cast<size_t>(nope + 2 * rope + g)],
                      static_cast<uint8_t>(std::lround(std::log2(scale)) + 127));
            for (int64_t i = 0; i < 64; ++i) {
                const double want = nearest(x[g * 64 + i] / scale, grid) * scale;
                ASSERT_EQ(y[g * 64 + i], want) << "seed " << seed << " value " << g * 64 + i;
            }
        }
        // Rope dims: bf16 bytes in place, round to nearest even.
        for (int64_t i = 0; i < rope; ++i) {
            uint16_t h;
            std::memcpy(&h, row.data() + nope + 2 * i, 2);
            EXPECT_EQ(h, f32_to_bf16(x[nope + i]));
            EXPECT_EQ(y[nope + i], bf16_to_f32(f32_to_bf16(x[nope + i])));
        }
        EXPECT_EQ(row[583], 0);  // the pad byte
        // A decoded row encodes to the same values (a stored row is a fixed point; the
        // bytes may differ: a group's amax can round down into a smaller scale).
        std::vector<uint8_t> again(584);
        v4_main_encode(y.data(), dim, rope, again.data());
        std::vector<float> y2(dim);
        v4_main_decode(again.data(), dim, rope, y2.data());
        EXPECT_EQ(y2, y);
    }
}

TEST(V4KvFormatTest, ShortLastGroupAndNonFiniteValues) {
    const auto grid = e4m3_grid();
    std::vector<float> x = values(128, 5, 6.0f);  // nope 96: groups of 64 and 32
    x[70] = 1000.0f;  // the short group's scale comes from its own values only
    std::vector<uint8_t> row(static_cast<size_t>(v4_main_row_bytes(128, 32)));
    v4_main_encode(x.data(), 128, 32, row.data());
    std::vector<float> y(128);
    v4_main_decode(row.data(), 128, 32, y.data());
    const double s1 = pow2_ceil(1000.0 / 448.0);
    for (int64_t i = 64; i < 96; ++i) EXPECT_EQ(y[i], nearest(x[i] / s1, grid) * s1) << i;
    double amax0 = 0;
    for (int64_t i = 0; i < 64; ++i) amax0 = std::max(amax0, std::fabs(double(x[i])));
    const double s0 = pow2_ceil(amax0 / 448.0);
    for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(y[i], nearest(x[i] / s0, grid) * s0) << i;

    std::vector<float> bad(512, 1.0f);
    bad[3] = std::numeric_limits<float>::quiet_NaN();
    bad[70] = std::numeric_limits<float>::infinity();
    std::vector<uint8_t> r(584);
    v4_main_encode(bad.data(), 512, 64, r.data());
    std::vector<float> z(512);
    v4_main_decode(r.data(), 512, 64, z.data());
    EXPECT_TRUE(std::isnan(z[3]));
    EXPECT_EQ(z[4], 1.0f);
    EXPECT_FALSE(std::isnan(z[70]));  // saturated: 448 times the largest scale
    EXPECT_GT(z[70], 1e30f);
}

TEST(V4KvFormatTest, IndexKeyIsMxfp4AsTheReferenceSimulates) {
    const auto grid = e2m1_grid();
    for (uint64_t seed = 1; seed <= 20; ++seed) {
        std::vector<float> x = values(128, seed + 100, 10.0f);
        std::vector<uint8_t> row(68);
        v4_index_encode(x.data(), 128, row.data());
        std::vector<float> y(128);
        v4_index_decode(row.data(), 128, y.data());
        std::vector<float> sim = x;
        v4_fp4_simulate(sim.data(), 128);
        EXPECT_EQ(sim, y);
        for (int64_t g = 0; g < 4; ++g) {
            double amax = 0;
            for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[g * 32 + i])));
            const double scale = pow2_ceil(std::max(amax, 6 * std::exp2(-126)) / 6.0);
            EXPECT_EQ(row[static_cast<size_t>(64 + g)], static_cast<uint8_t>(std::lround(std::log2(scale)) + 127));
            for (int64_t i = 0; i < 32; ++i) {
                ASSERT_EQ(y[g * 32 + i], nearest(x[g * 32 + i] / scale, grid) * scale)
                    << "seed " << seed << " value " << g * 32 + i;
            }
            // Low nibble = the even element.
            const uint8_t b = row[static_cast<size_t>(g * 16)];
            EXPECT_EQ(std::fabs(y[g * 32]) == 0.0f, (b & 0x7) == 0);
        }
    }
}

TEST(V4KvFormatTest, HadamardIsTheNormalisedSylvesterMatrix) {
    for (int64_t n : {1, 2, 32, 128}) {
        std::vector<float> x = values(n, 9, 4.0f);
        std::vector<float> y = x;
        hadamard_rotate(y.data(), n);
        double norm_x = 0, norm_y = 0;
        for (int64_t i = 0; i < n; ++i) {
            double want = 0;
            for (int64_t j = 0; j < n; ++j) {
                want += (__builtin_popcountll(static_cast<uint64_t>(i & j)) % 2 ? -1.0 : 1.0) * x[j];
            }
            want /= std::sqrt(static_cast<double>(n));
            EXPECT_NEAR(y[i], want, 1e-5 * (1 + std::fabs(want))) << n << " " << i;
            norm_x += double(x[i]) * x[i];
            norm_y += double(y[i]) * y[i];
        }
        EXPECT_NEAR(norm_y, norm_x, 1e-4 * norm_x);
    }
}

}  // namespace
}  // namespace dsi::internal
