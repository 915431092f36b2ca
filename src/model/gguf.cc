#include "model/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>

#include "model/internal/format_util.h"

namespace dsi {

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");
static_assert(std::variant_size_v<GgufValue> == 13 && std::variant_size_v<GgufArray> == 12);

namespace {

using internal::quote_name;

constexpr uint32_t kGgufVersion = 3;
constexpr uint32_t kMaxGgufType = static_cast<uint32_t>(GgufType::kF64);
// Smallest encodings: a kv is key length + type + 1-byte value; a tensor info is name
// length + n_dims + type + offset. Counts are checked against these before reserving.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;

std::string file_context(const std::string& path) { return "gguf '" + path + "'"; }

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Calls fn.template operator()<T>() with the C++ type of the non-array GGUF type `t`.
template <typename Fn>
decltype(auto) with_item_type(GgufType t, Fn&& fn) {
    switch (t) {
        case GgufType::kU8: return fn.template operator()<uint8_t>();
        case GgufType::kI8: return fn.template operator()<int8_t>();
        case GgufType::kU16: return fn.template operator()<uint16_t>();
        case GgufType::kI16: return fn.template operator()<int16_t>();
        case GgufType::kU32: return fn.template operator()<uint32_t>();
        case GgufType::kI32: return fn.template operator()<int32_t>();
        case GgufType::kF32: return fn.template operator()<float>();
        case GgufType::kBool: return fn.template operator()<bool>();
        case GgufType::kString: return fn.template operator()<std::string>();
        case GgufType::kU64: return fn.template operator()<uint64_t>();
        case GgufType::kI64: return fn.template operator()<int64_t>();
        case GgufType::kF64: return fn.template operator()<double>();
        case GgufType::kArray: break;
    }
    DSI_CHECK(false, "with_item_type on type ", static_cast<uint32_t>(t));
    return fn.template operator()<uint8_t>();  // unreachable
}

template <typename T>
constexpr uint64_t min_item_bytes() {
    if constexpr (std::is_same_v<T, std::string>) {
        return 8;  // the length
    } else {
        return sizeof(T);
    }
}

// Bounds-checked little-endian cursor over the file. Errors name the byte offset; the
// caller adds the file, key or tensor.
class ByteReader {
public:
    explicit ByteReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return bytes_.size() - pos_; }

    Result<std::span<const uint8_t>> take(uint64_t n, std::string_view what) {
        if (n > remaining()) {
            return data_loss("file ends at byte " + std::to_string(bytes_.size()) +
                             " while reading " + std::string(what) + " (" + std::to_string(n) +
                             " bytes at byte " + std::to_string(pos_) + ")");
        }
        std::span<const uint8_t> out = bytes_.subspan(pos_, n);
        pos_ += n;
        return out;
    }

    template <typename T>
    Result<T> scalar(std::string_view what) {
        DSI_ASSIGN_OR_RETURN(auto b, take(sizeof(T), what));
        T v;
        std::memcpy(&v, b.data(), sizeof(T));
        return v;
    }

    Result<std::string> string(std::string_view what) {
        DSI_ASSIGN_OR_RETURN(uint64_t len, scalar<uint64_t>(what));
        DSI_ASSIGN_OR_RETURN(auto b, take(len, what));
        return std::string(reinterpret_cast<const char*>(b.data()), b.size());
    }

