// MXFP4 (S-ENG-9): the llama.cpp-compatible quantiser, the packed layout, the
// matmul variants against the scalar reference and a float64 product, batch
// invariance, and malformed input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/matmul.h"

namespace dsi::kernels {
namespace {

constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v)
        x = nd(rng);
    return v;
}

bool same_bits(const float* a, const float* b, int64_t n) {
    return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// GGUF MXFP4 rows quantised from random values (a few blocks with extreme
// scales), as stored in a file.
std::vector<uint8_t> mxfp4_rows(int64_t rows, int64_t cols, uint32_t seed) {
    std::vector<float> v = random_values(rows * cols, seed);
    // Blocks spanning the exponent range, subnormal scales (e = 0, 1) included.
    const float scales[] = {0x1p-127f, 0x1p-126f, 0x1p-120f, 1e-3f, 1e3f, 0x1p120f};
    for (int64_t b = 0; b < rows * cols / 32; b += 5) {
        for (int j = 0; j < 32; ++j)
            v[b * 32 + j] *= scales[b % 6];
    }
    std::vector<uint8_t> out(static_cast<size_t>(rows * dtype_row_bytes(DType::kMXFP4, cols)));
    quantize_row_mxfp4(v.data(), out.data(), rows * cols);
    return out;
}

TEST(Mxfp4Test, QuantiserFollowsGgmlReference) {
    // Block 0: amax 6 -> e = floor(log2 6) - 2 + 127 = 127, step 2^-1 per doubled
    // code, so every e2m1 value times 1 is exact.
    std::vector<float> x(64, 0.0f);
    for (int j = 0; j < 8; ++j) {
        x[j] = kE2m1[j];
        x[8 + j] = -kE2m1[j];
    }
    // Ties go to the lower code: 2.5 (between 2 and 3) -> 2, -2.5 -> -2; 5 (between
    // 4 and 6) -> 4. Beyond 6 saturates at 6 (the block max is 6 here).
    x[16] = 2.5f;
    x[17] = -2.5f;
    x[18] = 5.0f;
    x[19] = 0.2f;  // nearer 0 than 0.5
    x[20] = 0.3f;  // nearer 0.5
    // Block 1: amax 7.9 -> e = 127 too: values above 6 saturate to 6.
    x[32] = 7.9f;
    x[33] = -7.0f;
    x[34] = 0x1p-149f;
    std::vector<uint8_t> q(34);
    quantize_row_mxfp4(x.data(), q.data(), 64);
    EXPECT_EQ(q[0], 127);
    EXPECT_EQ(q[17], 127);
    std::vector<float> y(64);
    dequantize_row(DType::kMXFP4, q.data(), y.data(), 64);
    for (int j = 0; j < 16; ++j)
        EXPECT_EQ(y[j], x[j]) << j;
    EXPECT_EQ(y[16], 2.0f);
    EXPECT_EQ(y[17], -2.0f);
    EXPECT_EQ(y[18], 4.0f);
    EXPECT_EQ(y[19], 0.0f);
    EXPECT_EQ(y[20], 0.5f);
    EXPECT_EQ(y[32], 6.0f);
    EXPECT_EQ(y[33], -6.0f);
    EXPECT_EQ(y[34], 0.0f);
    // Element j and j + 16 share byte 1 + j (low, high nibble).
    EXPECT_EQ(q[1 + 2] & 0x0f, 2);  // x[2] = 1.0: doubled value 2 is code 2
    EXPECT_EQ(q[1 + 2] >> 4, 6);    // x[18] -> 4.0: doubled value 8 is code 6
}

// The quantiser's error: within half a step of the block grid, or saturated at
// 1.5 * 2^floor(log2 amax) (the OCP MX scale choice).
TEST(Mxfp4Test, QuantiserErrorBound) {
    std::vector<float> x = random_values(32 * 200, 4);
    for (int64_t b = 0; b < 200; ++b) {
        for (int j = 0; j < 32; ++j)
            x[b * 32 + j] *= std::ldexp(1.0f, static_cast<int>(b % 40) - 20);
    }
    std::vector<uint8_t> q(200 * 17);
    quantize_row_mxfp4(x.data(), q.data(), 32 * 200);
    std::vector<float> y(x.size());
    dequantize_row(DType::kMXFP4, q.data(), y.data(), 32 * 200);
    for (int64_t b = 0; b < 200; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j)
            amax = std::max(amax, std::fabs(x[b * 32 + j]));
        const float unit = std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(amax))) - 2);
        const float top = 6.0f * unit;
        for (int j = 0; j < 32; ++j) {
            const float xv = x[b * 32 + j], yv = y[b * 32 + j];
            const float a = std::fabs(xv);
            if (a > top) {
                EXPECT_EQ(yv, std::copysign(top, xv));
                continue;
            }
            // Grid spacing at |x|: 0.5 unit below 2 units, then 1, then 2 units.
            const float step = a < 2 * unit ? 0.5f * unit : a < 4 * unit ? unit : 2 * unit;
            EXPECT_LE(std::fabs(xv - yv), 0.5f * step) << "block " << b << " j " << j;
        }
    }
}

