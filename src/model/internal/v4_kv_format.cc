#include "model/internal/v4_kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "tensor/dtype.h"

namespace dsi::internal {
namespace {

constexpr int64_t kFp8Group = 64;
constexpr int64_t kFp4Group = 32;
constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// The largest finite |x| of the group (NaN ignored, infinities as the largest float).
float group_amax(const float* x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float a = std::fabs(x[i]);
        if (a > m) m = a;  // false for NaN
    }
    return std::min(m, std::numeric_limits<float>::max());
}

int64_t round_up4(int64_t n) { return (n + 3) / 4 * 4; }
int64_t fp8_groups(int64_t nope) { return (nope + kFp8Group - 1) / kFp8Group; }

uint8_t e2m1_code(float v) {
    if (std::isnan(v)) return 0;
    const uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
    const float a = std::min(std::fabs(v), kE2m1Max);
    uint8_t best = 0;
    float best_d = std::numeric_limits<float>::infinity();
    for (uint8_t c = 0; c < 8; ++c) {
        const float d = std::fabs(a - kE2m1[c]);
        if (d < best_d || (d == best_d && (c & 1) == 0)) {
            best = c;
            best_d = d;
        }
    }
    return static_cast<uint8_t>(sign | best);
}

float e2m1_value(uint8_t code) {
    const float v = kE2m1[code & 0x7];
    return (code & 0x8) ? -v : v;
}

// n e2m1 codes of x * inv, two per byte (low nibble = even element), and back.
void encode_e2m1_pairs(const float* x, int64_t n, float inv, uint8_t* dst) {
    for (int64_t i = 0; i < n; i += 2) {
        const uint8_t lo = e2m1_code(x[i] * inv), hi = e2m1_code(x[i + 1] * inv);
        dst[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
}
void decode_e2m1_pairs(const uint8_t* src, int64_t n, float scale, float* y) {
    for (int64_t i = 0; i < n; i += 2) {
        const uint8_t b = src[i / 2];
        y[i] = e2m1_value(b & 0xf) * scale;
        y[i + 1] = e2m1_value(b >> 4) * scale;
    }
}

}  // namespace

int64_t v4_main_row_bytes(int64_t dim, int64_t rope) {
    DSI_CHECK(rope >= 0 && dim >= rope, "V4 KV row: dim ", dim, ", rope ", rope);
    const int64_t nope = dim - rope;
    return round_up4(nope + 2 * rope + fp8_groups(nope));
}

void v4_main_encode(const float* x, int64_t dim, int64_t rope, uint8_t* dst) {
    const int64_t nope = dim - rope;
    uint8_t* scales = dst + nope + 2 * rope;
    for (int64_t g = 0; g < fp8_groups(nope); ++g) {
        const float* v = x + g * kFp8Group;
        const int64_t len = std::min(kFp8Group, nope - g * kFp8Group);
        const uint8_t e = f32_to_e8m0_ceil(std::max(group_amax(v, len), 1e-4f) / kE4m3Max);
        const float inv = 1.0f / e8m0_to_f32(e);  // a power of two: exact
        for (int64_t i = 0; i < len; ++i) {
            const float q = v[i] * inv;  // infinities saturate (NaN passes the clamp)
            dst[g * kFp8Group + i] =
                f32_to_e4m3(std::isnan(q) ? q : std::clamp(q, -kE4m3Max, kE4m3Max));
        }
        scales[g] = e;
    }
    for (int64_t i = 0; i < rope; ++i) {
        const uint16_t h = f32_to_bf16(x[nope + i]);
        std::memcpy(dst + nope + 2 * i, &h, sizeof h);
    }
    const int64_t used = nope + 2 * rope + fp8_groups(nope);
    std::fill(dst + used, dst + v4_main_row_bytes(dim, rope), uint8_t{0});
}

void v4_main_decode(const uint8_t* src, int64_t dim, int64_t rope, float* y) {
    const int64_t nope = dim - rope;
    const uint8_t* scales = src + nope + 2 * rope;
    for (int64_t g = 0; g < fp8_groups(nope); ++g) {
        const float s = e8m0_to_f32(scales[g]);
        const int64_t len = std::min(kFp8Group, nope - g * kFp8Group);
        for (int64_t i = 0; i < len; ++i) {
            y[g * kFp8Group + i] = e4m3_to_f32(src[g * kFp8Group + i]) * s;
        }
    }
    for (int64_t i = 0; i < rope; ++i) {
        uint16_t h;
        std::memcpy(&h, src + nope + 2 * i, sizeof h);
        y[nope + i] = bf16_to_f32(h);
    }
}

int64_t v4_index_row_bytes(int64_t dim) {
    DSI_CHECK(dim > 0 && dim % kFp4Group == 0, "V4 indexer key row: dim ", dim);
    return dim / 2 + dim / kFp4Group;
}

void v4_index_encode(const float* x, int64_t dim, uint8_t* dst) {
    uint8_t* scales = dst + dim / 2;
    for (int64_t g = 0; g < dim / kFp4Group; ++g) {
        const float* v = x + g * kFp4Group;
        const float floor = kE2m1Max * 0x1.0p-126f;
        const uint8_t e = f32_to_e8m0_ceil(std::max(group_amax(v, kFp4Group), floor) / kE2m1Max);
        const float inv = 1.0f / e8m0_to_f32(e);
        encode_e2m1_pairs(v, kFp4Group, inv, dst + g * kFp4Group / 2);
        scales[g] = e;
    }
}

void v4_index_decode(const uint8_t* src, int64_t dim, float* y) {
    const uint8_t* scales = src + dim / 2;
    for (int64_t g = 0; g < dim / kFp4Group; ++g) {
        const float s = e8m0_to_f32(scales[g]);
        decode_e2m1_pairs(src + g * kFp4Group / 2, kFp4Group, s, y + g * kFp4Group);
    }
}

void v4_fp4_simulate(float* x, int64_t dim) {
    uint8_t row[kFp4Group / 2 + 1];
    for (int64_t g = 0; g < dim / kFp4Group; ++g) {
        v4_index_encode(x + g * kFp4Group, kFp4Group, row);
        v4_index_decode(row, kFp4Group, x + g * kFp4Group);
    }
}

// ---- V4.1 ----

namespace {
constexpr int64_t kNvfp4Group = 16;
constexpr int64_t kMxfp8Group = 32;
}  // namespace

int64_t v41_main_row_bytes(int64_t dim) {
    DSI_CHECK(dim > 0 && dim % kNvfp4Group == 0, "V4.1 main KV row: dim ", dim);
    return dim / 2 + dim / kNvfp4Group;
}

void v41_main_encode(const float* x, int64_t dim, uint8_t* dst) {
    uint8_t* scales = dst + dim / 2;
    for (int64_t g = 0; g < dim / kNvfp4Group; ++g) {
        const float* v = x + g * kNvfp4Group;
        const uint8_t e = f32_to_e4m3(std::min(group_amax(v, kNvfp4Group) / kE2m1Max, kE4m3Max));
        const float s = e4m3_to_f32(e);
        const float inv = s > 0.0f ? 1.0f / s : 0.0f;
        encode_e2m1_pairs(v, kNvfp4Group, inv, dst + g * kNvfp4Group / 2);
        scales[g] = e;
    }
}

void v41_main_decode(const uint8_t* src, int64_t dim, float* y) {
    const uint8_t* scales = src + dim / 2;
    for (int64_t g = 0; g < dim / kNvfp4Group; ++g) {
        const float s = e4m3_to_f32(scales[g]);
        decode_e2m1_pairs(src + g * kNvfp4Group / 2, kNvfp4Group, s, y + g * kNvfp4Group);
    }
}

int64_t v41_swa_row_bytes(int64_t dim) {
    DSI_CHECK(dim > 0 && dim % kMxfp8Group == 0, "V4.1 window row: dim ", dim);
    return dim + dim / kMxfp8Group;
}

void v41_swa_encode(const float* x, int64_t dim, uint8_t* dst) {
    uint8_t* scales = dst + dim;
    for (int64_t g = 0; g < dim / kMxfp8Group; ++g) {
        const float* v = x + g * kMxfp8Group;
        const uint8_t e = f32_to_e8m0_ceil(std::max(group_amax(v, kMxfp8Group), 1e-4f) / kE4m3Max);
        const float inv = 1.0f / e8m0_to_f32(e);  // a power of two: exact
        for (int64_t i = 0; i < kMxfp8Group; ++i) {
            const float q = v[i] * inv;
            dst[g * kMxfp8Group + i] =
                f32_to_e4m3(std::isnan(q) ? q : std::clamp(q, -kE4m3Max, kE4m3Max));
        }
        scales[g] = e;
    }
}

void v41_swa_decode(const uint8_t* src, int64_t dim, float* y) {
    const uint8_t* scales = src + dim;
    for (int64_t g = 0; g < dim / kMxfp8Group; ++g) {
        const float s = e8m0_to_f32(scales[g]);
        for (int64_t i = 0; i < kMxfp8Group; ++i)
            y[g * kMxfp8Group + i] = e4m3_to_f32(src[g * kMxfp8Group + i]) * s;
    }
}

void hadamard_rotate(float* x, int64_t n) {
    DSI_CHECK(n > 0 && (n & (n - 1)) == 0, "Hadamard size must be a power of two: ", n);
    for (int64_t h = 1; h < n; h *= 2) {
        for (int64_t i = 0; i < n; i += 2 * h) {
            for (int64_t j = i; j < i + h; ++j) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
    const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace dsi::internal