    // One array item or scalar value of type T.
    template <typename T>
    Result<T> item() {
        if constexpr (std::is_same_v<T, std::string>) {
            return string("a string");
        } else if constexpr (std::is_same_v<T, bool>) {
            DSI_ASSIGN_OR_RETURN(uint8_t b, scalar<uint8_t>("a bool"));
            if (b > 1) {
                return invalid_argument("bool value " + std::to_string(b) + " is neither 0 nor 1");
            }
            return b == 1;
        } else {
            return scalar<T>("a value");
        }
    }

private:
    std::span<const uint8_t> bytes_;
    uint64_t pos_ = 0;
};

Result<GgufType> read_type(ByteReader& r, std::string_view what) {
    DSI_ASSIGN_OR_RETURN(uint32_t raw, r.scalar<uint32_t>(what));
    if (raw > kMaxGgufType) {
        return invalid_argument("unknown value type " + std::to_string(raw));
    }
    return static_cast<GgufType>(raw);
}

Result<GgufArray> read_array(ByteReader& r) {
    DSI_ASSIGN_OR_RETURN(GgufType type, read_type(r, "the array type"));
    if (type == GgufType::kArray) return invalid_argument("nested arrays are not supported");
    DSI_ASSIGN_OR_RETURN(uint64_t count, r.scalar<uint64_t>("the array length"));
    return with_item_type(type, [&]<typename T>() -> Result<GgufArray> {
        if (count > r.remaining() / min_item_bytes<T>()) {
            return data_loss("array of " + std::to_string(count) + " " +
                             std::string(gguf_type_name(type)) + " items cannot fit in the " +
                             std::to_string(r.remaining()) + " bytes left");
        }
        std::vector<T> items;
        if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
            DSI_ASSIGN_OR_RETURN(auto b, r.take(count * sizeof(T), "array items"));
            items.resize(count);
            if (count > 0) std::memcpy(items.data(), b.data(), b.size());  // data() may be null
        } else {
            items.reserve(count);
            for (uint64_t i = 0; i < count; ++i) {
                Result<T> item = r.template item<T>();
                if (!item.is_ok()) {
                    return item.status().with_context("array item " + std::to_string(i));
                }
                items.push_back(std::move(item).value());
            }
        }
        return GgufArray(std::in_place_type<std::vector<T>>, std::move(items));
    });
}

Result<GgufValue> read_value(ByteReader& r) {
    DSI_ASSIGN_OR_RETURN(GgufType type, read_type(r, "the value type"));
    if (type == GgufType::kArray) {
        DSI_ASSIGN_OR_RETURN(GgufArray array, read_array(r));
        return GgufValue(std::move(array));
    }
    return with_item_type(type, [&]<typename T>() -> Result<GgufValue> {
        DSI_ASSIGN_OR_RETURN(T v, r.template item<T>());
        return GgufValue(std::in_place_type<T>, std::move(v));
    });
}

// One tensor info record; the caller checks names for duplicates and the layout.
Result<GgufTensorInfo> read_tensor_info(ByteReader& r) {
    GgufTensorInfo t;
    DSI_ASSIGN_OR_RETURN(uint32_t n_dims, r.scalar<uint32_t>("n_dims"));
    if (n_dims > kGgufMaxDims) {
        return invalid_argument("n_dims " + std::to_string(n_dims) + " exceeds the limit of " +
                                std::to_string(kGgufMaxDims));
    }
    t.shape.resize(n_dims);
    for (uint32_t j = 0; j < n_dims; ++j) {
        DSI_ASSIGN_OR_RETURN(uint64_t ne, r.scalar<uint64_t>("ne"));
        if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            return invalid_argument("ne[" + std::to_string(j) + "] = " + std::to_string(ne) +
                                    " is too large");
        }
        t.shape[n_dims - 1 - j] = static_cast<int64_t>(ne);  // ne[] is fastest-first
    }
    DSI_ASSIGN_OR_RETURN(t.ggml_type, r.scalar<uint32_t>("the tensor type"));
    DSI_ASSIGN_OR_RETURN(t.offset, r.scalar<uint64_t>("the tensor offset"));
    std::optional<DType> dtype = dtype_from_ggml_type(t.ggml_type);
    if (!dtype) {
        return invalid_argument("unsupported dtype (ggml type id " + std::to_string(t.ggml_type) +
                                ")");
    }
    t.dtype = *dtype;
    DSI_ASSIGN_OR_RETURN(t.nbytes, internal::tensor_nbytes(t.dtype, t.shape, kGgufMaxDims));
    return t;
}

