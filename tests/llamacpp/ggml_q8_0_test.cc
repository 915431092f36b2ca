// dsinfer's Q8_0 path against llama.cpp's own CPU kernels, called in the library that
// node-llama-cpp 3.21.1 ships (tests/llamacpp/node_modules, loaded with dlopen): the
// libggml-cpu variant ggml's own loader picks on this machine (highest
// ggml_backend_score(); the one ref_logits.mjs runs, AMX aside: the AMX path is not
// used for Q8_0 activations either). Its non-AVX variants (x64, sse42) quantise with
// the reference code instead (multiplier 1/d, roundf: ties away from zero), which
// differs in the last bit on some inputs; any x86-64-v3 machine runs an AVX one.
// 1. Activation quantisation: ggml's quantize_row_q8_0 (the from_float of Q8_0 that
//    its mul_mat applies to f32 activations) and dsinfer's quantize_act_q8 (every ISA)
//    give the same bytes: the same f16-rounded scale amax/127, the same q = round to
//    nearest with ties to even of x * 127/amax. Rows include exact ties, all-zero
//    blocks, scales in the f16 subnormal range and at f16 rounding boundaries.
// 2. Block products: ggml_vec_dot_q8_0_q8_0 and dsinfer's q8_0 matmul on the same
//    weight and activation blocks agree within f32 reassociation (the int8 block sums
//    are exact on both sides; only the order of the f32 scale products differs).
// This is the part of the Q8_0 agreement that can be checked exactly; whole-model
// logits can only be compared within the rounding-flip envelope
// (docs/llamacpp_agreement.md).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/packed_matrix.h"
#include "support/build_paths.h"
#include "tensor/dtype.h"

