// Linear layers shared by the DeepSeek forward passes (V2/V3 and V4): a weight
// matrix as stored plus its kernels/ repacking, and the per-class weight-format
// choice of --weight-format (deepseek.h Options::weight_format). Private to
// src/model/. Thread model: a Linear is immutable after packing.
#pragma once

#include <array>
#include <optional>
#include <string>

#include "base/status.h"
#include "kernels/packed_matrix.h"
#include "model/weights.h"

namespace dsi::internal {

// A linear layer's weights: as stored (for the reference path and for lookups)
// and repacked for kernels/ (unless the reference path is on).
struct Linear {
    WeightMatrix w;
    kernels::PackedMatrix packed;
    bool is_packed = false;
    int64_t rows() const { return w.rows; }
};

// Tensor classes that --weight-format chooses formats for.
enum class WeightClass { kAttn, kMlp, kShared, kExperts, kRouter, kHead, kCount };

// Per WeightClass: the format to repack into; nullopt = the stored one.
using ClassFormats =
    std::array<std::optional<kernels::WeightFormat>, static_cast<size_t>(WeightClass::kCount)>;

// Parses a weight_format spec ("auto", one format, or class=format,...).
Status parse_weight_formats(const std::string& spec, ClassFormats& out);

// Packs lin.w into the class's format; a format the tensor cannot take falls back to
// its stored one.
Status pack_linear(const ClassFormats& formats, WeightClass cls, Linear& lin);

}  // namespace dsi::internal