Status check_tensor_name(std::string_view name) {
    if (name.empty()) return invalid_argument("empty tensor name");
    if (name.size() > kGgufMaxTensorNameBytes) {
        return invalid_argument("tensor name of " + std::to_string(name.size()) +
                                " bytes exceeds the limit of " +
                                std::to_string(kGgufMaxTensorNameBytes));
    }
    return Status::ok();
}

// Tensors must lie in the data section, start on the alignment and not overlap
// (llama.cpp further expects them packed in file order, as GgufWriter writes them).
Status check_layout(const std::vector<GgufTensorInfo>& tensors, uint64_t data_size,
                    uint32_t alignment) {
    std::vector<const GgufTensorInfo*> sorted;
    sorted.reserve(tensors.size());
    for (const GgufTensorInfo& t : tensors) {
        std::string where = "tensor " + quote_name(t.name) + ": offset " + std::to_string(t.offset);
        if (t.offset % alignment != 0) {
            return invalid_argument(where + " is not a multiple of the alignment " +
                                    std::to_string(alignment));
        }
        if (t.offset > data_size || t.nbytes > data_size - t.offset) {
            return out_of_range(where + " + " + std::to_string(t.nbytes) +
                                " bytes reaches past the end of the data section (" +
                                std::to_string(data_size) + " bytes)");
        }
        sorted.push_back(&t);
    }
    std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
        return std::tie(a->offset, a->nbytes) < std::tie(b->offset, b->nbytes);
    });
    for (size_t i = 1; i < sorted.size(); ++i) {
        const GgufTensorInfo& prev = *sorted[i - 1];
        if (sorted[i]->offset < prev.offset + prev.nbytes) {
            return invalid_argument("tensor " + quote_name(sorted[i]->name) + " overlaps tensor " +
                                    quote_name(prev.name));
        }
    }
    return Status::ok();
}

std::string describe_type(const GgufValue& v) {
    if (const auto* a = std::get_if<GgufArray>(&v)) {
        return "array of " + std::string(gguf_type_name(gguf_array_type(*a)));
    }
    return std::string(gguf_type_name(gguf_value_type(v)));
}

template <typename T>
constexpr bool is_integer_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;

}  // namespace

std::string_view gguf_type_name(GgufType t) {
    switch (t) {
        case GgufType::kU8: return "u8";
        case GgufType::kI8: return "i8";
        case GgufType::kU16: return "u16";
        case GgufType::kI16: return "i16";
        case GgufType::kU32: return "u32";
        case GgufType::kI32: return "i32";
        case GgufType::kF32: return "f32";
        case GgufType::kBool: return "bool";
        case GgufType::kString: return "string";
        case GgufType::kArray: return "array";
        case GgufType::kU64: return "u64";
        case GgufType::kI64: return "i64";
        case GgufType::kF64: return "f64";
    }
    return "?";
}

// Variant indices follow type ids with kArray (9) left out of the scalars and moved to
// the end of GgufValue.
GgufType gguf_value_type(const GgufValue& v) {
    size_t i = v.index();
    if (i == 12) return GgufType::kArray;
    return static_cast<GgufType>(i < 9 ? i : i + 1);
}

GgufType gguf_array_type(const GgufArray& a) {
    size_t i = a.index();
    return static_cast<GgufType>(i < 9 ? i : i + 1);
}

std::optional<DType> dtype_from_ggml_type(uint32_t type_id) {
    switch (type_id) {
        case kGgmlTypeF32: return DType::kF32;
        case kGgmlTypeF16: return DType::kF16;
        case kGgmlTypeQ8_0: return DType::kQ8_0;
        case kGgmlTypeI8: return DType::kI8;
        case kGgmlTypeI32: return DType::kI32;
        case kGgmlTypeI64: return DType::kI64;
        case kGgmlTypeBF16: return DType::kBF16;
        case kGgmlTypeMXFP4: return DType::kMXFP4;
        default: return std::nullopt;
    }
}

