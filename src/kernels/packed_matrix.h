// PackedMatrix: a weight matrix [rows (outputs), cols (inputs)] repacked once,
// at load, into the layout the matmul kernels read (internal/gemm_abi.h):
// groups of 16 rows interleaved so one vector load holds one column of 16 rows.
//
// Formats: f32, bf16, f16 (exact copies or round-to-nearest-even conversions),
// e4m3 with block scales (only from an FP8 source; dequantised on the fly by
// the kernel), q8_0 (int8 with one f16 scale per 32 columns: GGUF Q8_0 repacks
// exactly, other sources are quantised with llama.cpp's reference rounding),
// mxfp4 (e2m1 codes + one e8m0 scale per 32 columns, internal/gemm_mxfp4.h: GGUF
// MXFP4 repacks exactly, other sources are quantised with llama.cpp's
// quantize_row_mxfp4_ref rounding; for routed experts, SPEC S-ENG-9),
// i8c (int8 with one f32 scale per output row, internal/gemm_i8c.h: quantised at
// load from any source, d = amax_row / 127; activations are then quantised per token
// row and the int32 sums run over all of K — the AMX-friendly W8A8 format).
//
// Thread model: immutable after pack_matrix(); any number of threads may read
// it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kernels/internal/gemm_abi.h"
#include "tensor/dtype.h"

namespace dsi::kernels {

enum class WeightFormat : uint8_t { kF32, kBF16, kF16, kE4M3, kQ8_0, kMXFP4, kI8C };

std::string_view weight_format_name(WeightFormat f);
// "f32", "bf16", "f16", "e4m3" (alias "fp8"), "q8_0" (alias "int8"), "mxfp4",
// "i8c" (alias "w8a8"); false if unknown.
bool parse_weight_format(std::string_view name, WeightFormat* out);
// The format that keeps a stored dtype exact (kI8 etc. are not matrices).
WeightFormat native_weight_format(DType dtype);

// A matrix in its stored format (as model/weights.h's WeightMatrix, without
// owner).
struct SourceMatrix {
    DType dtype = DType::kF32;
    int64_t rows = 0;
    int64_t cols = 0;
    const uint8_t* data = nullptr;
    const float* block_scale = nullptr;  // FP8: [ceil(rows/br), ceil(cols/bc)] f32
    int64_t block_rows = 128;
    int64_t block_cols = 128;
};

class PackedMatrix {
public:
    PackedMatrix() = default;
    // A copy owns its own bytes and its view points at them (a defaulted copy would keep
    // pointing at the source's buffers). Moves keep the buffers, so the view stays valid.
    PackedMatrix(const PackedMatrix& o);
    PackedMatrix& operator=(const PackedMatrix& o);
    PackedMatrix(PackedMatrix&&) noexcept = default;
    PackedMatrix& operator=(PackedMatrix&&) noexcept = default;
    int64_t rows() const { return view_.rows; }
    int64_t cols() const { return view_.cols; }
    WeightFormat format() const { return format_; }
    // Bytes one full pass over the weights reads (data + scales).
    int64_t bytes() const {
        return view_.num_groups * view_.group_bytes +
               static_cast<int64_t>(scales_.size() * sizeof(float));
    }
    const internal::PackedView& view() const { return view_; }

private:
    friend Result<PackedMatrix> pack_matrix(const SourceMatrix& src, WeightFormat format);
    // data_ holds kDataAlign spare bytes; the view starts at its first 64-byte boundary.
    static constexpr uintptr_t kDataAlign = 64;
    static uint8_t* align_up(uint8_t* p) {
        return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kDataAlign - 1) &
                                          ~(kDataAlign - 1));
    }
    WeightFormat format_ = WeightFormat::kF32;
    std::vector<uint8_t> data_;
    std::vector<float> scales_;
    internal::PackedView view_;
};

// Packs `src` into `format`. INVALID_ARGUMENT: e4m3 from a non-FP8source or
// with block rows not a multiple of 16; q8_0 or mxfp4 with cols % 32 != 0; an
// MXFP4 source block with the NaN scale 0xff; i8c with cols > 2^17 (the int32
// sums could overflow).
Result<PackedMatrix> pack_matrix(const SourceMatrix& src, WeightFormat format);

// Row r of the packed matrix as f32 (for tests and embedding lookups).
void unpack_row(const PackedMatrix& m, int64_t r, float* out);

}  // namespace dsi::kernels
