#include "model/internal/format_util.h"

#include <limits>

#include "tensor/tensor.h"

namespace dsi::internal {

Result<uint64_t> tensor_nbytes(DType dtype, std::span<const int64_t> shape, size_t max_dims) {
    if (shape.size() > max_dims) {
        return invalid_argument("has " + std::to_string(shape.size()) +
                                " dimensions, more than the limit of " + std::to_string(max_dims));
    }
    int64_t numel = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] < 0) {
            return invalid_argument("dimension " + std::to_string(i) + " is negative (" +
                                    std::to_string(shape[i]) + ")");
        }
        if (__builtin_mul_overflow(numel, shape[i], &numel)) {
            return invalid_argument("element count overflows int64");
        }
    }
    int64_t block = dtype_block_elems(dtype);
    if (block > 1) {
        int64_t inner = shape.empty() ? 1 : shape.back();
        if (inner % block != 0) {
            return invalid_argument("innermost dimension " + std::to_string(inner) + " of a " +
                                    std::string(dtype_name(dtype)) +
                                    " tensor is not a multiple of " + std::to_string(block));
        }
    }
    int64_t nbytes = 0;
    if (__builtin_mul_overflow(numel / block, dtype_block_bytes(dtype), &nbytes)) {
        return invalid_argument("byte size overflows int64");
    }
    return static_cast<uint64_t>(nbytes);
}

void append_le(std::string& out, uint64_t v, int num_bytes) {
    for (int i = 0; i < num_bytes; ++i) {
        out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    }
}

std::string quote_name(std::string_view name) {
    constexpr size_t kMaxShown = 200;
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out = "'";
    for (size_t i = 0; i < name.size() && i < kMaxShown; ++i) {
        auto c = static_cast<unsigned char>(name[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out.push_back(static_cast<char>(c));
        } else {
            out += "\\x";
            out.push_back(kHex[c >> 4]);
            out.push_back(kHex[c & 15]);
        }
    }
    if (name.size() > kMaxShown) out += "...";
    return out + "'";
}

void TensorQueue::add(std::string name, DType dtype, std::vector<int64_t> shape,
                      std::span<const uint8_t> bytes, bool copy) {
    if (!error_.is_ok()) return;
    Tensor t{std::move(name), dtype, std::move(shape), bytes, {}};
    const std::string context = writer_name_ + ": tensor " + quote_name(t.name);
    if (names_.count(t.name) != 0) {
        error_ = invalid_argument(context + ": added twice");
        return;
    }
    if (Status s = check_(t); !s.is_ok()) {
        error_ = s.with_context(context);
        return;
    }
    Result<uint64_t> nbytes = tensor_nbytes(t.dtype, t.shape, max_dims_);
    if (!nbytes.is_ok()) {
        error_ = nbytes.status().with_context(context);
        return;
    }
    if (*nbytes != t.bytes.size()) {
        error_ = invalid_argument(context + ": " + std::to_string(t.bytes.size()) +
                                  " bytes given, " + std::string(dtype_name(t.dtype)) + " " +
                                  shape_to_string(t.shape) + " needs " + std::to_string(*nbytes));
        return;
    }
    if (copy) {
        t.owned.assign(bytes.begin(), bytes.end());
        t.bytes = t.owned;  // the vector's buffer does not move with the Tensor
    }
    names_.insert(t.name);
    data_bytes_ += t.bytes.size();
    tensors_.push_back(std::move(t));
}

}  // namespace dsi::internal