std::optional<uint32_t> ggml_type_from_dtype(DType dtype) {
    switch (dtype) {
        case DType::kF32: return kGgmlTypeF32;
        case DType::kF16: return kGgmlTypeF16;
        case DType::kQ8_0: return kGgmlTypeQ8_0;
        case DType::kI8: return kGgmlTypeI8;
        case DType::kI32: return kGgmlTypeI32;
        case DType::kI64: return kGgmlTypeI64;
        case DType::kBF16: return kGgmlTypeBF16;
        case DType::kMXFP4: return kGgmlTypeMXFP4;
        case DType::kF8E4M3:
        case DType::kE8M0: return std::nullopt;
    }
    return std::nullopt;
}

// ---------------------------------------------------------------------------------
// GgufFile: parsing

Result<GgufFile> GgufFile::open(Env* env, const std::string& path) {
    DSI_ASSIGN_OR_RETURN(MappedFile mapping, env->map_file(path));
    return parse(std::move(mapping));
}

Result<GgufFile> GgufFile::parse(MappedFile file) {
    return parse_impl(internal::SourceBytes::owned(std::move(file)));
}

Result<GgufFile> GgufFile::parse_bytes(std::span<const uint8_t> bytes, std::string path) {
    return parse_impl(internal::SourceBytes::borrowed(bytes, std::move(path)));
}

Result<GgufFile> GgufFile::parse_impl(internal::SourceBytes source) {
    GgufFile file;
    file.source_ = std::move(source);
    const std::span<const uint8_t> bytes = file.source_.bytes;
    const std::string context = file_context(file.source_.path);
    auto fail = [&](const Status& s, const std::string& where = "") {
        return s.with_context(where.empty() ? context : context + ": " + where);
    };
    ByteReader r(bytes);

    Result<std::span<const uint8_t>> magic = r.take(4, "the magic");
    if (!magic.is_ok()) return fail(magic.status());
    if (std::memcmp(magic->data(), "GGUF", 4) != 0) {
        std::string_view got(reinterpret_cast<const char*>(magic->data()), 4);
        return fail(invalid_argument("bad magic " + quote_name(got) + ", expected 'GGUF'"));
    }
    Result<uint32_t> version = r.scalar<uint32_t>("the version");
    if (!version.is_ok()) return fail(version.status());
    if (*version != 2 && *version != 3) {
        return fail(invalid_argument("unsupported version " + std::to_string(*version) +
                                     " (supported: 2, 3)"));
    }
    file.version_ = *version;
    Result<uint64_t> num_tensors = r.scalar<uint64_t>("the tensor count");
    if (!num_tensors.is_ok()) return fail(num_tensors.status());
    Result<uint64_t> num_kvs = r.scalar<uint64_t>("the kv count");
    if (!num_kvs.is_ok()) return fail(num_kvs.status());

    if (*num_kvs > r.remaining() / kMinKvBytes) {
        return fail(data_loss(std::to_string(*num_kvs) + " key/values cannot fit in the " +
                              std::to_string(r.remaining()) + " bytes left"));
    }
    file.kvs_.reserve(*num_kvs);
    for (uint64_t i = 0; i < *num_kvs; ++i) {
        Result<std::string> key = r.string("a key");
        if (!key.is_ok()) return fail(key.status(), "kv #" + std::to_string(i));
        std::string where = "key " + quote_name(*key);
        if (key->empty()) return fail(invalid_argument("empty key"), "kv #" + std::to_string(i));
        if (file.kv_index_.count(*key) != 0) {
            return fail(invalid_argument("appears more than once"), where);
        }
        Result<GgufValue> value = read_value(r);
        if (!value.is_ok()) return fail(value.status(), where);
        file.kv_index_[*key] = file.kvs_.size();
        file.kvs_.emplace_back(std::move(key).value(), std::move(value).value());
    }

    if (const GgufValue* a = file.find_kv(kGgufAlignmentKey)) {
        const uint32_t* align = std::get_if<uint32_t>(a);
        if (align == nullptr || !is_power_of_two(*align)) {
            return fail(invalid_argument("must be a u32 power of two"),
                        "key '" + std::string(kGgufAlignmentKey) + "'");
        }
        file.alignment_ = *align;
    }

    if (*num_tensors > r.remaining() / kMinTensorInfoBytes) {
        return fail(data_loss(std::to_string(*num_tensors) + " tensor infos cannot fit in the " +
                              std::to_string(r.remaining()) + " bytes left"));
    }
    file.tensors_.reserve(*num_tensors);
    for (uint64_t i = 0; i < *num_tensors; ++i) {
        std::string where = "tensor #" + std::to_string(i);
        Result<std::string> name = r.string("a tensor name");
        if (!name.is_ok()) return fail(name.status(), where);
        if (Status s = check_tensor_name(*name); !s.is_ok()) return fail(s, where);
        where = "tensor " + quote_name(*name);
        if (file.tensor_index_.count(*name) != 0) {
            return fail(invalid_argument("appears more than once"), where);
        }
        Result<GgufTensorInfo> info = read_tensor_info(r);
        if (!info.is_ok()) return fail(info.status(), where);
        info->name = std::move(name).value();
        file.tensor_index_[info->name] = file.tensors_.size();
        file.tensors_.push_back(std::move(info).value());
    }

    // The data section starts at the next multiple of the alignment. A file without
    // tensors may end before that padding.
    uint64_t data_start = internal::align_up(r.pos(), file.alignment_);
    if (data_start > bytes.size()) {
        if (!file.tensors_.empty()) {
            return fail(data_loss("data section would start at byte " + std::to_string(data_start) +
                                  ", past the end of the file (" + std::to_string(bytes.size()) +
                                  " bytes)"));
        }
        data_start = bytes.size();
    }
    file.data_ = bytes.subspan(data_start);
    if (Status s = check_layout(file.tensors_, file.data_.size(), file.alignment_); !s.is_ok()) {
        return fail(s);
    }
    return file;
}

