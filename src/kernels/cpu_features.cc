#include "kernels/cpu_features.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels/internal/gemm_amx.h"

namespace dsi::kernels {
namespace {

#if defined(__x86_64__)
// CPUID leaf 1 ECX bit 29 (F16C) and leaf 7 EDX bits 24/25 (AMX-TILE / AMX-INT8), read
// directly: clang 14's __builtin_cpu_supports knows neither name.
bool cpuid_bit(unsigned leaf, int reg, int bit) {
    unsigned r[4] = {0, 0, 0, 0};
    if (!__get_cpuid_count(leaf, 0, &r[0], &r[1], &r[2], &r[3])) return false;
    return (r[reg] >> bit) & 1u;
}
constexpr int kEcx = 2, kEdx = 3;
#endif

bool cpu_has_avx2() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           cpuid_bit(1, kEcx, 29);
#else
    return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

bool cpu_has_amx_int8() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return cpu_has_avx512() && cpuid_bit(7, kEdx, 24) && cpuid_bit(7, kEdx, 25);
#else
    return false;
#endif
}

Isa choose_isa() {
    std::vector<Isa> all = supported_isas();
    Isa best = all.back();
    if (const char* env = std::getenv("DSINFER_ISA")) {
        Isa cap;
        if (parse_isa(env, &cap) && static_cast<int>(cap) < static_cast<int>(best))
            best = cap;
    }
    return best;
}

}  // namespace

std::string_view isa_name(Isa isa) {
    switch (isa) {
        case Isa::kScalar:
            return "scalar";
        case Isa::kAvx2:
            return "avx2";
        case Isa::kAvx512:
            return "avx512";
    }
    return "?";
}

bool parse_isa(std::string_view name, Isa* out) {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
        if (name == isa_name(isa)) {
            *out = isa;
            return true;
        }
    }
    return false;
}

std::vector<Isa> supported_isas() {
    std::vector<Isa> out = {Isa::kScalar};
    if (cpu_has_avx2())
        out.push_back(Isa::kAvx2);
    if (cpu_has_avx512())
        out.push_back(Isa::kAvx512);
    return out;
}

bool amx_supported() {
    static const bool ok = cpu_has_amx_int8() && internal::amx_request_permission();
    return ok;
}

bool amx_active() {
    static const bool on = [] {
        const char* env = std::getenv("DSINFER_AMX");
        return active_isa() == Isa::kAvx512 && amx_supported() &&
               !(env && std::strcmp(env, "0") == 0);
    }();
    return on;
}

Isa active_isa() {
    static const Isa isa = choose_isa();
    return isa;
}

}  // namespace dsi::kernels
