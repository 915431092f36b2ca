#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include <cstring>

#include "kernels/internal/gemm_amx.h"
#include "kernels/internal/gemm_i8c.h"
#include "kernels/internal/gemm_mxfp4.h"

namespace dsi::kernels {

using internal::kGroupRows;
using internal::kQ8Block;

namespace {

internal::GemmFn gemm_for(Isa isa) {
    switch (isa) {
        case Isa::kAvx512:
            return internal::gemm_avx512;
        case Isa::kAvx2:
            return internal::gemm_avx2;
        case Isa::kScalar:
            break;
    }
    return internal::gemm_scalar;
}

internal::GemmFn gemm_mxfp4_for(Isa isa) {
    switch (isa) {
        case Isa::kAvx512:
            return internal::gemm_mxfp4_avx512;
        case Isa::kAvx2:
            return internal::gemm_mxfp4_avx2;
        case Isa::kScalar:
            break;
    }
    return internal::gemm_mxfp4_scalar;
}

internal::QuantizeI8cFn quantize_i8c_fn(Isa isa) {
    switch (isa) {
        case Isa::kAvx512:
            return internal::quantize_i8c_avx512;
        case Isa::kAvx2:
            return internal::quantize_i8c_avx2;
        case Isa::kScalar:
            break;
    }
    return internal::quantize_i8c_scalar;
}

internal::I8cGemmFn gemm_i8c_for(Isa isa) {
    switch (isa) {
        case Isa::kAvx512:
            return internal::gemm_i8c_avx512;
        case Isa::kAvx2:
            return internal::gemm_i8c_avx2;
        case Isa::kScalar:
            break;
    }
    return internal::gemm_i8c_scalar;
}

// Runs fn(g_begin, g_end) over chunks of whole groups (which thread computes a row
// never changes its bits).
template <class Fn>
void for_groups(ThreadPool* pool, int64_t groups, int64_t grain, Fn&& fn) {
    const int64_t threads = pool ? pool->num_threads() : 1;
    if (threads <= 1 || groups < 2) {
        fn(int64_t{0}, groups);
        return;
    }
    pool->parallel_for(groups, grain, fn);
}

// Per-thread scratch of the i8c path, reused across calls (no allocation, page faults or
// zero fill per call; it keeps the largest size seen). Padded token rows are never
// zeroed: their C rows are computed from whatever bytes are there and never stored.
struct I8cScratch {
    std::vector<int8_t> q;  // row-major activations (non-AMX) or one row per thread (AMX)
    std::vector<int8_t> tiles;
    std::vector<float> d;
    std::vector<int32_t> s128;
};

template <class T>
T* grown(std::vector<T>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n)
        v.resize(static_cast<size_t>(n));
    return v.data();
}

// n bytes of v starting at a 64-byte boundary: AMX tile rows (and 64-byte vector loads)
// then never straddle two cache lines.
int8_t* grown_aligned(std::vector<int8_t>& v, int64_t n) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(grown(v, n + 63));
    return reinterpret_cast<int8_t*>((p + 63) & ~uintptr_t{63});
}

// Per-thread scratch of the q8_0 / mxfp4 activations, reused across calls like
// I8cScratch (the caller's; pool workers fill disjoint rows of it).
struct Q8Scratch {
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> s128;
    std::vector<int32_t> neg_s128;
};

// Quantises the m rows of x (K columns) to Q8_0 per 32 values, rows spread over the pool
// when there is enough work (each row's bits depend on that row only). Rows m up to a
// multiple of 16 are zero: an AMX tile holds 16 token rows. The result points into this
// thread's scratch and lives until its next call.
internal::Q8Acts quantize_q8_rows(Isa isa, const float* x, int64_t m, int64_t K, ThreadPool* pool) {
    const int64_t nb = K / kQ8Block;
    const int64_t padded =
        (m + internal::kAmxTokenPad - 1) / internal::kAmxTokenPad * internal::kAmxTokenPad;
    static thread_local Q8Scratch scratch;
    int8_t* q = grown_aligned(scratch.q, padded * K);  // tile rows start on a line
    float* d = grown(scratch.d, padded * nb);
    int32_t* s = grown(scratch.s128, padded * nb);
    int32_t* ns = grown(scratch.neg_s128, padded * nb);
    std::memset(q + m * K, 0, static_cast<size_t>((padded - m) * K));
    std::fill(d + m * nb, d + padded * nb, 0.0f);
    std::fill(s + m * nb, s + padded * nb, 0);
    std::fill(ns + m * nb, ns + padded * nb, 0);
    auto rows = [&](int64_t tb, int64_t te) {
        for (int64_t t = tb; t < te; ++t) {
            quantize_act_q8_isa(isa, x + t * K, K, q + t * K, d + t * nb, s + t * nb);
            for (int64_t b = t * nb; b < (t + 1) * nb; ++b) {
                ns[b] = static_cast<int32_t>(0u - static_cast<uint32_t>(s[b]));
            }
        }
    };
    // A parallel_for costs a few microseconds: worth it from ~16 K values up.
    constexpr int64_t kParallelValues = 16384;
    const int64_t threads = pool ? pool->num_threads() : 1;
    if (threads > 1 && m >= threads && m * K >= kParallelValues) {
        pool->parallel_for(m, 1, rows);
    } else {
        rows(0, m);
    }
    return {q, d, s, ns};
}

