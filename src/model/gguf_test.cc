#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "model/internal/format_test_util.h"

namespace dsi {
namespace {

using format_testing::as_bytes;
using format_testing::expect_error;
using format_testing::pattern_bytes;
using format_testing::temp_dir;
using format_testing::to_string;

constexpr const char* kPath = "bad.gguf";

// Builds GGUF bytes field by field, independently of GgufWriter, so tests can state
// the format and craft hostile files.
class Raw {
public:
    Raw& u8(uint8_t v) { return le(v, 1); }
    Raw& u32(uint32_t v) { return le(v, 4); }
    Raw& u64(uint64_t v) { return le(v, 8); }
    Raw& str(std::string_view s) {
        u64(s.size());
        out_ += s;
        return *this;
    }
    Raw& bytes(std::string_view s) {
        out_ += s;
        return *this;
    }
    Raw& pad(size_t alignment) {
        while (out_.size() % alignment != 0) out_.push_back('\0');
        return *this;
    }
    // GGUF header: magic, version, counts.
    Raw& header(uint64_t num_tensors, uint64_t num_kvs, uint32_t version = 3) {
        return bytes("GGUF").u32(version).u64(num_tensors).u64(num_kvs);
    }
    // A tensor info; `ne` is fastest-first as in the file.
    Raw& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(ne.size()));
        for (uint64_t n : ne) u64(n);
        return u32(type).u64(offset);
    }
    const std::string& out() const { return out_; }

private:
    Raw& le(uint64_t v, int n) {
        for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
        return *this;
    }
    std::string out_;
};

Result<GgufFile> parse(const std::string& bytes) {
    return GgufFile::parse_bytes(as_bytes(bytes), kPath);
}

using Tensor = format_testing::TestTensor;

std::vector<Tensor> one_tensor_per_dtype() {
    std::vector<Tensor> out = {
        {"f32", DType::kF32, {2, 3}, {}},      {"f16", DType::kF16, {5}, {}},
        {"bf16", DType::kBF16, {3, 1, 3}, {}}, {"i8", DType::kI8, {1, 9}, {}},
        {"i32", DType::kI32, {4}, {}},         {"i64", DType::kI64, {2, 1, 1, 2}, {}},
        {"q8", DType::kQ8_0, {3, 64}, {}},     {"scalar", DType::kF32, {}, {}},
        {"empty", DType::kF16, {0, 8}, {}},    {"mx", DType::kMXFP4, {2, 96}, {}},
    };
    format_testing::fill_bytes(out);
    return out;
}

std::vector<std::pair<std::string, GgufValue>> every_value_type() {
    return {
        {"u8", GgufValue(uint8_t{200})},
        {"i8", GgufValue(int8_t{-100})},
        {"u16", GgufValue(uint16_t{60000})},
        {"i16", GgufValue(int16_t{-30000})},
        {"u32", GgufValue(uint32_t{4000000000u})},
        {"i32", GgufValue(int32_t{-2000000000})},
        {"f32", GgufValue(1.5f)},
        {"bool", GgufValue(true)},
        {"string", GgufValue(std::string("h\u00e9llo\0x", 8))},
        {"u64", GgufValue(uint64_t{1} << 63)},
        {"i64", GgufValue(int64_t{-1} << 62)},
        {"f64", GgufValue(-2.25)},
        {"a.u8", GgufValue(GgufArray(std::vector<uint8_t>{1, 2, 255}))},
        {"a.i8", GgufValue(GgufArray(std::vector<int8_t>{-1, 0, 1}))},
        {"a.u16", GgufValue(GgufArray(std::vector<uint16_t>{7}))},
        {"a.i16", GgufValue(GgufArray(std::vector<int16_t>{-7, 7}))},
        {"a.u32", GgufValue(GgufArray(std::vector<uint32_t>{1, 4000000000u}))},
        {"a.i32", GgufValue(GgufArray(std::vector<int32_t>{-5, 5, 6}))},
        {"a.f32", GgufValue(GgufArray(std::vector<float>{0.25f, -1.0f}))},
        {"a.bool", GgufValue(GgufArray(std::vector<bool>{true, false, true}))},
        {"a.string", GgufValue(GgufArray(std::vector<std::string>{"a", "", "<|end|>"}))},
        {"a.u64", GgufValue(GgufArray(std::vector<uint64_t>{uint64_t{1} << 40}))},
        {"a.i64", GgufValue(GgufArray(std::vector<int64_t>{-3}))},
        {"a.f64", GgufValue(GgufArray(std::vector<double>{0.5, 1e300}))},
        {"a.empty", GgufValue(GgufArray(std::vector<uint32_t>{}))},
    };
}

