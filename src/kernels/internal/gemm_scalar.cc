// Scalar reference for every packed matmul format (see gemm_abi.h for the
// layouts and the reduction order the vector variants reproduce bit for bit).
#include <cmath>
#include <cstring>

#include "kernels/internal/gemm_abi.h"
#include "tensor/dtype.h"

namespace dsi::kernels::internal {
namespace {

float load_element(const PackedView& w, const uint8_t* group, int64_t k, int i) {
    const int64_t idx = k * kGroupRows + i;
    switch (w.format) {
        case PackFormat::kF32: {
            float v;
            std::memcpy(&v, group + idx * 4, 4);
            return v;
        }
        case PackFormat::kBF16: {
            uint16_t v;
            std::memcpy(&v, group + idx * 2, 2);
            return bf16_to_f32(v);
        }
        case PackFormat::kF16: {
            uint16_t v;
            std::memcpy(&v, group + idx * 2, 2);
            return f16_to_f32(v);
        }
        case PackFormat::kE4M3:
            return e4m3_to_f32(group[idx]);
        case PackFormat::kQ8:
        case PackFormat::kMXFP4:  // not float family
        case PackFormat::kI8C:
            break;
    }
    return 0.0f;
}

void gemm_float_family(const PackedView& w, const float* x, int64_t m, float* y, int64_t g_begin,
                       int64_t g_end) {
    const int64_t K = w.cols;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t* group = w.data + g * w.group_bytes;
        const float* scales = w.scales ? w.scales + g * w.scale_blocks : nullptr;
        for (int64_t t = 0; t < m; ++t) {
            float acc[kGroupRows] = {};
            const float* xt = x + t * K;
            for (int64_t k = 0; k < K; ++k) {
                for (int i = 0; i < kGroupRows; ++i) {
                    float wv = load_element(w, group, k, i);
                    if (scales)
                        wv *= scales[k / w.scale_block_cols];
                    acc[i] = std::fma(wv, xt[k], acc[i]);
                }
            }
            for (int i = 0; i < kGroupRows; ++i) {
                const int64_t r = g * kGroupRows + i;
                if (r < w.rows)
                    y[t * w.rows + r] = acc[i];
            }
        }
    }
}

void gemm_q8(const PackedView& w, const Q8Acts& xq, int64_t m, float* y, int64_t g_begin,
             int64_t g_end) {
    const int64_t K = w.cols;
    const int64_t nb = K / kQ8Block;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t* group = w.data + g * w.group_bytes;
        for (int64_t t = 0; t < m; ++t) {
            float acc[kGroupRows] = {};
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* blk = group + b * kQ8BlockBytes;
                const int8_t* q = xq.q + t * K + b * kQ8Block;
                const float dx = xq.d[t * nb + b];
                for (int i = 0; i < kGroupRows; ++i) {
                    int32_t isum = 0;
                    for (int j = 0; j < kQ8Block; ++j) {
                        const int wq =
                            static_cast<int>(blk[32 + ((j / 4) * kGroupRows + i) * 4 + j % 4]) -
                            128;
                        isum += wq * q[j];
                    }
                    uint16_t dh;
                    std::memcpy(&dh, blk + 2 * i, 2);
                    acc[i] = std::fma(static_cast<float>(isum), f16_to_f32(dh) * dx, acc[i]);
                }
            }
            for (int i = 0; i < kGroupRows; ++i) {
                const int64_t r = g * kGroupRows + i;
                if (r < w.rows)
                    y[t * w.rows + r] = acc[i];
            }
        }
    }
}

}  // namespace

void gemm_scalar(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
                 int64_t g_begin, int64_t g_end) {
    if (w.format == PackFormat::kQ8) {
        gemm_q8(w, xq, m, y, g_begin, g_end);
    } else {
        gemm_float_family(w, x, m, y, g_begin, g_end);
    }
}

}  // namespace dsi::kernels::internal
