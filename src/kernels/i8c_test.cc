// i8c (int8 per output row, W8A8) packing, activation quantiser and GEMM: every ISA
// variant (and AMX where present) bitwise equal to the scalar reference, batch
// invariance, error bounds against f32, malformed input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/internal/gemm_i8c.h"
#include "kernels/matmul.h"

namespace dsi::kernels {
namespace {

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v)
        f = nd(rng);
    return v;
}

PackedMatrix pack_f32(const std::vector<float>& w, int64_t rows, int64_t cols) {
    SourceMatrix src{DType::kF32, rows, cols, reinterpret_cast<const uint8_t*>(w.data()),
                     nullptr, 128, 128};
    auto p = pack_matrix(src, WeightFormat::kI8C);
    EXPECT_TRUE(p.is_ok()) << p.status().to_string();
    return std::move(p).value();
}

bool same_bits(const float* a, const float* b, int64_t n) {
    return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// (isa, amx) pairs this CPU runs.
struct Variant {
    Isa isa;
    bool amx;
};
std::vector<Variant> variants() {
    std::vector<Variant> out;
    for (Isa isa : supported_isas())
        out.push_back({isa, false});
    if (amx_supported())
        out.push_back({Isa::kAvx512, true});
    return out;
}
std::string variant_name(const Variant& v) {
    return std::string(isa_name(v.isa)) + (v.amx ? "+amx" : "");
}

TEST(I8cTest, ParseAndUnpack) {
    WeightFormat f;
    ASSERT_TRUE(parse_weight_format("i8c", &f));
    EXPECT_EQ(f, WeightFormat::kI8C);
    ASSERT_TRUE(parse_weight_format("w8a8", &f));
    EXPECT_EQ(f, WeightFormat::kI8C);
    EXPECT_EQ(weight_format_name(WeightFormat::kI8C), "i8c");
    // Unpacked rows are q * d with d = amax / 127 and |q| <= 127; the row's largest
    // value comes back exactly as +-127 * d.
    const int64_t rows = 19, cols = 70;
    std::vector<float> w = random_values(rows * cols, 3);
    PackedMatrix p = pack_f32(w, rows, cols);
    EXPECT_EQ(p.view().padded_cols, 128);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        unpack_row(p, r, row.data());
        float amax = 0.0f;
        for (int64_t k = 0; k < cols; ++k)
            amax = std::fmax(amax, std::fabs(w[r * cols + k]));
        const float d = amax / 127.0f;
        for (int64_t k = 0; k < cols; ++k) {
            EXPECT_LE(std::fabs(row[k] - w[r * cols + k]), 0.5f * d * 1.0001f) << r << "," << k;
        }
    }
}

TEST(I8cTest, QuantizerVariantsGiveScalarBits) {
    for (int64_t k : {1, 7, 16, 33, 64, 100, 2048, 2049}) {
        std::vector<float> x = random_values(k, static_cast<uint32_t>(k), 3.0f);
        if (k >= 7) {
            // amax = 127 makes the multiplier 1: exact halves test round-half-even.
            x[0] = 127.0f;
            x[1] = 2.5f;
            x[2] = -3.5f;
            x[3] = 0.5f;
            x[4] = -0.0f;
        }
        const int64_t kp = internal::i8c_padded_cols(k);
        std::vector<int8_t> q_ref(static_cast<size_t>(kp), 99);
        float d_ref;
        int32_t s_ref;
        quantize_act_i8c(Isa::kScalar, x.data(), k, kp, q_ref.data(), &d_ref, &s_ref);
        if (k >= 7) {
            EXPECT_EQ(q_ref[1], 2);
            EXPECT_EQ(q_ref[2], -4);
            EXPECT_EQ(q_ref[3], 0);
        }
        int32_t sum = 0;
        for (int64_t j = 0; j < kp; ++j) {
            EXPECT_LE(std::abs(q_ref[j]), 127);
            if (j >= k) {
                EXPECT_EQ(q_ref[j], 0);
            }
            sum += q_ref[j];
        }
        EXPECT_EQ(s_ref, 128 * sum);
        for (Isa isa : supported_isas()) {
            std::vector<int8_t> q(static_cast<size_t>(kp), 99);
            float d;
            int32_t s;
            quantize_act_i8c(isa, x.data(), k, kp, q.data(), &d, &s);
            EXPECT_EQ(std::memcmp(q.data(), q_ref.data(), q.size()), 0) << isa_name(isa) << k;
            EXPECT_EQ(std::memcmp(&d, &d_ref, 4), 0) << isa_name(isa) << k;
            EXPECT_EQ(s, s_ref) << isa_name(isa) << k;
        }
    }
    // An all-zero row: scale 0, codes 0.
    std::vector<float> zero(40, 0.0f);
    std::vector<int8_t> q(64, 5);
    for (Isa isa : supported_isas()) {
        float d = 1;
        int32_t s = 1;
        quantize_act_i8c(isa, zero.data(), 40, 64, q.data(), &d, &s);
        EXPECT_EQ(d, 0.0f);
        EXPECT_EQ(s, 0);
        for (int8_t v : q)
            EXPECT_EQ(v, 0);
    }
}

