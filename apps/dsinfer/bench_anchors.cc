#include "bench_anchors.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#define DSI_HAVE_DNNL_HEADER 1
#endif

namespace dsi::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

template <typename F>
double best_seconds(int reps, F fn) {
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = Clock::now();
        fn();
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best;
}

// A library's worker threads (OpenBLAS pthreads, OpenMP) spin for a while after a call;
// let them go to sleep before anything else is timed.
void let_spinners_sleep() { std::this_thread::sleep_for(std::chrono::milliseconds(500)); }

// 64-byte aligned float array whose pages are touched (filled) by the caller.
struct AlignedFloats {
    explicit AlignedFloats(int64_t n)
        : n_(n), p_(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * 4))) {}
    ~AlignedFloats() { std::free(p_); }
    AlignedFloats(const AlignedFloats&) = delete;
    AlignedFloats& operator=(const AlignedFloats&) = delete;
    float* data() const { return p_; }
    int64_t n_;
    float* p_;
};

// Plain loops: the compiler vectorises them (baseline SSE2 already moves more than one
// core's DRAM bandwidth); the read pass sums u32 lanes so it can be vectorised without
// reassociating floats.
void copy_range(const float* a, float* c, int64_t n) {
    for (int64_t i = 0; i < n; ++i) c[i] = a[i];
}
void triad_range(float* a, const float* b, const float* c, float s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}
uint32_t read_range8(const uint32_t* p, int64_t n) {
    // 8 interleaved streams of n/8 words each, as tile_float<8, 1> reads 8 row groups.
    const int64_t per = n / 8;
    uint32_t s[8][16] = {};
    for (int64_t i = 0; i + 16 <= per; i += 16) {
        for (int st = 0; st < 8; ++st) {
            for (int j = 0; j < 16; ++j) s[st][j] += p[st * per + i + j];
        }
    }
    uint32_t r = 0;
    for (auto& row : s) {
        for (uint32_t v : row) r ^= v;
    }
    return r;
}

}  // namespace

double StreamBandwidth::best_gb_s() const { return std::max({copy_gb_s, triad_gb_s, read_gb_s}); }

StreamBandwidth measure_stream(ThreadPool& pool, int64_t array_bytes, int reps) {
    const int64_t n = array_bytes / 4;
    AlignedFloats a(n), b(n), c(n);
    const int threads = pool.num_threads();
    // First touch on the thread that later streams each share.
    pool.parallel_for(threads, 1, [&](int64_t i, int64_t) {
        const int64_t per = n / threads;
        std::fill_n(a.data() + i * per, per, 1.0f);
        std::fill_n(b.data() + i * per, per, 2.0f);
        std::fill_n(c.data() + i * per, per, 0.5f);
    });
    const int64_t per = n / threads;
    const double bytes = static_cast<double>(per * threads) * 4;
    StreamBandwidth out;
    double t = best_seconds(reps, [&] {
        pool.parallel_for(threads, 1, [&](int64_t i, int64_t) {
            copy_range(a.data() + i * per, c.data() + i * per, per);
        });
    });
    out.copy_gb_s = 2 * bytes / t / 1e9;
    t = best_seconds(reps, [&] {
        pool.parallel_for(threads, 1, [&](int64_t i, int64_t) {
            triad_range(a.data() + i * per, b.data() + i * per, c.data() + i * per, 3.0f, per);
        });
    });
    out.triad_gb_s = 3 * bytes / t / 1e9;
    std::vector<uint32_t> sink(static_cast<size_t>(threads));
    t = best_seconds(reps, [&] {
        pool.parallel_for(threads, 1, [&](int64_t i, int64_t) {
            sink[i] += read_range8(reinterpret_cast<const uint32_t*>(b.data()) + i * per, per);
        });
    });
    out.read_gb_s = static_cast<double>((per / 128) * 128 * threads) * 4 / t / 1e9;
    volatile uint32_t keep = sink[0];
    (void)keep;
    return out;
}