// Groups per parallel_for unit. Chunks are static (ThreadPool), so a coarse grain can
// leave one thread a whole unit more (88 groups in units of 8: 48 vs 40); GEMM kernels
// tile pairs of groups, so units of 2 split evenly. The GEMV (m = 1) keeps its old
// grain (its AVX-512 tiles are 4 groups wide).
int64_t group_grain(int64_t groups, int64_t m, int64_t threads) {
    if (m > 1) return 2;
    return std::max<int64_t>(1, std::min<int64_t>(8, groups / threads));
}

// i8c: quantise each token row over all of K (row-local: batch-invariant), in tiles of
// 16 rows over the pool; with AMX straight into the A tile layout (gemm_i8c.h).
void matmul_i8c(Isa isa, const PackedMatrix& w, const float* x, int64_t m, float* y,
                ThreadPool* pool, bool amx) {
    const internal::PackedView& v = w.view();
    const int64_t K = v.cols;
    const int64_t kp = v.padded_cols;
    const int64_t nkt = kp / internal::kI8cKTile;
    const bool use_amx = amx && m >= internal::kAmxMinTokens;
    const int64_t ntt = (m + 15) / 16;
    const int64_t padded_m = ntt * 16;
    static thread_local I8cScratch scratch;
    // With AMX, q holds one row per pool thread (16 tiles of a thread's task share it).
    const int64_t num_threads = pool ? pool->num_threads() : 1;
    int8_t* q = grown_aligned(scratch.q, use_amx ? num_threads * kp : m * kp);
    int8_t* tiles = use_amx ? grown_aligned(scratch.tiles, padded_m * kp) : nullptr;
    float* d = grown(scratch.d, padded_m);
    int32_t* s = grown(scratch.s128, padded_m);
    const internal::QuantizeI8cFn quant = quantize_i8c_fn(isa);
    const int64_t chunks = std::min<int64_t>(num_threads, ntt);
    auto quantize_rows = [&](int64_t cb, int64_t ce) {
        for (int64_t c = cb; c < ce; ++c) {
            // Chunk c: token tiles [ntt * c / chunks, ntt * (c + 1) / chunks).
            const int64_t t_begin = ntt * c / chunks * 16;
            const int64_t t_end = std::min(m, ntt * (c + 1) / chunks * 16);
            for (int64_t t = t_begin; t < t_end; ++t) {
                if (!use_amx) {
                    quant(x + t * K, K, kp, q + t * kp, &d[t], &s[t]);
                    continue;
                }
                int8_t* row = q + c * kp;
                quant(x + t * K, K, kp, row, &d[t], &s[t]);
                int8_t* dst = tiles + (t / 16) * nkt * internal::kI8cTileBytes +
                              (t % 16) * internal::kI8cKTile;
                for (int64_t kt = 0; kt < nkt; ++kt) {
                    std::memcpy(dst + kt * internal::kI8cTileBytes,
                                row + kt * internal::kI8cKTile, internal::kI8cKTile);
                }
            }
        }
    };
    for_groups(chunks > 1 ? pool : nullptr, chunks, 1, quantize_rows);
    const internal::I8cActs xa{q, d, s, tiles};
    internal::I8cGemmFn fn = gemm_i8c_for(isa);
    if (use_amx) {
        DSI_CHECK(isa == Isa::kAvx512 && amx_supported());
        fn = internal::gemm_i8c_amx;
    }
    // Grain 2: the AMX kernel works on pairs of groups.
    for_groups(pool, v.num_groups, 2,
               [&](int64_t gb, int64_t ge) { fn(v, xa, m, y, gb, ge); });
}

}  // namespace

