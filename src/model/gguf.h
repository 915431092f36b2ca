// GGUF checkpoints (llama.cpp, versions 2 and 3): read a memory-mapped file's key/value
// metadata and tensor table, and write files of the same layout.
//
// Layout (little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count;
// kv_count x (string key, u32 value type, value); tensor_count x (string name, u32
// n_dims, u64 ne[n_dims] fastest-first, u32 ggml type, u64 offset); padding to
// `alignment` (general.alignment, default 32); the data section. A string is a u64
// length and its bytes; an array is a u32 element type, a u64 count and the elements.
//
// Parsing is the trust boundary: every malformed input is a Status whose message names
// the file and, where there is one, the key or tensor. Counts and lengths are checked
// against the bytes that remain before anything is allocated. Codes:
//   DATA_LOSS         the file ends before its header does (truncated).
//   OUT_OF_RANGE      a tensor's data reaches past the end of the file.
//   INVALID_ARGUMENT  anything else malformed (magic, version, types, shapes, layout),
//                     and tensor types we do not support (named with their type id).
//   NOT_FOUND         a missing file, key or tensor.
//
// Thread model: a parsed GgufFile is immutable, so const methods may be called from
// any number of threads. GgufWriter is single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "model/internal/format_util.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace dsi {

// GGUF value type ids as stored in the file.
enum class GgufType : uint32_t {
    kU8 = 0,
    kI8 = 1,
    kU16 = 2,
    kI16 = 3,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kU64 = 10,
    kI64 = 11,
    kF64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// An array of one scalar or string type. Arrays of arrays are not supported (nor by
// llama.cpp). Alternatives are in type-id order, skipping kArray.
using GgufArray = std::variant<std::vector<uint8_t>, std::vector<int8_t>, std::vector<uint16_t>,
                               std::vector<int16_t>, std::vector<uint32_t>, std::vector<int32_t>,
                               std::vector<float>, std::vector<bool>, std::vector<std::string>,
                               std::vector<uint64_t>, std::vector<int64_t>, std::vector<double>>;

// One metadata value: a scalar, a string or an array. Scalar alternatives are in
// type-id order, skipping kArray; the array comes last. Construct with the exact C++
// type to pick the GGUF type, e.g. GgufValue(uint32_t{7}) or
// GgufValue(GgufArray(std::vector<std::string>{...})).
using GgufValue = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, uint64_t, int64_t, double, GgufArray>;

GgufType gguf_value_type(const GgufValue& v);  // kArray for arrays
GgufType gguf_array_type(const GgufArray& a);  // the element type

// ggml tensor type ids we map to a DType (others are "unsupported dtype").
inline constexpr uint32_t kGgmlTypeF32 = 0;
inline constexpr uint32_t kGgmlTypeF16 = 1;
inline constexpr uint32_t kGgmlTypeQ8_0 = 8;
inline constexpr uint32_t kGgmlTypeI8 = 24;
inline constexpr uint32_t kGgmlTypeI32 = 26;
inline constexpr uint32_t kGgmlTypeI64 = 27;
inline constexpr uint32_t kGgmlTypeF64 = 28;  // no DType yet: unsupported
inline constexpr uint32_t kGgmlTypeBF16 = 30;
inline constexpr uint32_t kGgmlTypeMXFP4 = 39;  // block_mxfp4: e8m0 + 16 bytes of e2m1 pairs
std::optional<DType> dtype_from_ggml_type(uint32_t type_id);
std::optional<uint32_t> ggml_type_from_dtype(DType dtype);

inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr std::string_view kGgufAlignmentKey = "general.alignment";
// Limits shared with llama.cpp's reader (GGML_MAX_DIMS, GGML_MAX_NAME - 1).
inline constexpr uint32_t kGgufMaxDims = 4;
inline constexpr size_t kGgufMaxTensorNameBytes = 63;

struct GgufTensorInfo {
    std::string name;
    DType dtype = DType::kF32;
    uint32_t ggml_type = 0;
    std::vector<int64_t> shape;  // outermost-first (GGUF's ne[] reversed)
    uint64_t offset = 0;         // relative to the data section, a multiple of alignment
    uint64_t nbytes = 0;
};

// One GGUF file. Owns its mapping (or borrows bytes, see parse_bytes); views point
// into it and live as long as this object (moving it keeps them valid).
class GgufFile {
public:
    static Result<GgufFile> open(Env* env, const std::string& path);
    // Takes ownership of a mapping (from Env::map_file); its path names errors.
    static Result<GgufFile> parse(MappedFile file);
    // Borrows `bytes`: REQUIRES they outlive the result. Errors name `path`.
    static Result<GgufFile> parse_bytes(std::span<const uint8_t> bytes,
                                        std::string path = "<memory>");

    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    const std::string& path() const { return source_.path; }