// ---------------------------------------------------------------------------------
// GgufFile: lookups

const GgufValue* GgufFile::find_kv(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].second;
}

Result<const GgufValue*> GgufFile::lookup(std::string_view key) const {
    const GgufValue* v = find_kv(key);
    if (v == nullptr) return not_found(file_context(source_.path) + ": no key " + quote_name(key));
    return v;
}

Status GgufFile::wrong_type(std::string_view key, const GgufValue& v, std::string_view want) const {
    return invalid_argument(file_context(source_.path) + ": key " + quote_name(key) + " is " +
                            describe_type(v) + ", not " + std::string(want));
}

template <typename T>
Result<T> GgufFile::get_integer(std::string_view key) const {
    DSI_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
    std::optional<Result<T>> out;
    std::visit(
        [&](const auto& x) {
            using X = std::decay_t<decltype(x)>;
            if constexpr (is_integer_v<X>) {
                if (std::in_range<T>(x)) {
                    out.emplace(static_cast<T>(x));
                } else {
                    out.emplace(out_of_range(file_context(source_.path) + ": key " +
                                             quote_name(key) + " value " + std::to_string(x) +
                                             " does not fit " + describe_type(GgufValue(T{}))));
                }
            }
        },
        *v);
    if (!out) return wrong_type(key, *v, "an integer");
    return std::move(*out);
}

template <typename T>
Result<std::vector<T>> GgufFile::get_integer_array(std::string_view key) const {
    DSI_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
    const auto* array = std::get_if<GgufArray>(v);
    std::optional<Result<std::vector<T>>> out;
    if (array != nullptr) {
        std::visit(
            [&](const auto& items) {
                using X = typename std::decay_t<decltype(items)>::value_type;
                if constexpr (is_integer_v<X>) {
                    std::vector<T> converted;
                    converted.reserve(items.size());
                    for (size_t i = 0; i < items.size(); ++i) {
                        if (!std::in_range<T>(items[i])) {
                            out.emplace(out_of_range(
                                file_context(source_.path) + ": key " + quote_name(key) + " item " +
                                std::to_string(i) + " value " + std::to_string(items[i]) +
                                " does not fit " + describe_type(GgufValue(T{}))));
                            return;
                        }
                        converted.push_back(static_cast<T>(items[i]));
                    }
                    out.emplace(std::move(converted));
                }
            },
            *array);
    }
    if (!out) return wrong_type(key, *v, "an array of integers");
    return std::move(*out);
}