// ---------------------------------------------------------------------------------
// Round trips

TEST(GgufTest, RoundTripEveryValueTypeAndDtype) {
    auto kvs = every_value_type();
    std::vector<Tensor> tensors = one_tensor_per_dtype();
    GgufWriter writer;
    for (const auto& [key, value] : kvs) writer.add_kv(key, value);
    for (const Tensor& t : tensors) writer.add_tensor(t.name, t.dtype, t.shape, t.bytes);
    Result<std::string> bytes = writer.serialize();
    ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();

    Result<GgufFile> file = GgufFile::parse_bytes(as_bytes(*bytes));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(file->version(), 3u);
    EXPECT_EQ(file->alignment(), 32u);
    EXPECT_EQ(file->kvs(), kvs);
    EXPECT_EQ(gguf_value_type(*file->find_kv("a.string")), GgufType::kArray);
    EXPECT_EQ(gguf_array_type(std::get<GgufArray>(*file->find_kv("a.bool"))), GgufType::kBool);
    EXPECT_EQ(gguf_value_type(*file->find_kv("u64")), GgufType::kU64);
    ASSERT_EQ(file->tensors().size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
        const Tensor& t = tensors[i];
        const GgufTensorInfo& info = file->tensors()[i];
        EXPECT_EQ(info.name, t.name);
        EXPECT_EQ(info.offset % 32, 0u) << t.name;
        format_testing::expect_view(file->view(t.name), t);
    }
    EXPECT_EQ(file->find_tensor("q8")->nbytes, 3u * 2 * 34);
    EXPECT_EQ(file->find_tensor("q8")->ggml_type, kGgmlTypeQ8_0);
    EXPECT_EQ(file->find_tensor("mx")->nbytes, 2u * 3 * 17);
    EXPECT_EQ(file->find_tensor("mx")->ggml_type, kGgmlTypeMXFP4);
    // llama.cpp also reads the final tensor's padding.
    EXPECT_EQ(bytes->size() % 32, 0u);
}

TEST(GgufTest, WriterMatchesTheSpecByteForByte) {
    GgufWriter writer;
    writer.add_kv("general.architecture", GgufValue(std::string("x")));
    std::vector<uint8_t> data = pattern_bytes(8, 7);
    writer.add_tensor("w", DType::kF32, {1, 2}, data);
    Raw expect;
    expect.header(1, 1).str("general.architecture").u32(8).str("x");
    expect.tensor("w", {2, 1}, kGgmlTypeF32, 0).pad(32).bytes(to_string(data)).pad(32);
    EXPECT_EQ(*writer.serialize(), expect.out());
}

TEST(GgufTest, ReadsVersion2AndFastestFirstShape) {
    Raw raw;
    raw.header(1, 1, 2).str("k").u32(4).u32(9);
    raw.tensor("t", {4, 2}, kGgmlTypeI8, 0).pad(32).bytes("abcdefgh");
    Result<GgufFile> file = parse(raw.out());
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(file->version(), 2u);
    EXPECT_EQ(*file->get_u32("k"), 9u);
    EXPECT_EQ(file->view("t")->shape, (std::vector<int64_t>{2, 4}));
    EXPECT_EQ(to_string(file->view("t")->data), "abcdefgh");
}

TEST(GgufTest, CustomAlignmentIsHonoured) {
    GgufWriter writer;
    writer.add_kv("general.alignment", GgufValue(uint32_t{64}));
    writer.add_tensor("a", DType::kI8, {3}, pattern_bytes(3, 1));
    writer.add_tensor("b", DType::kI8, {5}, pattern_bytes(5, 2));
    std::string path = temp_dir("gguf_align") + "/a.gguf";
    ASSERT_TRUE(writer.write(Env::default_env(), path).is_ok());
    Result<GgufFile> file = GgufFile::open(Env::default_env(), path);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(file->path(), path);
    EXPECT_EQ(file->alignment(), 64u);
    EXPECT_EQ(file->find_tensor("b")->offset, 64u);
    GgufFile moved = std::move(file).value();  // views stay valid after a move
    EXPECT_EQ(std::vector<uint8_t>(moved.view("b")->data.begin(), moved.view("b")->data.end()),
              pattern_bytes(5, 2));
}

