#include "tensor/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/env.h"

namespace dsi {
namespace {

TEST(DTypeTest, Bf16RoundTripAndRounding) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
    // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
    EXPECT_EQ(f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);
    // 1 + 3*2^-8 ties to even upward.
    EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(DTypeTest, F16AllValuesRoundTrip) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        float f = f16_to_f32(static_cast<uint16_t>(h));
        if (std::isnan(f)) continue;
        EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
    }
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
    EXPECT_EQ(f16_to_f32(0x0001), 0x1.0p-24f);
}

TEST(DTypeTest, E4m3AllValuesRoundTrip) {
    for (uint32_t v = 0; v < 256; ++v) {
        float f = e4m3_to_f32(static_cast<uint8_t>(v));
        if (std::isnan(f)) continue;
        uint8_t back = f32_to_e4m3(f);
        if (v == 0x80) {  // -0
            EXPECT_EQ(back, 0x80);
            continue;
        }
        EXPECT_EQ(back, v) << v;
    }
    EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);
    EXPECT_EQ(f32_to_e4m3(-1000.0f), 0xfe);
    EXPECT_EQ(e4m3_to_f32(0x01), 0x1.0p-9f);
}

TEST(DTypeTest, E4m3RoundsToNearest) {
    SplitMix64 rng(3);
    for (int i = 0; i < 10000; ++i) {
        float x = static_cast<float>(rng.next_normal() * 50.0);
        float q = e4m3_to_f32(f32_to_e4m3(x));
        // Brute-force nearest representable value.
        float best = 0;
        float best_err = INFINITY;
        for (uint32_t v = 0; v < 256; ++v) {
            float f = e4m3_to_f32(static_cast<uint8_t>(v));
            if (std::isnan(f)) continue;
            float err = std::fabs(f - x);
            if (err < best_err) {
                best_err = err;
                best = f;
            }
        }
        EXPECT_EQ(std::fabs(q - x), std::fabs(best - x)) << x;
    }
}

TEST(DTypeTest, E8m0) {
    EXPECT_EQ(e8m0_to_f32(127), 1.0f);
    EXPECT_EQ(e8m0_to_f32(130), 8.0f);
    EXPECT_EQ(f32_to_e8m0_ceil(1.0f), 127);
    EXPECT_EQ(f32_to_e8m0_ceil(1.5f), 128);
    EXPECT_EQ(f32_to_e8m0_ceil(0.25f), 125);
    EXPECT_EQ(f32_to_e8m0_ceil(0.3f), 126);
}

TEST(DTypeTest, Q8_0QuantizeDequantize) {
    std::vector<float> x(64);
    SplitMix64 rng(5);
    for (float& v : x) v = static_cast<float>(rng.next_normal());
    std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(DType::kQ8_0, 64)));
    EXPECT_EQ(q.size(), 68u);
    quantize_row_q8_0(x.data(), q.data(), 64);
    std::vector<float> y(64);
    dequantize_row(DType::kQ8_0, q.data(), y.data(), 64);
    for (int b = 0; b < 2; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[32 * b + j]));
        for (int j = 0; j < 32; ++j) {
            EXPECT_NEAR(y[32 * b + j], x[32 * b + j], amax / 127.0f * 0.51f + 1e-3f * amax);
        }
    }
}

TEST(DTypeTest, SafetensorsNames) {
    EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
    EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kF8E4M3);
    EXPECT_FALSE(dtype_from_safetensors("F4").has_value());
    EXPECT_EQ(dtype_safetensors_name(DType::kF32), "F32");
}

}  // namespace
}  // namespace dsi
