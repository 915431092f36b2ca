// Scalar reference of the i8c GEMM and activation quantiser (gemm_i8c.h states the
// layout and the reduction order the vector variants reproduce bit for bit).
#include <cmath>

#include "kernels/internal/gemm_i8c.h"

namespace dsi::kernels::internal {

void quantize_i8c_scalar(const float* x, int64_t k, int64_t padded_cols, int8_t* q, float* d,
                         int32_t* s128) {
    float amax = 0.0f;
    for (int64_t j = 0; j < k; ++j)
        amax = std::fmax(amax, std::fabs(x[j]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int64_t j = 0; j < k; ++j) {
        const int32_t v = rne_to_i32(x[j] * id);
        q[j] = static_cast<int8_t>(v);
        sum = wrap_add(sum, v);
    }
    for (int64_t j = k; j < padded_cols; ++j)
        q[j] = 0;
    *d = amax / 127.0f;
    *s128 = wrap_times128(sum);
}

void gemm_i8c_scalar(const PackedView& w, const I8cActs& xa, int64_t m, float* y,
                     int64_t g_begin, int64_t g_end) {
    const int64_t kp = w.padded_cols;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t* group = w.data + g * w.group_bytes;
        for (int i = 0; i < kGroupRows; ++i) {
            const int64_t r = g * kGroupRows + i;
            if (r >= w.rows)
                break;
            for (int64_t t = 0; t < m; ++t) {
                const int8_t* qx = xa.q + t * kp;
                int32_t isum = 0;
                for (int64_t k = 0; k < w.cols; ++k) {
                    const int qw = static_cast<int>(group[(k / 4) * 64 + i * 4 + k % 4]) - 128;
                    isum += qw * qx[k];
                }
                y[t * w.rows + r] = static_cast<float>(isum) * (xa.d[t] * w.scales[r]);
            }
        }
    }
}

}  // namespace dsi::kernels::internal