TEST(GgufTest, ManyTensorsZeroSizeAndEmptyFile) {
    GgufWriter writer;
    std::vector<std::vector<uint8_t>> data;
    for (int i = 0; i < 500; ++i) data.push_back(pattern_bytes(static_cast<size_t>(i % 5) * 2, i));
    for (int i = 0; i < 500; ++i) {
        writer.add_tensor_borrowed("blk." + std::to_string(i), DType::kF16, {i % 5}, data[i]);
    }
    const std::string bytes = *writer.serialize();  // parse_bytes borrows it
    Result<GgufFile> file = GgufFile::parse_bytes(as_bytes(bytes));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    ASSERT_EQ(file->tensors().size(), 500u);
    for (int i = 0; i < 500; ++i) {
        TensorView v = file->view(file->tensors()[static_cast<size_t>(i)]);
        EXPECT_EQ(std::vector<uint8_t>(v.data.begin(), v.data.end()), data[i]);
    }

    const std::string empty_bytes = *GgufWriter().serialize();
    Result<GgufFile> none = GgufFile::parse_bytes(as_bytes(empty_bytes));
    ASSERT_TRUE(none.is_ok()) << none.status().to_string();
    EXPECT_TRUE(none->tensors().empty());
    EXPECT_TRUE(none->kvs().empty());

    std::string path = temp_dir("gguf_empty") + "/empty.gguf";
    ASSERT_TRUE(Env::default_env()->write_file(path, "").is_ok());
    expect_error(GgufFile::open(Env::default_env(), path).status(), StatusCode::kDataLoss,
                 {path, "magic"});
    expect_error(GgufFile::open(Env::default_env(), path + ".x").status(), StatusCode::kNotFound,
                 {path + ".x"});
}

TEST(GgufTest, TypedGetters) {
    GgufWriter writer;
    for (const auto& [key, value] : every_value_type()) writer.add_kv(key, value);
    const std::string bytes = *writer.serialize();
    Result<GgufFile> file = GgufFile::parse_bytes(as_bytes(bytes), "g.gguf");
    ASSERT_TRUE(file.is_ok());
    const GgufFile& f = *file;
    EXPECT_EQ(*f.get_u32("u8"), 200u);  // any integer type that fits
    EXPECT_EQ(*f.get_i32("i16"), -30000);
    EXPECT_EQ(*f.get_u64("u64"), uint64_t{1} << 63);
    EXPECT_EQ(*f.get_i64("u32"), 4000000000);
    EXPECT_EQ(*f.get_f32("f32"), 1.5f);
    EXPECT_EQ(*f.get_f32("f64"), -2.25f);
    EXPECT_EQ(*f.get_f64("f32"), 1.5);
    EXPECT_TRUE(*f.get_bool("bool"));
    EXPECT_EQ(*f.get_string("string"), std::string("h\u00e9llo\0x", 8));
    EXPECT_EQ(*f.get_string_array("a.string"), (std::vector<std::string>{"a", "", "<|end|>"}));
    EXPECT_EQ(*f.get_f32_array("a.f64"), (std::vector<float>{0.5f, static_cast<float>(1e300)}));
    EXPECT_EQ(*f.get_i32_array("a.u16"), (std::vector<int32_t>{7}));
    EXPECT_EQ(*f.get_i64_array("a.u32"), (std::vector<int64_t>{1, 4000000000}));
    EXPECT_TRUE(f.get_i32_array("a.empty")->empty());

    using C = StatusCode;
    expect_error(f.get_u32("missing").status(), C::kNotFound, {"g.gguf", "'missing'"});
    expect_error(f.get_u32("i8").status(), C::kOutOfRange, {"g.gguf", "'i8'", "-100"});
    expect_error(f.get_i32("u32").status(), C::kOutOfRange, {"'u32'", "does not fit i32"});
    expect_error(f.get_u32("string").status(), C::kInvalidArgument,
                 {"g.gguf", "'string'", "is string", "integer"});
    expect_error(f.get_u32("bool").status(), C::kInvalidArgument, {"'bool'", "is bool"});
    expect_error(f.get_f32("u8").status(), C::kInvalidArgument, {"'u8'", "is u8"});
    expect_error(f.get_bool("u8").status(), C::kInvalidArgument, {"'u8'"});
    expect_error(f.get_string("a.string").status(), C::kInvalidArgument,
                 {"'a.string'", "array of string"});
    expect_error(f.get_string_array("a.u8").status(), C::kInvalidArgument, {"'a.u8'"});
    expect_error(f.get_f32_array("a.i32").status(), C::kInvalidArgument, {"'a.i32'"});
    expect_error(f.get_i32_array("a.u32").status(), C::kOutOfRange,
                 {"'a.u32'", "item 1", "4000000000"});
    expect_error(f.get_i32_array("a.bool").status(), C::kInvalidArgument, {"'a.bool'"});
    expect_error(f.get_i32_array("u8").status(), C::kInvalidArgument, {"'u8'"});
    expect_error(f.view("nope").status(), C::kNotFound, {"g.gguf", "'nope'"});
}

