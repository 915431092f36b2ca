// TensorView: a typed, shaped, non-owning view of bytes (usually a memory-mapped
// checkpoint). Shape is outermost-first (row-major, as safetensors and PyTorch).
// A view lives as long as the buffer it points into.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace dsi {

inline int64_t shape_numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape);

struct TensorView {
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    std::span<const uint8_t> data;

    int64_t numel() const { return shape_numel(shape); }
};

}  // namespace dsi
