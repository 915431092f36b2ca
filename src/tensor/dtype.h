// Element types of weights, activations and KV, and exact scalar conversions.
//
// Conversions round to nearest even and are the reference every vectorised kernel
// is tested against. Block types (Q8_0) describe a run of elements; use
// dtype_row_bytes() for sizes. Thread model: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace dsi {

enum class DType : uint8_t {
    kF32,
    kF16,
    kBF16,
    kF8E4M3,  // float8_e4m3fn: max 448, no inf, NaN = 0x7f/0xff
    kE8M0,    // ue8m0: 2^(e-127), 0xff = NaN (power-of-two scales)
    kI8,
    kI32,
    kI64,
    kQ8_0,    // GGUF block: f16 scale + 32 x int8 (34 bytes per 32 elements)
    kMXFP4,   // GGUF/OCP MX block: e8m0 scale + 16 bytes of e2m1 pairs (17 bytes per 32)
};

std::string_view dtype_name(DType t);
// Names used by safetensors headers ("F32", "BF16", "F8_E4M3", ...).
std::optional<DType> dtype_from_safetensors(std::string_view name);
std::string_view dtype_safetensors_name(DType t);

// Elements per block (1 for scalar types, 32 for Q8_0 and MXFP4) and bytes per block.
int64_t dtype_block_elems(DType t);
int64_t dtype_block_bytes(DType t);
// Bytes of `n` elements; n must be a multiple of dtype_block_elems(t).
int64_t dtype_row_bytes(DType t, int64_t n);

inline float bits_to_f32(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
inline uint32_t f32_to_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }
// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
    uint32_t b = f32_to_bits(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
    uint32_t rounding = 0x7fffu + ((b >> 16) & 1u);
    return static_cast<uint16_t>((b + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even, overflow -> inf

float e4m3_to_f32(uint8_t v);
// Round to nearest even, saturate to +-448 (as torch's float8_e4m3fn cast after clamp).
uint8_t f32_to_e4m3(float f);

inline float e8m0_to_f32(uint8_t e) {
    if (e == 0xff) return bits_to_f32(0x7fc00000u);
    if (e == 0) return 0x1.0p-127f;
    return bits_to_f32(static_cast<uint32_t>(e) << 23);
}
// Smallest power of two >= x (x > 0), as the e8m0 exponent byte (ceil, as ue8m0
// scale rounding in DeepSeek's act_quant with scale_fmt="ue8m0").
uint8_t f32_to_e8m0_ceil(float x);

// Dequantise `n` elements of type `t` starting at `src` into `dst` (f32).
// REQUIRES: t is not kI64/kI32 and n is a multiple of dtype_block_elems(t).
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantise `n` f32 values into Q8_0 blocks (llama.cpp's reference rounding:
// d = amax / 127 stored as f16, q = round(x / d)). REQUIRES: n % 32 == 0.
void quantize_row_q8_0(const float* src, void* dst, int64_t n);

// Quantise `n` f32 values into MXFP4 blocks (ggml's block_mxfp4: byte 0 = e8m0
// exponent e, bytes 1..16 = e2m1 codes, low nibble = element j, high nibble =
// element j + 16) with llama.cpp's reference rounding (quantize_row_mxfp4_ref):
// e = floor(log2(amax)) - 2 + 127, each value to the nearest of the 16 e2m1
// values times 2^(e - 127), ties to the lower code. Unlike the reference (which
// is undefined there), e is clamped to [0, 254] for amax < 2^-125 or non-finite
// input. Dequantisation: code value * 2^(e - 127); e = 0xff is NaN (OCP MX).
// REQUIRES: n % 32 == 0.
void quantize_row_mxfp4(const float* src, void* dst, int64_t n);

}  // namespace dsi
