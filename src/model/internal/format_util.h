// Shared checks, byte helpers and the writers' tensor queue for the checkpoint
// container formats (safetensors, gguf). Private to src/model/. Thread model: pure
// functions; a TensorQueue belongs to one writer and one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "tensor/dtype.h"

namespace dsi::internal {

// Most dimensions a tensor may have in any container we read.
inline constexpr size_t kMaxTensorDims = 8;

// Bytes of a tensor of `dtype` and `shape` (outermost-first). INVALID_ARGUMENT for a
// negative dimension, more than `max_dims` dimensions, an element or byte count that
// overflows int64, or a block type (Q8_0) whose innermost dimension is not a multiple
// of its block. The message names the problem only; callers add file and tensor.
Result<uint64_t> tensor_nbytes(DType dtype, std::span<const int64_t> shape,
                               size_t max_dims = kMaxTensorDims);

// Appends the low `num_bytes` bytes of `v`, little-endian.
void append_le(std::string& out, uint64_t v, int num_bytes);

// Rounds `v` up to a multiple of `alignment` (a power of two). REQUIRES: no overflow.
inline uint64_t align_up(uint64_t v, uint64_t alignment) {
    return (v + alignment - 1) & ~(alignment - 1);
}

// "'name'" with control and non-ASCII bytes escaped and long names cut, so hostile
// names cannot garble a log line.
std::string quote_name(std::string_view name);

// The bytes of a file being parsed: a mapping it owns, or bytes it borrows. Moving it
// keeps `bytes` valid (a mapping's address does not move).
struct SourceBytes {
    MappedFile mapping;  // empty when borrowed
    std::string path;
    std::span<const uint8_t> bytes;

    static SourceBytes owned(MappedFile file) {
        SourceBytes s;
        s.path = file.path();
        s.bytes = file.bytes();
        s.mapping = std::move(file);
        return s;
    }
    static SourceBytes borrowed(std::span<const uint8_t> bytes, std::string path) {
        SourceBytes s;
        s.path = std::move(path);
        s.bytes = bytes;
        return s;
    }
};

// The tensors a writer has been given, in insertion order, with the checks every
// format shares: unique names, a valid shape, and bytes matching dtype x shape. The
// first mistake is kept (naming the writer and tensor) and later adds are ignored.
class TensorQueue {
public:
    struct Tensor {
        std::string name;
        DType dtype = DType::kF32;
        std::vector<int64_t> shape;
        std::span<const uint8_t> bytes;  // into `owned`, or borrowed from the caller
        std::vector<uint8_t> owned;
    };
    // The format's own rules (reserved names, dtypes it can store); the message needs
    // no context.
    using FormatCheck = Status (*)(const Tensor& tensor);

    TensorQueue(std::string writer_name, size_t max_dims, FormatCheck check)
        : writer_name_(std::move(writer_name)), max_dims_(max_dims), check_(check) {}

    // Copies `bytes` when `copy`, else borrows them (REQUIRES they outlive the writes).
    void add(std::string name, DType dtype, std::vector<int64_t> shape,
             std::span<const uint8_t> bytes, bool copy);

    const std::vector<Tensor>& tensors() const { return tensors_; }
    uint64_t data_bytes() const { return data_bytes_; }
    const Status& error() const { return error_; }

private:
    std::string writer_name_;
    size_t max_dims_;
    FormatCheck check_;
    std::vector<Tensor> tensors_;
    std::set<std::string, std::less<>> names_;
    uint64_t data_bytes_ = 0;
    Status error_;
};

}  // namespace dsi::internal
