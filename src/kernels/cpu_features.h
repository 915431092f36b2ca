// CPU feature detection and the instruction-set level the kernels run at.
//
// The binary targets x86-64-v3 (AVX2 + FMA + F16C) as its floor; faster
// variants are compiled per file with their own flags and chosen once, at first
// use, from cpuid. DSINFER_ISA=scalar|avx2|avx512 (environment) caps the
// choice, for tests and benchmarks. Thread model: the choice is made once
// (thread-safe static); afterwards everything here is read-only.
#pragma once

#include <string_view>
#include <vector>

namespace dsi::kernels {

enum class Isa {
    kScalar,  // portable C++, the reference every variant is tested against
    kAvx2,    // AVX2 + FMA + F16C (x86-64-v3)
    kAvx512,  // AVX-512 F/BW/VL/DQ + VNNI
};

std::string_view isa_name(Isa isa);
// Parses "scalar", "avx2", "avx512"; false if unknown.
bool parse_isa(std::string_view name, Isa* out);

// AMX-TILE + AMX-INT8 on top of kAvx512, and the OS granted this process the tile
// state (asked once, on first call). Used by the q8_0 GEMM (kernels/matmul.h) when the
// active level is kAvx512; DSINFER_AMX=0 (environment) turns it off.
bool amx_supported();
bool amx_active();

// Every level this CPU can run, lowest first (always includes kScalar).
std::vector<Isa> supported_isas();
// The level kernels use: the best supported one, capped by DSINFER_ISA.
Isa active_isa();

}  // namespace dsi::kernels
