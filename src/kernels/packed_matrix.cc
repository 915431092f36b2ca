#include "kernels/packed_matrix.h"

#include <cstring>

#include "kernels/internal/gemm_i8c.h"
#include "kernels/internal/gemm_mxfp4.h"
#include "kernels/matmul.h"

namespace dsi::kernels {

using internal::kGroupRows;
using internal::kQ8Block;
using internal::kQ8BlockBytes;
using internal::PackFormat;

std::string_view weight_format_name(WeightFormat f) {
    switch (f) {
        case WeightFormat::kF32:
            return "f32";
        case WeightFormat::kBF16:
            return "bf16";
        case WeightFormat::kF16:
            return "f16";
        case WeightFormat::kE4M3:
            return "e4m3";
        case WeightFormat::kQ8_0:
            return "q8_0";
        case WeightFormat::kMXFP4:
            return "mxfp4";
        case WeightFormat::kI8C:
            return "i8c";
    }
    return "?";
}

bool parse_weight_format(std::string_view name, WeightFormat* out) {
    if (name == "fp8")
        name = "e4m3";
    if (name == "int8")
        name = "q8_0";
    if (name == "w8a8")
        name = "i8c";
    for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kF16,
                           WeightFormat::kE4M3, WeightFormat::kQ8_0, WeightFormat::kMXFP4,
                           WeightFormat::kI8C}) {
        if (name == weight_format_name(f)) {
            *out = f;
            return true;
        }
    }
    return false;
}

WeightFormat native_weight_format(DType dtype) {
    switch (dtype) {
        case DType::kBF16:
            return WeightFormat::kBF16;
        case DType::kF16:
            return WeightFormat::kF16;
        case DType::kF8E4M3:
            return WeightFormat::kE4M3;
        case DType::kQ8_0:
            return WeightFormat::kQ8_0;
        case DType::kMXFP4:
            return WeightFormat::kMXFP4;
        default:
            return WeightFormat::kF32;
    }
}