void quantize_act_i8c(Isa isa, const float* x, int64_t k, int64_t padded_cols, int8_t* q,
                      float* d, int32_t* s128) {
    quantize_i8c_fn(isa)(x, k, padded_cols, q, d, s128);
}

void quantize_act_q8(const float* x, int64_t k, int8_t* q, float* d, int32_t* s128) {
    for (int64_t b = 0; b < k / kQ8Block; ++b) {
        const float* xb = x + b * kQ8Block;
        float amax = 0.0f;
        for (int j = 0; j < kQ8Block; ++j)
            amax = std::max(amax, std::fabs(xb[j]));
        // ggml-cpu's x86 quantize_row_q8_0: d = amax/127 stored as f16, q = rne(x *
        // 127/amax).
        d[b] = f16_to_f32(f32_to_f16(amax / 127.0f));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < kQ8Block; ++j) {
            const int32_t v = internal::rne_to_i32(xb[j] * id);
            q[b * kQ8Block + j] = static_cast<int8_t>(v);
            sum = internal::wrap_add(sum, v);
        }
        s128[b] = internal::wrap_times128(sum);
    }
}

void quantize_act_q8_isa(Isa isa, const float* x, int64_t k, int8_t* q, float* d,
                         int32_t* s128) {
    if (isa == Isa::kScalar) {
        quantize_act_q8(x, k, q, d, s128);
        return;
    }
    const int64_t nb = k / kQ8Block;
    static thread_local std::vector<float> amax_id;
    float* amax = grown(amax_id, nb);
    if (isa == Isa::kAvx512) {
        internal::q8_block_amax_avx512(x, nb, amax);
    } else {
        internal::q8_block_amax_avx2(x, nb, amax);
    }
    // The reference's scale and multiplier per block (in place: amax -> id), vectorised
    // with the same IEEE divisions and f16 rounding.
    if (isa == Isa::kAvx512) {
        internal::q8_scales_avx512(amax, nb, d);
    } else {
        internal::q8_scales_avx2(amax, nb, d);
    }
    if (isa == Isa::kAvx512) {
        internal::q8_quantize_blocks_avx512(x, nb, amax, q, s128);
    } else {
        internal::q8_quantize_blocks_avx2(x, nb, amax, q, s128);
    }
}

void matmul_isa(Isa isa, const PackedMatrix& w, const float* x, int64_t m, float* y,
                ThreadPool* pool, bool amx) {
    if (m <= 0 || w.rows() == 0)
        return;
    const internal::PackedView& v = w.view();
    if (v.format == internal::PackFormat::kI8C) {
        matmul_i8c(isa, w, x, m, y, pool, amx);
        return;
    }
    const bool mxfp4 = v.format == internal::PackFormat::kMXFP4;
    internal::GemmFn fn = mxfp4 ? gemm_mxfp4_for(isa) : gemm_for(isa);
    const int64_t threads = pool ? pool->num_threads() : 1;
    internal::Q8Acts xq;
    if (v.format == internal::PackFormat::kQ8 || mxfp4) {
        xq = quantize_q8_rows(isa, x, m, v.cols, pool);
    }
    if (amx && v.format == internal::PackFormat::kQ8) {
        DSI_CHECK(isa == Isa::kAvx512 && amx_supported());
        fn = internal::gemm_amx;
    }
    // Chunks of whole groups: which thread computes a row never changes its bits.
    const int64_t groups = v.num_groups;
    if (threads <= 1 || groups < 2) {
        fn(v, x, xq, m, y, 0, groups);
        return;
    }
    pool->parallel_for(groups, group_grain(groups, m, threads),
                       [&](int64_t gb, int64_t ge) { fn(v, x, xq, m, y, gb, ge); });
}

void matmul(const PackedMatrix& w, const float* x, int64_t m, float* y, ThreadPool* pool) {
    matmul_isa(active_isa(), w, x, m, y, pool, amx_active());
}

float read_sum(Isa isa, const float* x, int64_t n) {
    switch (isa) {
        case Isa::kAvx512:
            return internal::sum_avx512(x, n);
        case Isa::kAvx2:
            return internal::sum_avx2(x, n);
        case Isa::kScalar:
            break;
    }
    float s = 0;
    for (int64_t i = 0; i < n; ++i)
        s += x[i];
    return s;
}

}  // namespace dsi::kernels