    // Key/value pairs in file order.
    const std::vector<std::pair<std::string, GgufValue>>& kvs() const { return kvs_; }
    // nullptr when absent.
    const GgufValue* find_kv(std::string_view key) const;

    // Typed getters: NOT_FOUND for a missing key, INVALID_ARGUMENT for a value of
    // another type, OUT_OF_RANGE for an integer that does not fit; messages name the
    // file and key. Integer getters accept any integer type whose value fits; float
    // getters accept f32 and f64.
    Result<uint32_t> get_u32(std::string_view key) const;
    Result<int32_t> get_i32(std::string_view key) const;
    Result<uint64_t> get_u64(std::string_view key) const;
    Result<int64_t> get_i64(std::string_view key) const;
    Result<float> get_f32(std::string_view key) const;
    Result<double> get_f64(std::string_view key) const;
    Result<bool> get_bool(std::string_view key) const;
    Result<std::string> get_string(std::string_view key) const;
    Result<std::vector<std::string>> get_string_array(std::string_view key) const;
    Result<std::vector<float>> get_f32_array(std::string_view key) const;
    Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;
    Result<std::vector<int64_t>> get_i64_array(std::string_view key) const;

    // Tensors in file order.
    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
    // nullptr when absent.
    const GgufTensorInfo* find_tensor(std::string_view name) const;
    // NOT_FOUND naming the file and tensor when absent.
    Result<TensorView> view(std::string_view name) const;
    // REQUIRES: `info` is one of tensors().
    TensorView view(const GgufTensorInfo& info) const;

private:
    GgufFile() = default;
    static Result<GgufFile> parse_impl(internal::SourceBytes source);
    template <typename T>
    Result<T> get_integer(std::string_view key) const;
    template <typename T>
    Result<std::vector<T>> get_integer_array(std::string_view key) const;
    Result<const GgufValue*> lookup(std::string_view key) const;
    Status wrong_type(std::string_view key, const GgufValue& v, std::string_view want) const;

    internal::SourceBytes source_;
    std::span<const uint8_t> data_;  // the data section
    uint32_t version_ = 0;
    uint32_t alignment_ = kGgufDefaultAlignment;
    std::vector<std::pair<std::string, GgufValue>> kvs_;
    std::map<std::string, size_t, std::less<>> kv_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a GGUF v3 file: key/values and tensor infos in insertion order, then tensor
// data, each tensor padded to the alignment (32, or a u32 general.alignment the caller
// adds) exactly as llama.cpp writes and expects. Mistakes in add_*() (duplicate key or
// tensor, empty or over-long name, dtype without a ggml type, more than 4 dimensions,
// byte count not matching shape, nested array) are reported by serialize()/write().
// Memory: the file is assembled in one buffer before Env::write_file, so peak memory
// is the file size plus copied tensors; use add_tensor_borrowed for big tensors.
class GgufWriter {
public:
    GgufWriter();

    void add_kv(std::string key, GgufValue value);
    // Copies `bytes`. `shape` is outermost-first.
    void add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                    std::span<const uint8_t> bytes);
    // Borrows `bytes`: REQUIRES they stay alive and unchanged until the last
    // serialize()/write() call returns.
    void add_tensor_borrowed(std::string name, DType dtype, std::vector<int64_t> shape,
                             std::span<const uint8_t> bytes);

    Result<std::string> serialize() const;
    Status write(Env* env, const std::string& path) const;

private:
    std::vector<std::pair<std::string, GgufValue>> kvs_;
    std::map<std::string, size_t, std::less<>> kv_names_;
    internal::TensorQueue queue_;
    uint32_t alignment_ = kGgufDefaultAlignment;
    Status kv_error_;  // first add_kv() mistake
};

}  // namespace dsi