namespace {

// Row r of the source as f32, with FP8 block scales applied.
void source_row(const SourceMatrix& s, int64_t r, float* out) {
    dequantize_row(s.dtype, s.data + r * dtype_row_bytes(s.dtype, s.cols), out, s.cols);
    if (s.dtype == DType::kF8E4M3 && s.block_scale != nullptr) {
        const int64_t ncb = (s.cols + s.block_cols - 1) / s.block_cols;
        const float* sc = s.block_scale + (r / s.block_rows) * ncb;
        for (int64_t c = 0; c < s.cols; ++c)
            out[c] *= sc[c / s.block_cols];
    }
}

int64_t element_bytes(WeightFormat f) {
    switch (f) {
        case WeightFormat::kF32:
            return 4;
        case WeightFormat::kBF16:
        case WeightFormat::kF16:
            return 2;
        default:
            return 1;
    }
}

PackFormat pack_format(WeightFormat f) {
    switch (f) {
        case WeightFormat::kF32:
            return PackFormat::kF32;
        case WeightFormat::kBF16:
            return PackFormat::kBF16;
        case WeightFormat::kF16:
            return PackFormat::kF16;
        case WeightFormat::kE4M3:
            return PackFormat::kE4M3;
        case WeightFormat::kQ8_0:
            return PackFormat::kQ8;
        case WeightFormat::kMXFP4:
            return PackFormat::kMXFP4;
        case WeightFormat::kI8C:
            return PackFormat::kI8C;
    }
    return PackFormat::kF32;
}

// Writes one Q8_0 row (34-byte blocks) into row `i` of group `group`.
void put_q8_row(const uint8_t* q8_row, int64_t cols, int i, uint8_t* group) {
    for (int64_t b = 0; b < cols / kQ8Block; ++b) {
        const uint8_t* src = q8_row + b * 34;
        uint8_t* blk = group + b * kQ8BlockBytes;
        std::memcpy(blk + 2 * i, src, 2);
        for (int j = 0; j < kQ8Block; ++j) {
            int v = static_cast<int8_t>(src[2 + j]);
            if (v < -127)
                v = -127;  // the AVX2 sign trick needs |w| <= 127
            blk[32 + ((j / 4) * kGroupRows + i) * 4 + j % 4] = static_cast<uint8_t>(v + 128);
        }
    }
}

// Writes one GGUF MXFP4 row (17-byte blocks) into row `i` of group `group`
// (layout: internal/gemm_mxfp4.h). False if a block has the NaN scale 0xff.
bool put_mxfp4_row(const uint8_t* mx_row, int64_t cols, int i, uint8_t* group) {
    for (int64_t b = 0; b < cols / internal::kMxfp4Block; ++b) {
        const uint8_t* src = mx_row + b * 17;
        if (src[0] == 0xff)
            return false;
        uint8_t* blk = group + b * internal::kMxfp4BlockBytes;
        blk[i] = src[0];
        for (int k = 0; k < internal::kMxfp4Block; ++k) {
            // GGUF: byte 1 + j holds element j (low nibble) and j + 16 (high).
            const int code = k < 16 ? (src[1 + k] & 0x0f) : (src[1 + k - 16] >> 4);
            uint8_t& dst = blk[16 + (k / 8) * 64 + i * 4 + k % 4];
            dst = static_cast<uint8_t>((k % 8) < 4 ? (dst & 0xf0) | code : (dst & 0x0f) | (code << 4));
        }
    }
    return true;
}

// Quantises one f32 row to int8 with one scale (d = amax / 127, q = rne(w / d): the
// activation quantiser's formula, so its vector code is used) into row `i` of an i8c
// group (layout: internal/gemm_i8c.h); returns d. `q` is scratch of padded_cols bytes.
float put_i8c_row(const float* row, int64_t cols, int64_t padded_cols, int i, int8_t* q,
                  uint8_t* group) {
    float d;
    int32_t s128;
    quantize_act_i8c(active_isa(), row, cols, padded_cols, q, &d, &s128);
    for (int64_t k = 0; k < cols; k += 4) {
        uint32_t quad;
        std::memcpy(&quad, q + k, 4);
        quad ^= 0x80808080u;  // + 128 per byte
        std::memcpy(group + (k / 4) * 64 + i * 4, &quad, 4);
    }
    return d;
}

}  // namespace

PackedMatrix::PackedMatrix(const PackedMatrix& o)
    : format_(o.format_), data_(o.data_.size()), scales_(o.scales_), view_(o.view_) {
    // The new buffer may sit at another offset from a 64-byte boundary: copy the payload
    // to this buffer's aligned start.
    uint8_t* base = align_up(data_.data());
    if (o.view_.data != nullptr)
        std::memcpy(base, o.view_.data, static_cast<size_t>(o.view_.num_groups * o.view_.group_bytes));
    view_.data = base;
    view_.scales = scales_.empty() ? nullptr : scales_.data();
}

PackedMatrix& PackedMatrix::operator=(const PackedMatrix& o) {
    if (this != &o) {
        *this = PackedMatrix(o);
    }
    return *this;
}