json openblas_sgemm(int threads, int64_t m, int64_t n, int64_t k, int reps) {
    // Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) does not know recent Xeons by cpuid and falls
    // back to its "Prescott" (SSE3) kernels; name the AVX-512 core (unless the caller did)
    // so the anchor is OpenBLAS at its best. Kept open for the process: dlclose under
    // OpenBLAS's own threads is not safe.
    static void* lib = [] {
        if (__builtin_cpu_supports("avx512f")) setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
        return dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    }();
    if (!lib) return {{"error", "libopenblas.so.0 not found"}};
    using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int,
                             const float*, int, float, float*, int);
    auto sgemm = reinterpret_cast<SgemmFn>(dlsym(lib, "cblas_sgemm"));
    auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
    auto get_threads = reinterpret_cast<int (*)()>(dlsym(lib, "openblas_get_num_threads"));
    auto corename = reinterpret_cast<char* (*)()>(dlsym(lib, "openblas_get_corename"));
    auto config = reinterpret_cast<char* (*)()>(dlsym(lib, "openblas_get_config"));
    auto parallel = reinterpret_cast<int (*)()>(dlsym(lib, "openblas_get_parallel"));
    if (!sgemm || !set_threads || !get_threads) return {{"error", "cblas_sgemm not found"}};
    json out;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(sgemm), &info) != 0 && info.dli_fname) {
        char real[PATH_MAX];
        out["library"] = realpath(info.dli_fname, real) ? real : info.dli_fname;
    }
    if (corename) out["core"] = corename();
    if (const char* env = std::getenv("OPENBLAS_CORETYPE")) out["coretype_env"] = env;
    if (config) out["config"] = config();
    if (parallel) out["parallel"] = parallel() == 0 ? "serial" : parallel() == 1 ? "pthreads" : "openmp";
    set_threads(threads);
    out["threads"] = get_threads();
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> a(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k)),
        c(static_cast<size_t>(m * n));
    for (float& v : a) v = nd(rng);
    for (float& v : w) v = nd(rng) * 0.02f;
    // 101 = RowMajor, 111 = NoTrans, 112 = Trans: C = A W^T, as our matmul.
    auto run = [&] {
        sgemm(101, 111, 112, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f,
              a.data(), static_cast<int>(k), w.data(), static_cast<int>(k), 0.0f, c.data(),
              static_cast<int>(n));
    };
    run();  // warm-up: thread start, page faults
    const double t = best_seconds(reps, run);
    out["gflop_s"] = 2.0 * static_cast<double>(m * n * k) / t / 1e9;
    set_threads(1);
    let_spinners_sleep();
    return out;
}