TEST(GgufTest, WriterReportsMistakesNamingTheKeyOrTensor) {
    struct Case {
        const char* what;
        std::function<void(GgufWriter&)> build;
        std::vector<std::string> parts;
    };
    std::vector<uint8_t> four(4);
    const Case cases[] = {
        {"dup key",
         [](GgufWriter& w) {
             w.add_kv("k", GgufValue(1));
             w.add_kv("k", GgufValue(2));
         },
         {"'k'", "twice"}},
        {"empty key", [](GgufWriter& w) { w.add_kv("", GgufValue(1)); }, {"empty key"}},
        {"bad alignment",
         [](GgufWriter& w) { w.add_kv("general.alignment", GgufValue(48u)); },
         {"general.alignment", "power of two"}},
        {"alignment type",
         [](GgufWriter& w) { w.add_kv("general.alignment", GgufValue(uint64_t{32})); },
         {"general.alignment", "u32"}},
        {"dup tensor",
         [&](GgufWriter& w) {
             w.add_tensor("t", DType::kI8, {4}, four);
             w.add_tensor("t", DType::kI8, {4}, four);
         },
         {"'t'", "twice"}},
        {"long name",
         [&](GgufWriter& w) { w.add_tensor(std::string(64, 'n'), DType::kI8, {4}, four); },
         {"nnnn", "64 bytes"}},
        {"no ggml type",
         [&](GgufWriter& w) { w.add_tensor("e", DType::kF8E4M3, {4}, four); },
         {"'e'", "no ggml type"}},
        {"five dims",
         [&](GgufWriter& w) {
             w.add_tensor("d", DType::kI8, {1, 1, 1, 1, 4}, four);
         },
         {"'d'", "5 dimensions"}},
        {"size mismatch",
         [&](GgufWriter& w) { w.add_tensor("s", DType::kF32, {2}, four); },
         {"'s'", "needs 8"}},
        {"q8 row",
         [&](GgufWriter& w) {
             w.add_tensor("q", DType::kQ8_0, {2, 16}, four);
         },
         {"'q'", "multiple of 32"}},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        GgufWriter writer;
        c.build(writer);
        Status s = writer.serialize().status();
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
        for (const std::string& part : c.parts) {
            expect_error(s, StatusCode::kInvalidArgument, {part});
        }
    }
}

// ---------------------------------------------------------------------------------
// Malformed input: one case per failure mode. Every message names the file and, where
// there is one, the key or tensor.

struct BadFile {
    const char* what;
    std::string bytes;
    StatusCode code;
    std::vector<std::string> parts;  // besides the path
};

std::string with_tensor(std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data_bytes,
                        std::string_view name = "t") {
    Raw r;
    r.header(1, 0).tensor(name, std::move(ne), type, offset).pad(32);
    return r.out() + std::string(data_bytes, '\0');
}

