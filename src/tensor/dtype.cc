#include "tensor/dtype.h"

#include <cmath>

#include "base/check.h"

namespace dsi {
namespace {

// e2m1 values doubled (ggml's kvalues_mxfp4): code = sign bit + 3 magnitude bits.
constexpr float kMxfp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// ggml's best_index_mxfp4: the code whose value is nearest to x, the lowest code
// on ties (so +0 before -0 and the smaller magnitude between two neighbours).
uint8_t nearest_mxfp4_code(float x, float d) {
    int best = 0;
    float best_err = std::fabs(kMxfp4Doubled[0] * d - x);
    for (int i = 1; i < 16; ++i) {
        const float err = std::fabs(kMxfp4Doubled[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return static_cast<uint8_t>(best);
}

}  // namespace

std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::kF32: return "f32";
        case DType::kF16: return "f16";
        case DType::kBF16: return "bf16";
        case DType::kF8E4M3: return "f8_e4m3";
        case DType::kE8M0: return "e8m0";
        case DType::kI8: return "i8";
        case DType::kI32: return "i32";
        case DType::kI64: return "i64";
        case DType::kQ8_0: return "q8_0";
        case DType::kMXFP4: return "mxfp4";
    }
    return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view n) {
    if (n == "F32") return DType::kF32;
    if (n == "F16") return DType::kF16;
    if (n == "BF16") return DType::kBF16;
    if (n == "F8_E4M3") return DType::kF8E4M3;
    if (n == "F8_E8M0") return DType::kE8M0;
    if (n == "I8") return DType::kI8;
    if (n == "I32") return DType::kI32;
    if (n == "I64") return DType::kI64;
    return std::nullopt;
}

std::string_view dtype_safetensors_name(DType t) {
    switch (t) {
        case DType::kF32: return "F32";
        case DType::kF16: return "F16";
        case DType::kBF16: return "BF16";
        case DType::kF8E4M3: return "F8_E4M3";
        case DType::kE8M0: return "F8_E8M0";
        case DType::kI8: return "I8";
        case DType::kI32: return "I32";
        case DType::kI64: return "I64";
        case DType::kQ8_0:
        case DType::kMXFP4: return "";
    }
    return "";
}

int64_t dtype_block_elems(DType t) { return t == DType::kQ8_0 || t == DType::kMXFP4 ? 32 : 1; }

int64_t dtype_block_bytes(DType t) {
    switch (t) {
        case DType::kF32: return 4;
        case DType::kF16: return 2;
        case DType::kBF16: return 2;
        case DType::kF8E4M3: return 1;
        case DType::kE8M0: return 1;
        case DType::kI8: return 1;
        case DType::kI32: return 4;
        case DType::kI64: return 8;
        case DType::kQ8_0: return 34;
        case DType::kMXFP4: return 17;
    }
    return 0;
}

int64_t dtype_row_bytes(DType t, int64_t n) {
    int64_t be = dtype_block_elems(t);
    DSI_CHECK(n % be == 0, "row of ", n, " elements is not a multiple of ", be);
    return n / be * dtype_block_bytes(t);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return bits_to_f32(sign);
        // Subnormal: value = mant * 2^-24.
        float v = static_cast<float>(mant) * 0x1.0p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
    return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
    uint32_t b = f32_to_bits(f);
    uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
    uint32_t abs = b & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
    if (abs < 0x38800000u) {
        // Result is subnormal or zero: value / 2^-24 rounded to nearest even.
        float a = bits_to_f32(abs);
        float q = std::nearbyint(a * 0x1.0p24f);  // default rounding mode: nearest even
        return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
    }
    uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
    uint32_t r = abs + rounding;
    return static_cast<uint16_t>(sign | (((r >> 23) - 112) << 10) | ((r >> 13) & 0x3ffu));
}

float e4m3_to_f32(uint8_t v) {
    uint32_t sign = v & 0x80u;
    uint32_t exp = (v >> 3) & 0xfu;
    uint32_t mant = v & 0x7u;
    float out;
    if (exp == 0xf && mant == 0x7) {
        out = std::nanf("");
    } else if (exp == 0) {
        out = static_cast<float>(mant) * 0x1.0p-9f;  // subnormal: mant/8 * 2^-6
    } else {
        out = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, static_cast<int>(exp) - 7);
    }
    return sign ? -out : out;
}

uint8_t f32_to_e4m3(float f) {
    if (std::isnan(f)) return 0x7f;
    uint8_t sign = std::signbit(f) ? 0x80 : 0;
    float a = std::fabs(f);
    if (a >= 448.0f) return sign | 0x7e;  // saturate to max finite
    // Find the exponent; e4m3 normal range is [2^-6, 448], subnormal step 2^-9.
    int e;
    std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    int unbiased = e - 1;
    if (unbiased < -6) unbiased = -6;  // subnormal region uses the 2^-6 binade's step
    float step = std::ldexp(1.0f, unbiased - 3);
    float q = std::nearbyint(a / step);  // nearest even
    float rounded = q * step;
    if (rounded >= 464.0f) return sign | 0x7e;
    // Re-encode the rounded value (it may have moved up one binade).
    if (rounded == 0.0f) return sign;
    int e2;
    std::frexp(rounded, &e2);
    int ub = e2 - 1;
    if (ub < -6) {
        uint32_t mant = static_cast<uint32_t>(rounded / 0x1.0p-9f);
        return static_cast<uint8_t>(sign | mant);
    }
    if (ub > 8) return sign | 0x7e;
    uint32_t mant = static_cast<uint32_t>((rounded / std::ldexp(1.0f, ub) - 1.0f) * 8.0f);
    uint32_t code = (static_cast<uint32_t>(ub + 7) << 3) | mant;
    if (code >= 0x7f) code = 0x7e;
    return static_cast<uint8_t>(sign | code);
}

uint8_t f32_to_e8m0_ceil(float x) {
    DSI_CHECK(x > 0 && std::isfinite(x), "e8m0 scale must be positive and finite: ", x);
    int e;
    float m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
    int exp2 = (m == 0.5f) ? e - 1 : e;  // ceil(log2(x))
    int biased = exp2 + 127;
    if (biased < 0) biased = 0;
    if (biased > 254) biased = 254;
    return static_cast<uint8_t>(biased);
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(src);
    switch (t) {
        case DType::kF32:
            std::memcpy(dst, p, static_cast<size_t>(n) * 4);
            return;
        case DType::kF16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                dst[i] = f16_to_f32(h);
            }
            return;
        case DType::kBF16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                dst[i] = bf16_to_f32(h);
            }
            return;
        case DType::kF8E4M3:
            for (int64_t i = 0; i < n; ++i) dst[i] = e4m3_to_f32(p[i]);
            return;
        case DType::kE8M0:
            for (int64_t i = 0; i < n; ++i) dst[i] = e8m0_to_f32(p[i]);
            return;
        case DType::kI8:
            for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(p[i]));
            return;
        case DType::kQ8_0: {
            DSI_CHECK(n % 32 == 0, "Q8_0 row length ", n);
            for (int64_t b = 0; b < n / 32; ++b) {
                const uint8_t* blk = p + 34 * b;
                uint16_t h;
                std::memcpy(&h, blk, 2);
                float d = f16_to_f32(h);
                for (int j = 0; j < 32; ++j) {
                    dst[32 * b + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
                }
            }
            return;
        }
        case DType::kMXFP4: {
            DSI_CHECK(n % 32 == 0, "MXFP4 row length ", n);
            for (int64_t b = 0; b < n / 32; ++b) {
                const uint8_t* blk = p + 17 * b;
                // Code values are e2m1 doubled, so the scale is 2^(e - 128).
                const float d = blk[0] == 0xff ? std::nanf("") : std::ldexp(1.0f, blk[0] - 128);
                for (int j = 0; j < 16; ++j) {
                    dst[32 * b + j] = d * kMxfp4Doubled[blk[1 + j] & 0x0f];
                    dst[32 * b + 16 + j] = d * kMxfp4Doubled[blk[1 + j] >> 4];
                }
            }
            return;
        }
        case DType::kI32:
        case DType::kI64:
            break;
    }
    DSI_CHECK(false, "cannot dequantize dtype ", dtype_name(t));
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
    DSI_CHECK(n % 32 == 0, "Q8_0 row length ", n);
    uint8_t* out = static_cast<uint8_t*>(dst);
    for (int64_t b = 0; b < n / 32; ++b) {
        const float* x = src + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = f32_to_f16(d);
        std::memcpy(out + 34 * b, &dh, 2);
        for (int j = 0; j < 32; ++j) {
            out[34 * b + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * id)));
        }
    }
}