Result<PackedMatrix> pack_matrix(const SourceMatrix& src, WeightFormat format) {
    const int64_t R = src.rows;
    const int64_t K = src.cols;
    if (format == WeightFormat::kE4M3) {
        if (src.dtype != DType::kF8E4M3 || src.block_scale == nullptr) {
            return invalid_argument("pack_matrix: e4m3 needs an FP8 source with block scales");
        }
        if (src.block_rows % kGroupRows != 0) {
            return invalid_argument("pack_matrix: FP8 block rows must be a multiple of 16");
        }
    }
    if (format == WeightFormat::kQ8_0 && K % kQ8Block != 0) {
        return invalid_argument("pack_matrix: q8_0 needs cols % 32 == 0, got " + std::to_string(K));
    }
    if (format == WeightFormat::kMXFP4 && K % internal::kMxfp4Block != 0) {
        return invalid_argument("pack_matrix: mxfp4 needs cols % 32 == 0, got " + std::to_string(K));
    }
    if (format == WeightFormat::kI8C && K > internal::kI8cMaxCols) {
        return invalid_argument("pack_matrix: i8c needs cols <= 131072, got " + std::to_string(K));
    }
    PackedMatrix m;
    m.format_ = format;
    internal::PackedView& v = m.view_;
    v.format = pack_format(format);
    v.rows = R;
    v.cols = K;
    v.num_groups = (R + kGroupRows - 1) / kGroupRows;
    v.group_bytes = format == WeightFormat::kQ8_0 ? (K / kQ8Block) * kQ8BlockBytes
                    : format == WeightFormat::kMXFP4
                        ? (K / internal::kMxfp4Block) * internal::kMxfp4BlockBytes
                    : format == WeightFormat::kI8C ? internal::i8c_padded_cols(K) * kGroupRows
                                                   : K * kGroupRows * element_bytes(format);
    // Zero padding: tail rows are 0 (q8: scale 0 and biased 128).
    // kDataAlign spare bytes: the groups start at a 64-byte boundary, so every 64-byte
    // vector load or AMX tile row is one cache line (a tile row straddling two lines
    // measured ~1.4x slower on the i8c AMX GEMM).
    m.data_.assign(static_cast<size_t>(v.num_groups * v.group_bytes + PackedMatrix::kDataAlign), 0);
    if (format == WeightFormat::kI8C) {
        // Padded rows and columns hold w = 0 (biased 128), with scale 0.
        v.padded_cols = internal::i8c_padded_cols(K);
        m.data_.assign(m.data_.size(), 128);
        m.scales_.assign(static_cast<size_t>(v.num_groups * kGroupRows), 0.0f);
    }
    std::vector<float> row(static_cast<size_t>(K));
    std::vector<uint8_t> q8(static_cast<size_t>(K / kQ8Block * 34 + 34));
    std::vector<int8_t> i8c_q(static_cast<size_t>(v.padded_cols));
    for (int64_t r = 0; r < R; ++r) {
        const int64_t g = r / kGroupRows;
        const int i = static_cast<int>(r % kGroupRows);
        uint8_t* group = PackedMatrix::align_up(m.data_.data()) + g * v.group_bytes;
        const uint8_t* srow = src.data + r * dtype_row_bytes(src.dtype, K);
        if (format == WeightFormat::kMXFP4) {
            const uint8_t* mx = srow;
            if (src.dtype != DType::kMXFP4) {
                source_row(src, r, row.data());
                quantize_row_mxfp4(row.data(), q8.data(), K);
                mx = q8.data();
            }
            if (!put_mxfp4_row(mx, K, i, group)) {
                return invalid_argument("pack_matrix: MXFP4 row " + std::to_string(r) +
                                        " has the NaN scale 0xff");
            }
            continue;
        }
        if (format == WeightFormat::kI8C) {
            source_row(src, r, row.data());
            m.scales_[static_cast<size_t>(r)] =
                put_i8c_row(row.data(), K, v.padded_cols, i, i8c_q.data(), group);
            continue;
        }
        if (format == WeightFormat::kQ8_0) {
            if (src.dtype == DType::kQ8_0) {
                put_q8_row(srow, K, i, group);
            } else {
                source_row(src, r, row.data());
                quantize_row_q8_0(row.data(), q8.data(), K);
                put_q8_row(q8.data(), K, i, group);
            }
            continue;
        }
        const int64_t eb = element_bytes(format);
        const bool same = (src.dtype == DType::kF32 && format == WeightFormat::kF32) ||
                          (src.dtype == DType::kBF16 && format == WeightFormat::kBF16) ||
                          (src.dtype == DType::kF16 && format == WeightFormat::kF16) ||
                          (src.dtype == DType::kF8E4M3 && format == WeightFormat::kE4M3);
        if (same) {
            // Exact copy of the stored element (e4m3 codes without their scale).
            for (int64_t k = 0; k < K; ++k) {
                std::memcpy(group + (k * kGroupRows + i) * eb, srow + k * eb, eb);
            }
            continue;
        }
        source_row(src, r, row.data());
        for (int64_t k = 0; k < K; ++k) {
            uint8_t* dst = group + (k * kGroupRows + i) * eb;
            if (format == WeightFormat::kF32) {
                std::memcpy(dst, &row[k], 4);
            } else {
                uint16_t h =
                    format == WeightFormat::kBF16 ? f32_to_bf16(row[k]) : f32_to_f16(row[k]);
                std::memcpy(dst, &h, 2);
            }
        }
    }
    if (format == WeightFormat::kE4M3) {
        const int64_t ncb = (K + src.block_cols - 1) / src.block_cols;
        v.scale_blocks = ncb;
        v.scale_block_cols = src.block_cols;
        m.scales_.assign(static_cast<size_t>(v.num_groups * ncb), 0.0f);
        for (int64_t g = 0; g < v.num_groups; ++g) {
            const int64_t rb = g * kGroupRows / src.block_rows;
            for (int64_t kb = 0; kb < ncb; ++kb)
                m.scales_[g * ncb + kb] = src.block_scale[rb * ncb + kb];
        }
        v.scales = m.scales_.data();
    }
    if (format == WeightFormat::kI8C)
        v.scales = m.scales_.data();
    v.data = PackedMatrix::align_up(m.data_.data());
    return m;
}