TEST(Mxfp4Test, ParseFormatName) {
    WeightFormat f;
    ASSERT_TRUE(parse_weight_format("mxfp4", &f));
    EXPECT_EQ(f, WeightFormat::kMXFP4);
    EXPECT_EQ(weight_format_name(f), "mxfp4");
    EXPECT_EQ(native_weight_format(DType::kMXFP4), WeightFormat::kMXFP4);
}

// A GGUF MXFP4 source repacks exactly; a float source packs to exactly its
// reference quantisation.
TEST(Mxfp4Test, PackIsExact) {
    const int64_t rows = 37, cols = 160;
    std::vector<uint8_t> bytes = mxfp4_rows(rows, cols, 1);
    SourceMatrix src{DType::kMXFP4, rows, cols, bytes.data()};
    auto p = pack_matrix(src, WeightFormat::kMXFP4);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(p->bytes(), 3 * (cols / 32) * (16 + 256));  // 3 groups of 16 rows
    std::vector<float> want(cols), got(cols);
    for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(DType::kMXFP4, bytes.data() + r * (cols / 32) * 17, want.data(), cols);
        unpack_row(*p, r, got.data());
        EXPECT_TRUE(same_bits(got.data(), want.data(), cols)) << "row " << r;
    }
    std::vector<float> f = random_values(rows * cols, 2);
    SourceMatrix fsrc{DType::kF32, rows, cols, reinterpret_cast<const uint8_t*>(f.data())};
    auto pf = pack_matrix(fsrc, WeightFormat::kMXFP4);
    ASSERT_TRUE(pf.is_ok());
    std::vector<uint8_t> q(static_cast<size_t>(cols / 32 * 17));
    for (int64_t r = 0; r < rows; ++r) {
        quantize_row_mxfp4(f.data() + r * cols, q.data(), cols);
        dequantize_row(DType::kMXFP4, q.data(), want.data(), cols);
        unpack_row(*pf, r, got.data());
        EXPECT_TRUE(same_bits(got.data(), want.data(), cols)) << "row " << r;
    }
}

TEST(Mxfp4Test, MalformedInputRejected) {
    std::vector<float> f = random_values(4 * 48, 3);
    SourceMatrix odd{DType::kF32, 4, 48, reinterpret_cast<const uint8_t*>(f.data())};
    auto p = pack_matrix(odd, WeightFormat::kMXFP4);
    ASSERT_FALSE(p.is_ok());
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);

    std::vector<uint8_t> bytes = mxfp4_rows(3, 64, 5);
    bytes[17 * 3] = 0xff;  // row 1, block 1: the NaN scale
    SourceMatrix nan_scale{DType::kMXFP4, 3, 64, bytes.data()};
    auto q = pack_matrix(nan_scale, WeightFormat::kMXFP4);
    ASSERT_FALSE(q.is_ok());
    EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
    // The reference dequantiser reads 0xff as NaN (OCP MX).
    std::vector<float> row(64);
    dequantize_row(DType::kMXFP4, bytes.data() + 34, row.data(), 64);
    EXPECT_TRUE(std::isnan(row[40]));

    // Non-finite and tiny inputs quantise without undefined behaviour: scale
    // byte clamped to [0, 254].
    std::vector<float> x(96, 1e-39f);
    x[32] = INFINITY;
    x[64] = NAN;
    std::vector<uint8_t> out(3 * 17);
    quantize_row_mxfp4(x.data(), out.data(), 96);
    EXPECT_EQ(out[0], 0);
    EXPECT_EQ(out[17], 254);
    EXPECT_LE(out[34], 254);
}