void quantize_row_mxfp4(const float* src, void* dst, int64_t n) {
    DSI_CHECK(n % 32 == 0, "MXFP4 row length ", n);
    uint8_t* out = static_cast<uint8_t*>(dst);
    for (int64_t b = 0; b < n / 32; ++b) {
        const float* x = src + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) {
            if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
        }
        // quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127 (the largest e2m1
        // magnitude is 6 = 1.5 * 2^2), computed in float as the reference does.
        float ef = amax > 0.0f ? std::floor(std::log2(amax)) - 2.0f + 127.0f : 0.0f;
        if (!(ef >= 0.0f)) ef = ef < 0.0f ? 0.0f : 254.0f;  // tiny or NaN
        if (ef > 254.0f) ef = 254.0f;                        // inf
        const uint8_t e = static_cast<uint8_t>(ef);
        const float d = std::ldexp(1.0f, e - 128);  // GGML_E8M0_TO_FP32_HALF
        uint8_t* blk = out + 17 * b;
        blk[0] = e;
        for (int j = 0; j < 16; ++j) {
            blk[1 + j] = static_cast<uint8_t>(nearest_mxfp4_code(x[j], d) |
                                              (nearest_mxfp4_code(x[16 + j], d) << 4));
        }
    }
}

}  // namespace dsi
