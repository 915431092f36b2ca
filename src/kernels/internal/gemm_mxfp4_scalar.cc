// Scalar reference of the MXFP4 matmul (layout and reduction order:
// gemm_mxfp4.h). The vector variants reproduce it bit for bit.
#include <cmath>

#include "kernels/internal/gemm_mxfp4.h"

namespace dsi::kernels::internal {

void gemm_mxfp4_scalar(const PackedView& w, const float* /*x*/, const Q8Acts& xq, int64_t m,
                       float* y, int64_t g_begin, int64_t g_end) {
    const int64_t K = w.cols;
    const int64_t nb = K / kMxfp4Block;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t* group = w.data + g * w.group_bytes;
        for (int64_t t = 0; t < m; ++t) {
            float acc[kGroupRows] = {};
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* blk = group + b * kMxfp4BlockBytes;
                const int8_t* q = xq.q + t * K + b * kMxfp4Block;
                const float dx = xq.d[t * nb + b];
                for (int i = 0; i < kGroupRows; ++i) {
                    int32_t isum = 0;
                    for (int k = 0; k < kMxfp4Block; ++k)
                        isum += kMxfp4Values[mxfp4_code(blk, i, k)] * q[k];
                    acc[i] = std::fma(static_cast<float>(isum), mxfp4_scale(blk[i]) * dx, acc[i]);
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

}  // namespace dsi::kernels::internal