TEST(GgufMalformedTest, EachFailureModeIsAStatusNamingFileAndKeyOrTensor) {
    using C = StatusCode;
    const uint64_t kHuge = uint64_t{1} << 62;
    const BadFile cases[] = {
        {"short magic", "GG", C::kDataLoss, {"magic"}},
        {"bad magic",
         Raw().bytes("GGML").u32(3).u64(0).u64(0).out(),
         C::kInvalidArgument,
         {"bad magic 'GGML'"}},
        {"version 1", Raw().header(0, 0, 1).out(), C::kInvalidArgument, {"unsupported version 1"}},
        {"version 4", Raw().header(0, 0, 4).out(), C::kInvalidArgument, {"unsupported version 4"}},
        {"truncated counts", Raw().bytes("GGUF").u32(3).u64(0).out(), C::kDataLoss, {"kv count"}},
        {"kv count too big", Raw().header(0, kHuge).out(), C::kDataLoss, {"cannot fit"}},
        {"tensor count too big", Raw().header(kHuge, 0).out(), C::kDataLoss, {"cannot fit"}},
        {"key length past end",
         Raw().header(0, 1).u64(kHuge).bytes("abcdefghijklm").out(),
         C::kDataLoss,
         {"kv #0", "key"}},
        {"empty key",
         Raw().header(0, 1).str("").u32(0).u8(1).out(),
         C::kInvalidArgument,
         {"kv #0", "empty key"}},
        {"duplicate key",
         Raw().header(0, 2).str("k").u32(0).u8(1).str("k").u32(0).u8(1).out(),
         C::kInvalidArgument,
         {"'k'", "more than once"}},
        {"unknown value type",
         Raw().header(0, 1).str("k").u32(13).u64(0).out(),
         C::kInvalidArgument,
         {"'k'", "unknown value type 13"}},
        {"truncated value",
         Raw().header(0, 1).str("k").u32(10).u32(0).out(),
         C::kDataLoss,
         {"'k'", "file ends"}},
        {"string past end",
         Raw().header(0, 1).str("k").u32(8).u64(100).bytes("ab").out(),
         C::kDataLoss,
         {"'k'"}},
        {"bad bool",
         Raw().header(0, 1).str("k").u32(7).u8(2).out(),
         C::kInvalidArgument,
         {"'k'", "bool value 2"}},
        {"nested array",
         Raw().header(0, 1).str("k").u32(9).u32(9).u64(1).u32(0).u64(0).out(),
         C::kInvalidArgument,
         {"'k'", "nested arrays"}},
        {"array type unknown",
         Raw().header(0, 1).str("k").u32(9).u32(77).u64(0).out(),
         C::kInvalidArgument,
         {"'k'", "unknown value type 77"}},
        {"array too long",
         Raw().header(0, 1).str("k").u32(9).u32(4).u64(kHuge).u32(1).out(),
         C::kDataLoss,
         {"'k'", "cannot fit"}},
        {"string array too long",
         Raw().header(0, 1).str("k").u32(9).u32(8).u64(1000).str("a").out(),
         C::kDataLoss,
         {"'k'", "cannot fit"}},
        {"string array item past end",
         Raw().header(0, 1).str("k").u32(9).u32(8).u64(2).str("a").u64(99).bytes("abcdefgh").out(),
         C::kDataLoss,
         {"'k'", "array item 1"}},
        {"bad bool in array",
         Raw().header(0, 1).str("k").u32(9).u32(7).u64(2).u8(1).u8(5).out(),
         C::kInvalidArgument,
         {"'k'", "array item 1", "bool value 5"}},
        {"alignment type",
         Raw().header(0, 1).str("general.alignment").u32(10).u64(32).out(),
         C::kInvalidArgument,
         {"general.alignment", "u32"}},
        {"alignment not pow2",
         Raw().header(0, 1).str("general.alignment").u32(4).u32(48).out(),
         C::kInvalidArgument,
         {"general.alignment", "power of two"}},
        {"alignment zero",
         Raw().header(0, 1).str("general.alignment").u32(4).u32(0).out(),
         C::kInvalidArgument,
         {"general.alignment", "power of two"}},
        {"empty tensor name",
         with_tensor({4}, kGgmlTypeI8, 0, 32, ""),
         C::kInvalidArgument,
         {"tensor #0", "empty tensor name"}},
        {"long tensor name",
         with_tensor({4}, kGgmlTypeI8, 0, 32, std::string(64, 'x')),
         C::kInvalidArgument,
         {"tensor #0", "64 bytes"}},
        {"duplicate tensor",
         Raw()
             .header(2, 0)
             .tensor("t", {4}, kGgmlTypeI8, 0)
             .tensor("t", {4}, kGgmlTypeI8, 32)
             .pad(32)
             .bytes(std::string(64, 'x'))
             .out(),
         C::kInvalidArgument,
         {"'t'", "more than once"}},
        {"n_dims 5",
         with_tensor({1, 1, 1, 1, 1}, kGgmlTypeI8, 0, 32),
         C::kInvalidArgument,
         {"'t'", "n_dims 5"}},
        {"n_dims 9",
         with_tensor({1, 1, 1, 1, 1, 1, 1, 1, 1}, kGgmlTypeI8, 0, 32),
         C::kInvalidArgument,
         {"'t'", "n_dims 9"}},
        {"ne above int64",
         with_tensor({uint64_t{1} << 63}, kGgmlTypeI8, 0, 32),
         C::kInvalidArgument,
         {"'t'", "ne[0]", "too large"}},
        {"numel overflow",
         with_tensor({uint64_t{1} << 32, uint64_t{1} << 32}, kGgmlTypeI8, 0, 32),
         C::kInvalidArgument,
         {"'t'", "overflows"}},
        {"bytes overflow",
         with_tensor({uint64_t{1} << 62}, kGgmlTypeF32, 0, 32),
         C::kInvalidArgument,
         {"'t'", "overflows"}},
        {"unsupported type",
         with_tensor({32}, 2, 0, 32),
         C::kInvalidArgument,
         {"'t'", "unsupported dtype", "ggml type id 2"}},
        {"f64 unsupported",
         with_tensor({4}, kGgmlTypeF64, 0, 32),
         C::kInvalidArgument,
         {"'t'", "ggml type id 28"}},
        {"huge type id",
         with_tensor({4}, 0xffffffffu, 0, 32),
         C::kInvalidArgument,
         {"'t'", "ggml type id 4294967295"}},
        {"q8 row",
         with_tensor({16, 2}, kGgmlTypeQ8_0, 0, 64),
         C::kInvalidArgument,
         {"'t'", "multiple of 32"}},
        {"mxfp4 row",
         with_tensor({48, 2}, kGgmlTypeMXFP4, 0, 64),
         C::kInvalidArgument,
         {"'t'", "multiple of 32"}},
        {"misaligned offset",
         with_tensor({4}, kGgmlTypeI8, 4, 64),
         C::kInvalidArgument,
         {"'t'", "offset 4", "alignment 32"}},
        {"offset past end",
         with_tensor({4}, kGgmlTypeI8, 64, 32),
         C::kOutOfRange,
         {"'t'", "past the end"}},
        {"huge offset",
         with_tensor({4}, kGgmlTypeI8, uint64_t{0} - 32, 32),
         C::kOutOfRange,
         {"'t'", "past the end"}},
        {"truncated data",
         with_tensor({40}, kGgmlTypeI8, 0, 39),
         C::kOutOfRange,
         {"'t'", "past the end"}},
        {"no data section",
         Raw().header(1, 0).tensor("t", {4}, kGgmlTypeI8, 0).out(),
         C::kDataLoss,
         {"data section"}},
        {"truncated tensor info",
         Raw().header(1, 0).str("t").u32(2).u64(4).u32(0).out(),
         C::kDataLoss,
         {"'t'", "ne"}},
        {"overlap",
         Raw()
             .header(2, 0)
             .tensor("a", {64}, kGgmlTypeI8, 0)
             .tensor("b", {4}, kGgmlTypeI8, 32)
             .pad(32)
             .bytes(std::string(64, 'x'))
             .out(),
         C::kInvalidArgument,
         {"'b'", "overlaps", "'a'"}},
    };
    for (const BadFile& c : cases) {
        SCOPED_TRACE(c.what);
        Result<GgufFile> file = parse(c.bytes);
        expect_error(file.status(), c.code, {kPath});
        for (const std::string& part : c.parts) expect_error(file.status(), c.code, {part});
    }
}

TEST(GgufMalformedTest, EveryTruncationOfAValidFileFails) {
    GgufWriter writer;
    for (const auto& [key, value] : every_value_type()) writer.add_kv(key, value);
    writer.add_tensor("a", DType::kF32, {2}, pattern_bytes(8, 1));
    writer.add_tensor("b", DType::kI8, {40}, pattern_bytes(40, 2));
    std::string full = *writer.serialize();
    // The last tensor ends 24 bytes before the file does. Cutting only that padding
    // leaves every tensor byte in place, so we still read the file (llama.cpp would not).
    const size_t last_byte_needed = full.size() - 24;
    for (size_t n = 0; n < full.size(); ++n) {
        Result<GgufFile> file = parse(full.substr(0, n));
        if (n < last_byte_needed) {
            EXPECT_FALSE(file.is_ok()) << n;
            EXPECT_NE(file.status().message().find(kPath), std::string::npos)
                << file.status().to_string();
        } else {
            EXPECT_TRUE(file.is_ok()) << n << " " << file.status().to_string();
        }
    }
}

}  // namespace
}  // namespace dsi