#ifdef DSI_HAVE_DNNL_HEADER
namespace {

// The oneDNN C API entry points, looked up in the dlopen'd library.
struct Dnnl {
    decltype(&dnnl_engine_create) engine_create;
    decltype(&dnnl_stream_create) stream_create;
    decltype(&dnnl_memory_desc_init_by_tag) md_init_by_tag;
    decltype(&dnnl_matmul_desc_init) matmul_desc_init;
    decltype(&dnnl_primitive_desc_create) pd_create;
    decltype(&dnnl_primitive_desc_query) pd_query;
    decltype(&dnnl_primitive_desc_query_md) pd_query_md;
    decltype(&dnnl_primitive_desc_destroy) pd_destroy;
    decltype(&dnnl_primitive_create) prim_create;
    decltype(&dnnl_primitive_destroy) prim_destroy;
    decltype(&dnnl_primitive_execute) execute;
    decltype(&dnnl_reorder_primitive_desc_create) reorder_pd_create;
    decltype(&dnnl_memory_create) memory_create;
    decltype(&dnnl_memory_destroy) memory_destroy;
    decltype(&dnnl_memory_get_data_handle) memory_handle;
    decltype(&dnnl_stream_wait) stream_wait;
    decltype(&dnnl_stream_destroy) stream_destroy;
    decltype(&dnnl_engine_destroy) engine_destroy;
    void (*omp_set_num_threads)(int) = nullptr;
};

const Dnnl* load_dnnl() {
    static const Dnnl* api = []() -> const Dnnl* {
        void* lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return nullptr;
        auto* d = new Dnnl;
        bool ok = true;
        auto get = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
            ok = ok && fn != nullptr;
        };
        get(d->engine_create, "dnnl_engine_create");
        get(d->stream_create, "dnnl_stream_create");
        get(d->md_init_by_tag, "dnnl_memory_desc_init_by_tag");
        get(d->matmul_desc_init, "dnnl_matmul_desc_init");
        get(d->pd_create, "dnnl_primitive_desc_create");
        get(d->pd_query, "dnnl_primitive_desc_query");
        get(d->pd_query_md, "dnnl_primitive_desc_query_md");
        get(d->pd_destroy, "dnnl_primitive_desc_destroy");
        get(d->prim_create, "dnnl_primitive_create");
        get(d->prim_destroy, "dnnl_primitive_destroy");
        get(d->execute, "dnnl_primitive_execute");
        get(d->reorder_pd_create, "dnnl_reorder_primitive_desc_create");
        get(d->memory_create, "dnnl_memory_create");
        get(d->memory_destroy, "dnnl_memory_destroy");
        get(d->memory_handle, "dnnl_memory_get_data_handle");
        get(d->stream_wait, "dnnl_stream_wait");
        get(d->stream_destroy, "dnnl_stream_destroy");
        get(d->engine_destroy, "dnnl_engine_destroy");
        get(d->omp_set_num_threads, "omp_set_num_threads");  // libgomp, a dependency
        if (!ok) {
            delete d;
            return nullptr;
        }
        return d;
    }();
    return api;
}