Result<uint32_t> GgufFile::get_u32(std::string_view key) const {
    return get_integer<uint32_t>(key);
}
Result<int32_t> GgufFile::get_i32(std::string_view key) const { return get_integer<int32_t>(key); }
Result<uint64_t> GgufFile::get_u64(std::string_view key) const {
    return get_integer<uint64_t>(key);
}
Result<int64_t> GgufFile::get_i64(std::string_view key) const { return get_integer<int64_t>(key); }
Result<std::vector<int32_t>> GgufFile::get_i32_array(std::string_view key) const {
    return get_integer_array<int32_t>(key);
}
Result<std::vector<int64_t>> GgufFile::get_i64_array(std::string_view key) const {
    return get_integer_array<int64_t>(key);
}

Result<double> GgufFile::get_f64(std::string_view key) const {
    DSI_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
    if (const auto* f = std::get_if<float>(v)) return static_cast<double>(*f);
    if (const auto* d = std::get_if<double>(v)) return *d;
    return wrong_type(key, *v, "f32 or f64");
}

Result<float> GgufFile::get_f32(std::string_view key) const {
    DSI_ASSIGN_OR_RETURN(double d, get_f64(key));
    return static_cast<float>(d);
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
    DSI_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
    if (const auto* b = std::get_if<bool>(v)) return *b;
    return wrong_type(key, *v, "bool");
}

Result<std::string> GgufFile::get_string(std::string_view key) const {
    DSI_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
    if (const auto* s = std::get_if<std::string>(v)) return *s;
    return wrong_type(key, *v, "string");
}

Result<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
    DSI_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
    if (const auto* a = std::get_if<GgufArray>(v)) {
        if (const auto* s = std::get_if<std::vector<std::string>>(a)) return *s;
    }
    return wrong_type(key, *v, "an array of string");
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
    DSI_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
    if (const auto* a = std::get_if<GgufArray>(v)) {
        if (const auto* f = std::get_if<std::vector<float>>(a)) return *f;
        if (const auto* d = std::get_if<std::vector<double>>(a)) {
            return std::vector<float>(d->begin(), d->end());
        }
    }
    return wrong_type(key, *v, "an array of f32 or f64");
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<TensorView> GgufFile::view(std::string_view name) const {
    const GgufTensorInfo* t = find_tensor(name);
    if (t == nullptr) {
        return not_found(file_context(source_.path) + ": no tensor " + quote_name(name));
    }
    return view(*t);
}

TensorView GgufFile::view(const GgufTensorInfo& t) const {
    return TensorView{t.dtype, t.shape, data_.subspan(t.offset, t.nbytes)};
}

// ---------------------------------------------------------------------------------
// GgufWriter

namespace {

template <typename T>
void append_item(std::string& out, const T& x) {
    if constexpr (std::is_same_v<T, std::string>) {
        internal::append_le(out, x.size(), 8);
        out += x;
    } else if constexpr (std::is_same_v<T, float>) {
        internal::append_le(out, std::bit_cast<uint32_t>(x), 4);
    } else if constexpr (std::is_same_v<T, double>) {
        internal::append_le(out, std::bit_cast<uint64_t>(x), 8);
    } else {
        static_assert(std::is_integral_v<T>);  // bool included: one byte, 0 or 1
        internal::append_le(out, static_cast<uint64_t>(x), sizeof(T));
    }
}

void append_value(std::string& out, const GgufValue& value) {
    internal::append_le(out, static_cast<uint32_t>(gguf_value_type(value)), 4);
    std::visit(
        [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, GgufArray>) {
                internal::append_le(out, static_cast<uint32_t>(gguf_array_type(v)), 4);
                std::visit(
                    [&](const auto& items) {
                        internal::append_le(out, items.size(), 8);
                        using X = typename std::decay_t<decltype(items)>::value_type;
                        for (const X& x : items) append_item<X>(out, x);
                    },
                    v);
            } else {
                append_item<V>(out, v);
            }
        },
        value);
}

}  // namespace