// Scalar reference vs the product of the quantised values in double (exact integer sum,
// one scale product): every variant bitwise equal to scalar; odd sizes and tails.
TEST(I8cTest, VariantsMatchReference) {
    const int64_t shapes[][2] = {{1, 1}, {17, 64}, {33, 100}, {100, 160}, {40, 1000}};
    const int64_t ms[] = {1, 3, 15, 16, 17, 64};
    for (const auto& sh : shapes) {
        const int64_t rows = sh[0], cols = sh[1];
        std::vector<float> w = random_values(rows * cols, static_cast<uint32_t>(rows + cols));
        PackedMatrix p = pack_f32(w, rows, cols);
        const int64_t kp = p.view().padded_cols;
        for (int64_t m : ms) {
            std::vector<float> x = random_values(m * cols, static_cast<uint32_t>(m * 31 + cols));
            std::vector<float> ref(static_cast<size_t>(m * rows));
            matmul_isa(Isa::kScalar, p, x.data(), m, ref.data(), nullptr);
            // Check the reference against the definition (gemm_i8c.h).
            std::vector<float> wrow(static_cast<size_t>(cols));
            std::vector<int8_t> q(static_cast<size_t>(kp));
            for (int64_t t = 0; t < m; ++t) {
                float d;
                int32_t s;
                quantize_act_i8c(Isa::kScalar, x.data() + t * cols, cols, kp, q.data(), &d, &s);
                for (int64_t r = 0; r < rows; ++r) {
                    unpack_row(p, r, wrow.data());
                    double exact = 0, mag = 0, f32 = 0, sum_xq = 0, sum_w = 0;
                    for (int64_t k = 0; k < cols; ++k) {
                        exact += static_cast<double>(wrow[k]) * q[k] * d;
                        mag += std::fabs(static_cast<double>(wrow[k]) * q[k] * d);
                        f32 += static_cast<double>(w[r * cols + k]) * x[t * cols + k];
                        sum_xq += std::fabs(static_cast<double>(q[k]) * d);
                        sum_w += std::fabs(static_cast<double>(w[r * cols + k]));
                    }
                    const float got = ref[t * rows + r];
                    ASSERT_LE(std::fabs(got - exact), 4e-7 * mag + 1e-30)
                        << rows << "x" << cols << " m " << m << " t " << t << " r " << r;
                    // Error vs the f32 product (the stated bound): each factor is within
                    // half a step of its value (|w' - w| <= d_w / 2, |x' - x| <= d_x / 2),
                    // and w'x' - wx = (w' - w) x' + w (x' - x), so
                    // |y - sum wx| <= d_w/2 sum|x'| + d_x/2 sum|w| + the rounding above
                    // (1e-5 relative slack: w * (127/amax) is itself rounded in f32).
                    const double d_w = p.view().scales[r];
                    ASSERT_LE(std::fabs(got - f32),
                              (0.5 * d_w * sum_xq + 0.5 * d * sum_w) * (1 + 1e-5) + 4e-7 * mag +
                                  1e-30)
                        << rows << "x" << cols << " m " << m;
                }
            }
            for (const Variant& v : variants()) {
                std::vector<float> y(static_cast<size_t>(m * rows), -1.0f);
                matmul_isa(v.isa, p, x.data(), m, y.data(), nullptr, v.amx);
                EXPECT_TRUE(same_bits(y.data(), ref.data(), m * rows))
                    << variant_name(v) << " " << rows << "x" << cols << " m " << m;
            }
        }
    }
}

// Row t is bitwise the same for m = 1, 3, 16, 64 and 1 or 2 threads, per variant
// (shapes with a partial last group, K not a multiple of 64, and an odd group count).
TEST(I8cTest, BatchInvariant) {
    const int64_t rows = 90, cols = 200, kMaxM = 64;
    std::vector<float> w = random_values(rows * cols, 5);
    PackedMatrix p = pack_f32(w, rows, cols);
    std::vector<float> x = random_values(kMaxM * cols, 6);
    std::vector<float> ref(static_cast<size_t>(kMaxM * rows));
    matmul_isa(Isa::kScalar, p, x.data(), kMaxM, ref.data(), nullptr);
    ThreadPool pool(2);
    for (const Variant& v : variants()) {
        for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
            for (int64_t m : {1, 3, 16, 64}) {
                // Rows [off, off + m) of the batch: row t must not see its neighbours.
                const int64_t off = m == kMaxM ? 0 : 7 % (kMaxM - m + 1);
                std::vector<float> y(static_cast<size_t>(m * rows));
                matmul_isa(v.isa, p, x.data() + off * cols, m, y.data(), tp, v.amx);
                EXPECT_TRUE(same_bits(y.data(), ref.data() + off * rows, m * rows))
                    << variant_name(v) << " m " << m << " threads " << (tp ? 2 : 1);
            }
        }
    }
}

TEST(I8cTest, MalformedInput) {
    // cols over the int32-exact bound.
    const int64_t cols = internal::kI8cMaxCols + 1;
    std::vector<float> w(static_cast<size_t>(cols), 1.0f);
    SourceMatrix src{DType::kF32, 1, cols, reinterpret_cast<const uint8_t*>(w.data()), nullptr,
                     128, 128};
    auto p = pack_matrix(src, WeightFormat::kI8C);
    ASSERT_FALSE(p.is_ok());
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    WeightFormat f;
    EXPECT_FALSE(parse_weight_format("i8", &f));
    EXPECT_FALSE(parse_weight_format("I8C", &f));
    // Extreme but finite values keep |q| <= 127 and the products finite.
    std::vector<float> big = {3e38f, -3e38f, 1e-38f, 0.0f};
    PackedMatrix pb = pack_f32(big, 1, 4);
    std::vector<float> x = {1.0f, 1.0f, 1.0f, 1.0f};
    float y = 0;
    for (const Variant& v : variants()) {
        matmul_isa(v.isa, pb, x.data(), 1, &y, nullptr, v.amx);
        EXPECT_EQ(y, 0.0f) << variant_name(v);  // 127 - 127 + 0 + 0
    }
}

}  // namespace
}  // namespace dsi::kernels