// Scalar vs a float64 product of the packed weights and the Q8_0-rounded
// activations; every ISA vs scalar, bitwise; odd sizes and tails.
TEST(Mxfp4Test, VariantsMatchReference) {
    const int64_t shapes[][2] = {{1, 32}, {17, 64}, {64, 288}, {100, 160}, {33, 1024}};
    for (const auto& sh : shapes) {
        const int64_t rows = sh[0], cols = sh[1];
        std::vector<uint8_t> bytes = mxfp4_rows(rows, cols, static_cast<uint32_t>(rows + cols));
        SourceMatrix src{DType::kMXFP4, rows, cols, bytes.data()};
        auto p = pack_matrix(src, WeightFormat::kMXFP4);
        ASSERT_TRUE(p.is_ok());
        for (int64_t m : {1, 2, 5, 7}) {
            std::vector<float> x = random_values(m * cols, 99);
            std::vector<float> ref(static_cast<size_t>(m * rows));
            matmul_isa(Isa::kScalar, *p, x.data(), m, ref.data(), nullptr);
            std::vector<int8_t> q(static_cast<size_t>(cols));
            std::vector<float> d(static_cast<size_t>(cols / 32));
            std::vector<int32_t> s(static_cast<size_t>(cols / 32));
            std::vector<float> wrow(static_cast<size_t>(cols));
            for (int64_t t = 0; t < m; ++t) {
                quantize_act_q8(x.data() + t * cols, cols, q.data(), d.data(), s.data());
                for (int64_t r = 0; r < rows; ++r) {
                    unpack_row(*p, r, wrow.data());
                    double exact = 0, mag = 0;
                    for (int64_t k = 0; k < cols; ++k) {
                        const double term = static_cast<double>(wrow[k]) * q[k] * d[k / 32];
                        exact += term;
                        mag += std::fabs(term);
                    }
                    // Only f32 rounding of the per-block products and the sum.
                    ASSERT_NEAR(ref[t * rows + r], exact, 1e-6 * mag + 1e-30)
                        << rows << "x" << cols << " r " << r << " t " << t;
                }
            }
            for (Isa isa : supported_isas()) {
                std::vector<float> y(ref.size(), -1.0f);
                matmul_isa(isa, *p, x.data(), m, y.data(), nullptr);
                EXPECT_TRUE(same_bits(y.data(), ref.data(), m * rows))
                    << isa_name(isa) << " " << rows << "x" << cols << " m " << m;
            }
        }
    }
}

// Row t of Y is bitwise the same for M = 1, 3, 16, 64 and 1 or 2 threads.
TEST(Mxfp4Test, BatchInvariant) {
    const int64_t rows = 200, cols = 256;
    std::vector<float> f = random_values(rows * cols, 5, 0.05f);
    SourceMatrix src{DType::kF32, rows, cols, reinterpret_cast<const uint8_t*>(f.data())};
    auto p = pack_matrix(src, WeightFormat::kMXFP4);
    ASSERT_TRUE(p.is_ok());
    std::vector<float> x = random_values(64 * cols, 11);
    ThreadPool pool2(2);
    for (Isa isa : supported_isas()) {
        std::vector<float> alone(64 * rows);
        for (int64_t t = 0; t < 64; ++t)
            matmul_isa(isa, *p, x.data() + t * cols, 1, alone.data() + t * rows, nullptr);
        for (int64_t m : {1, 3, 16, 64}) {
            for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
                std::vector<float> y(static_cast<size_t>(m * rows));
                matmul_isa(isa, *p, x.data() + (64 - m) * cols, m, y.data(), pool);
                EXPECT_TRUE(same_bits(y.data(), alone.data() + (64 - m) * rows, m * rows))
                    << isa_name(isa) << " m " << m << " threads " << (pool ? 2 : 1);
            }
        }
    }
}

}  // namespace
}  // namespace dsi::kernels