void GgufWriter::add_kv(std::string key, GgufValue value) {
    if (!kv_error_.is_ok()) return;
    std::string context = "gguf writer: key " + quote_name(key);
    if (key.empty()) {
        kv_error_ = invalid_argument("gguf writer: empty key");
        return;
    }
    if (kv_names_.count(key) != 0) {
        kv_error_ = invalid_argument(context + ": added twice");
        return;
    }
    if (key == kGgufAlignmentKey) {
        const uint32_t* align = std::get_if<uint32_t>(&value);
        if (align == nullptr || !is_power_of_two(*align)) {
            kv_error_ = invalid_argument(context + ": must be a u32 power of two");
            return;
        }
        alignment_ = *align;
    }
    kv_names_[key] = kvs_.size();
    kvs_.emplace_back(std::move(key), std::move(value));
}

namespace {

Status check_gguf_tensor(const internal::TensorQueue::Tensor& t) {
    DSI_RETURN_IF_ERROR(check_tensor_name(t.name));
    if (!ggml_type_from_dtype(t.dtype)) {
        return invalid_argument("dtype " + std::string(dtype_name(t.dtype)) + " has no ggml type");
    }
    return Status::ok();
}

}  // namespace

GgufWriter::GgufWriter() : queue_("gguf writer", kGgufMaxDims, &check_gguf_tensor) {}

void GgufWriter::add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::span<const uint8_t> bytes) {
    queue_.add(std::move(name), dtype, std::move(shape), bytes, /*copy=*/true);
}

void GgufWriter::add_tensor_borrowed(std::string name, DType dtype, std::vector<int64_t> shape,
                                     std::span<const uint8_t> bytes) {
    queue_.add(std::move(name), dtype, std::move(shape), bytes, /*copy=*/false);
}

Result<std::string> GgufWriter::serialize() const {
    if (!kv_error_.is_ok()) return kv_error_;
    if (!queue_.error().is_ok()) return queue_.error();
    const std::vector<internal::TensorQueue::Tensor>& tensors = queue_.tensors();
    std::string out = "GGUF";
    internal::append_le(out, kGgufVersion, 4);
    internal::append_le(out, tensors.size(), 8);
    internal::append_le(out, kvs_.size(), 8);
    for (const auto& [key, value] : kvs_) {
        append_item(out, key);
        append_value(out, value);
    }
    uint64_t offset = 0;
    for (const internal::TensorQueue::Tensor& t : tensors) {
        append_item(out, t.name);
        internal::append_le(out, t.shape.size(), 4);
        for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) {
            internal::append_le(out, static_cast<uint64_t>(*it), 8);
        }
        internal::append_le(out, *ggml_type_from_dtype(t.dtype), 4);
        internal::append_le(out, offset, 8);
        offset = internal::align_up(offset + t.bytes.size(), alignment_);
    }
    out.resize(internal::align_up(out.size(), alignment_), '\0');
    out.reserve(out.size() + offset);
    for (const internal::TensorQueue::Tensor& t : tensors) {
        out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
        out.resize(internal::align_up(out.size(), alignment_), '\0');
    }
    return out;
}

Status GgufWriter::write(Env* env, const std::string& path) const {
    Result<std::string> bytes = serialize();
    if (!bytes.is_ok()) return bytes.status().with_context(path);
    return env->write_file(path, *bytes);
}

}  // namespace dsi