void unpack_row(const PackedMatrix& m, int64_t r, float* out) {
    const internal::PackedView& v = m.view();
    const int64_t g = r / kGroupRows;
    const int i = static_cast<int>(r % kGroupRows);
    const uint8_t* group = v.data + g * v.group_bytes;
    for (int64_t k = 0; k < v.cols; ++k) {
        const int64_t idx = k * kGroupRows + i;
        switch (v.format) {
            case PackFormat::kF32:
                std::memcpy(&out[k], group + idx * 4, 4);
                break;
            case PackFormat::kBF16: {
                uint16_t h;
                std::memcpy(&h, group + idx * 2, 2);
                out[k] = bf16_to_f32(h);
                break;
            }
            case PackFormat::kF16: {
                uint16_t h;
                std::memcpy(&h, group + idx * 2, 2);
                out[k] = f16_to_f32(h);
                break;
            }
            case PackFormat::kE4M3:
                out[k] =
                    e4m3_to_f32(group[idx]) * v.scales[g * v.scale_blocks + k / v.scale_block_cols];
                break;
            case PackFormat::kMXFP4: {
                const uint8_t* blk = group + (k / 32) * internal::kMxfp4BlockBytes;
                out[k] = internal::kMxfp4Values[internal::mxfp4_code(blk, i, k % 32)] *
                         internal::mxfp4_scale(blk[i]);
                break;
            }
            case PackFormat::kI8C: {
                const int q = static_cast<int>(group[(k / 4) * 64 + i * 4 + k % 4]) - 128;
                out[k] = static_cast<float>(q) * v.scales[r];
                break;
            }
            case PackFormat::kQ8: {
                const int64_t b = k / kQ8Block;
                const int j = static_cast<int>(k % kQ8Block);
                const uint8_t* blk = group + b * kQ8BlockBytes;
                uint16_t dh;
                std::memcpy(&dh, blk + 2 * i, 2);
                const int q =
                    static_cast<int>(blk[32 + ((j / 4) * kGroupRows + i) * 4 + j % 4]) - 128;
                out[k] = f16_to_f32(dh) * static_cast<float>(q);
                break;
            }
        }
    }
}

}  // namespace dsi::kernels