// One matmul C[m, n] = A[m, k] W[k, n] (W given as [n, k] row-major = "ba"), weights
// reordered to oneDNN's preferred layout once. Returns GFLOP/s and the implementation.
json dnnl_case(const Dnnl& d, dnnl_engine_t eng, dnnl_stream_t st, dnnl_data_type_t src_dt,
               dnnl_data_type_t wei_dt, dnnl_data_type_t dst_dt, int64_t m, int64_t n, int64_t k,
               int reps) {
    dnnl_memory_desc_t src_md, wei_any_md, wei_plain_md, dst_md;
    const dnnl_dims_t src_dims = {m, k}, wei_dims = {k, n}, dst_dims = {m, n};
    d.md_init_by_tag(&src_md, 2, src_dims, src_dt, dnnl_ab);
    d.md_init_by_tag(&wei_any_md, 2, wei_dims, wei_dt, dnnl_format_tag_any);
    d.md_init_by_tag(&wei_plain_md, 2, wei_dims, wei_dt, dnnl_ba);
    d.md_init_by_tag(&dst_md, 2, dst_dims, dst_dt, dnnl_ab);
    dnnl_matmul_desc_t mm;
    if (d.matmul_desc_init(&mm, &src_md, &wei_any_md, nullptr, &dst_md) != dnnl_success)
        return {{"error", "matmul_desc_init"}};
    dnnl_primitive_desc_t pd = nullptr;
    if (d.pd_create(&pd, &mm, nullptr, eng, nullptr) != dnnl_success)
        return {{"error", "no matmul implementation for these types"}};
    json out;
    const char* impl = nullptr;
    if (d.pd_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        out["impl"] = impl;
    const dnnl_memory_desc_t* wei_md = d.pd_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_t src_m, wei_plain_m, wei_m, dst_m;
    d.memory_create(&src_m, &src_md, eng, DNNL_MEMORY_ALLOCATE);
    d.memory_create(&wei_plain_m, &wei_plain_md, eng, DNNL_MEMORY_ALLOCATE);
    d.memory_create(&wei_m, wei_md, eng, DNNL_MEMORY_ALLOCATE);
    d.memory_create(&dst_m, &dst_md, eng, DNNL_MEMORY_ALLOCATE);
    // Small random values (bytes): a valid bf16 has exponent bits set, so fill bf16 with
    // 0x3c00..0x3cff (about 0.0078..0.0156) and int8 with small integers.
    std::mt19937 rng(5);
    auto fill = [&](dnnl_memory_t mem, int64_t count, dnnl_data_type_t dt) {
        void* h = nullptr;
        d.memory_handle(mem, &h);
        if (dt == dnnl_bf16) {
            auto* p = static_cast<uint16_t*>(h);
            for (int64_t i = 0; i < count; ++i) p[i] = static_cast<uint16_t>(0x3c00 | (rng() & 0xff));
        } else {
            auto* p = static_cast<uint8_t*>(h);
            for (int64_t i = 0; i < count; ++i) p[i] = static_cast<uint8_t>(rng() & 0x3f);
        }
    };
    fill(src_m, m * k, src_dt);
    fill(wei_plain_m, k * n, wei_dt);
    dnnl_primitive_desc_t rpd = nullptr;
    dnnl_primitive_t reorder = nullptr, prim = nullptr;
    if (d.reorder_pd_create(&rpd, &wei_plain_md, eng, wei_md, eng, nullptr) == dnnl_success &&
        d.prim_create(&reorder, rpd) == dnnl_success && d.prim_create(&prim, pd) == dnnl_success) {
        const dnnl_exec_arg_t rargs[] = {{DNNL_ARG_FROM, wei_plain_m}, {DNNL_ARG_TO, wei_m}};
        d.execute(reorder, st, 2, rargs);
        d.stream_wait(st);
        const dnnl_exec_arg_t args[] = {
            {DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}};
        auto run = [&] {
            d.execute(prim, st, 3, args);
            d.stream_wait(st);
        };
        run();  // warm-up: JIT, thread start, page faults
        std::vector<double> times;
        const double t = best_seconds(reps, [&] {
            const auto t0 = Clock::now();
            run();
            times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        });
        out["gflop_s"] = 2.0 * static_cast<double>(m * n * k) / t / 1e9;
        std::sort(times.begin(), times.end());
        out["median_s"] = times[times.size() / 2];
    } else {
        out["error"] = "primitive creation failed";
    }
    if (prim) d.prim_destroy(prim);
    if (reorder) d.prim_destroy(reorder);
    if (rpd) d.pd_destroy(rpd);
    d.pd_destroy(pd);
    for (dnnl_memory_t mem : {src_m, wei_plain_m, wei_m, dst_m}) d.memory_destroy(mem);
    return out;
}

}  // namespace

json onednn_matmul(int threads, int64_t m, int64_t n, int64_t k, int reps, bool s8_only) {
    const Dnnl* d = load_dnnl();
    if (!d) return {{"error", "libdnnl.so.2 not found"}};
    d->omp_set_num_threads(threads);
    dnnl_engine_t eng = nullptr;
    dnnl_stream_t st = nullptr;
    if (d->engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        d->stream_create(&st, eng, dnnl_stream_default_flags) != dnnl_success) {
        return {{"error", "engine/stream"}};
    }
    json out;
    out["threads"] = threads;
    if (!s8_only) {
        out["bf16"] = dnnl_case(*d, eng, st, dnnl_bf16, dnnl_bf16, dnnl_f32, m, n, k, reps);
    }
    out["s8"] = dnnl_case(*d, eng, st, dnnl_u8, dnnl_s8, dnnl_s32, m, n, k, reps);
    d->stream_destroy(st);
    d->engine_destroy(eng);
    let_spinners_sleep();
    return out;
}
#else
json onednn_matmul(int, int64_t, int64_t, int64_t, int, bool) {
    return {{"error", "built without oneapi/dnnl/dnnl.h (libdnnl-dev)"}};
}
#endif

}  // namespace dsi::bench