namespace dsi {
namespace {

namespace fs = std::filesystem;
using kernels::Isa;

constexpr int kBlock = 32;
constexpr int kBlockBytes = 34;  // f16 scale + 32 int8

const std::string kLibDir = std::string(DSINFER_SOURCE_DIR) +
                            "/tests/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/";

using QuantizeRowFn = void (*)(const float*, void*, int64_t);
using VecDotFn = void (*)(int, float*, size_t, const void*, size_t, const void*, size_t, int);
using ScoreFn = int (*)();
using InitFn = void (*)();

struct GgmlCpu {
    std::string name;
    QuantizeRowFn quantize_row_q8_0 = nullptr;
    VecDotFn vec_dot_q8_0_q8_0 = nullptr;
};

// The CPU variant ggml's loader picks on this machine: the highest
// ggml_backend_score() of the libggml-cpu-*.so files (0 = needs features this CPU
// lacks). The handles stay open for the process.
GgmlCpu load_best_variant() {
    GgmlCpu best;
    if (dlopen((kLibDir + "libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
        ADD_FAILURE() << "dlopen libggml-base.so: " << dlerror();
        return best;
    }
    int best_score = 0;
    void* best_handle = nullptr;
    for (const auto& entry : fs::directory_iterator(kLibDir)) {
        const std::string file = entry.path().filename().string();
        if (!file.starts_with("libggml-cpu-") || !file.ends_with(".so")) continue;
        void* h = dlopen(entry.path().c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) {
            ADD_FAILURE() << "dlopen " << file << ": " << dlerror();
            continue;
        }
        auto score = reinterpret_cast<ScoreFn>(dlsym(h, "ggml_backend_score"));
        const int s = score != nullptr ? score() : 0;
        if (s > best_score) {
            best_score = s;
            best_handle = h;
            best.name = file;
        }
    }
    if (best_handle == nullptr) {
        ADD_FAILURE() << "no runnable libggml-cpu variant in " << kLibDir;
        return best;
    }
    auto init = reinterpret_cast<InitFn>(dlsym(best_handle, "ggml_cpu_init"));
    if (init != nullptr) init();  // fp16 tables
    best.quantize_row_q8_0 = reinterpret_cast<QuantizeRowFn>(dlsym(best_handle, "quantize_row_q8_0"));
    best.vec_dot_q8_0_q8_0 =
        reinterpret_cast<VecDotFn>(dlsym(best_handle, "ggml_vec_dot_q8_0_q8_0"));
    EXPECT_NE(best.quantize_row_q8_0, nullptr) << best.name;
    EXPECT_NE(best.vec_dot_q8_0_q8_0, nullptr) << best.name;
    std::printf("ggml CPU variant: %s (score %d)\n", best.name.c_str(), best_score);
    return best;
}

// Rows of k floats that exercise the quantiser's corners, one kind per 32-block.
std::vector<float> test_row(int64_t k, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(k));
    for (int64_t b = 0; b < k / kBlock; ++b) {
        float* xb = x.data() + b * kBlock;
        switch (b % 8) {
            case 0:  // plain normal values
            case 1:
                for (int j = 0; j < kBlock; ++j) xb[j] = normal(rng);
                break;
            case 2: {  // amax = 127: x * 127/amax = x exactly; halves are exact ties
                for (int j = 0; j < kBlock; ++j) {
                    xb[j] = static_cast<float>(static_cast<int>(rng() % 253) - 126) + 0.5f;
                }
                xb[rng() % kBlock] = (rng() & 1) ? 127.0f : -127.0f;
                break;
            }
            case 3:  // all zero: scale 0, q 0
                break;
            case 4:  // scale amax/127 in the f16 subnormal range
                for (int j = 0; j < kBlock; ++j) xb[j] = 1e-6f * normal(rng);
                break;
            case 5:  // one large value, the rest tiny (most q round to 0)
                for (int j = 0; j < kBlock; ++j) xb[j] = 1e-3f * normal(rng);
                xb[rng() % kBlock] = -3e4f;
                break;
            case 6: {  // amax/127 on or next to an f16 rounding boundary (ties of the scale)
                const float d = 1.0f + (2.0f * static_cast<float>(rng() % 1024) + 1.0f) / 2048.0f;
                for (int j = 0; j < kBlock; ++j) xb[j] = 50.0f * normal(rng);
                float amax = 0;
                for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
                const float target = std::nextafter(d * 127.0f, (rng() & 1) ? 0.0f : 1e9f);
                for (int j = 0; j < kBlock; ++j) xb[j] *= target / amax;
                break;
            }
            default:  // wide dynamic range
                for (int j = 0; j < kBlock; ++j) xb[j] = std::ldexp(normal(rng), static_cast<int>(rng() % 20) - 10);
                break;
        }
    }
    return x;
}

TEST(GgmlQ8_0, ActivationQuantisationIsByteIdentical) {
    const GgmlCpu v = load_best_variant();
    ASSERT_NE(v.quantize_row_q8_0, nullptr);
    const int64_t k = 1024;
    const int64_t nb = k / kBlock;
    for (uint64_t seed = 1; seed <= 200; ++seed) {
        const std::vector<float> x = test_row(k, seed);
        {
            std::vector<uint8_t> theirs(static_cast<size_t>(nb * kBlockBytes));
            v.quantize_row_q8_0(x.data(), theirs.data(), k);
            for (Isa isa : kernels::supported_isas()) {
                std::vector<int8_t> q(static_cast<size_t>(k));
                std::vector<float> d(static_cast<size_t>(nb));
                std::vector<int32_t> s(static_cast<size_t>(nb));
                kernels::quantize_act_q8_isa(isa, x.data(), k, q.data(), d.data(), s.data());
                for (int64_t b = 0; b < nb; ++b) {
                    const uint8_t* tb = theirs.data() + b * kBlockBytes;
                    uint16_t their_d;
                    std::memcpy(&their_d, tb, 2);
                    // dsinfer keeps the f16-rounded scale as a float: same value, exactly.
                    ASSERT_EQ(f32_to_f16(d[b]), their_d)
                        << v.name << " " << kernels::isa_name(isa) << " seed " << seed << " block " << b;
                    ASSERT_EQ(f16_to_f32(their_d), d[b]);
                    ASSERT_EQ(std::memcmp(tb + 2, q.data() + b * kBlock, kBlock), 0)
                        << v.name << " " << kernels::isa_name(isa) << " seed " << seed << " block " << b;
                }
            }
        }
    }
}

TEST(GgmlQ8_0, BlockProductsAgreeWithinF32Reassociation) {
    const GgmlCpu v = load_best_variant();
    ASSERT_NE(v.vec_dot_q8_0_q8_0, nullptr);
    const int64_t k = 2048;
    const int64_t nb = k / kBlock;
    const int64_t rows = 16;
    for (uint64_t seed = 1; seed <= 20; ++seed) {
        std::mt19937_64 rng(seed * 7919);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> w(static_cast<size_t>(rows * k));
        for (float& e : w) e = 0.05f * normal(rng);
        const std::vector<float> x = test_row(k, seed + 1000);
        {
            // Weights as GGUF Q8_0 blocks (ggml's quantiser: the layout both sides read).
            std::vector<uint8_t> wq(static_cast<size_t>(rows * nb * kBlockBytes));
            for (int64_t r = 0; r < rows; ++r) {
                v.quantize_row_q8_0(w.data() + r * k, wq.data() + r * nb * kBlockBytes, k);
            }
            std::vector<uint8_t> xq(static_cast<size_t>(nb * kBlockBytes));
            v.quantize_row_q8_0(x.data(), xq.data(), k);
            kernels::SourceMatrix src{DType::kQ8_0, rows, k, wq.data()};
            auto packed = kernels::pack_matrix(src, kernels::WeightFormat::kQ8_0);
            ASSERT_TRUE(packed.is_ok()) << packed.status().to_string();
            for (Isa isa : kernels::supported_isas()) {
                std::vector<float> ours(static_cast<size_t>(rows));
                kernels::matmul_isa(isa, *packed, x.data(), 1, ours.data(), nullptr);
                for (int64_t r = 0; r < rows; ++r) {
                    float theirs = 0;
                    const uint8_t* wr = wq.data() + r * nb * kBlockBytes;
                    v.vec_dot_q8_0_q8_0(static_cast<int>(k), &theirs, 0, wr, 0, xq.data(), 0, 1);
                    // Sum of |block terms| in double: the scale of the f32 rounding.
                    double abs_terms = 0;
                    for (int64_t b = 0; b < nb; ++b) {
                        uint16_t dw, dx;
                        std::memcpy(&dw, wr + b * kBlockBytes, 2);
                        std::memcpy(&dx, xq.data() + b * kBlockBytes, 2);
                        int64_t isum = 0;
                        for (int j = 0; j < kBlock; ++j) {
                            isum += static_cast<int8_t>(wr[b * kBlockBytes + 2 + j]) *
                                    static_cast<int8_t>(xq[b * kBlockBytes + 2 + j]);
                        }
                        abs_terms += std::fabs(static_cast<double>(isum) * f16_to_f32(dw) * f16_to_f32(dx));
                    }
                    // Each side rounds each of nb products and nb sums once: at most
                    // 2 * nb ulps of the sum of magnitudes apart, with a factor 2 of room.
                    const double bound = 4.0 * static_cast<double>(nb) * 0x1.0p-24 * abs_terms;
                    EXPECT_LE(std::fabs(static_cast<double>(ours[r]) - theirs), bound)
                        << v.name << " " << kernels::isa_name(isa) << " seed " << seed << " row " << r;
                }
            }
        }
    }
}

}  // namespace
}  // namespace dsi
