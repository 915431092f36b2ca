#include "model/safetensors.h"

#include <gtest/gtest.h>

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

constexpr const char* kPath = "bad.safetensors";

// A file from a raw header (length prefix added, no padding) and `data_bytes` zeros.
std::string raw_file(std::string_view header, size_t data_bytes) {
    std::string out;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
    out += header;
    out.append(data_bytes, '\0');
    return out;
}

Status parse_status(const std::string& bytes) {
    return SafetensorsFile::parse_bytes(as_bytes(bytes), kPath).status();
}

using Tensor = format_testing::TestTensor;

std::vector<Tensor> one_tensor_per_dtype() {
    std::vector<Tensor> out = {
        {"f32", DType::kF32, {2, 3}, {}},      {"f16", DType::kF16, {5}, {}},
        {"bf16", DType::kBF16, {3, 1, 3}, {}}, {"e4m3", DType::kF8E4M3, {7, 2}, {}},
        {"e8m0", DType::kE8M0, {3}, {}},       {"i8", DType::kI8, {1, 9}, {}},
        {"i32", DType::kI32, {4}, {}},         {"i64", DType::kI64, {2, 2}, {}},
        {"scalar", DType::kF32, {}, {}},       {"empty", DType::kBF16, {0, 16}, {}},
    };
    format_testing::fill_bytes(out);
    return out;
}

void expect_same_tensors(const SafetensorsFile& file, const std::vector<Tensor>& tensors) {
    ASSERT_EQ(file.entries().size(), tensors.size());
    for (const Tensor& t : tensors) format_testing::expect_view(file.view(t.name), t);
}

// ---------------------------------------------------------------------------------
// Round trips

TEST(SafetensorsTest, RoundTripAllDtypesAndMetadata) {
    std::vector<Tensor> tensors = one_tensor_per_dtype();
    SafetensorsWriter writer;
    for (const Tensor& t : tensors) writer.add(t.name, t.dtype, t.shape, t.bytes);
    writer.set_metadata("format", "pt");
    writer.set_metadata("note", "h\u00e9llo \"quoted\"");
    Result<std::string> bytes = writer.serialize();
    ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();

    // Header length is a multiple of 8, so the data section starts 8-aligned.
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) {
        header_len = (header_len << 8) | static_cast<uint8_t>((*bytes)[static_cast<size_t>(i)]);
    }
    EXPECT_EQ(header_len % 8, 0u);
    EXPECT_EQ(bytes->size(), 8 + header_len + writer.data_bytes());

    Result<SafetensorsFile> file = SafetensorsFile::parse_bytes(as_bytes(*bytes));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    expect_same_tensors(*file, tensors);
    EXPECT_EQ(file->metadata().at("format"), "pt");
    EXPECT_EQ(file->metadata().at("note"), "h\u00e9llo \"quoted\"");
    // Data is in insertion order, packed.
    EXPECT_EQ(file->find("f32")->begin, 0u);
    EXPECT_EQ(file->find("f16")->begin, 24u);
    EXPECT_EQ(file->data_bytes(), writer.data_bytes());
}

TEST(SafetensorsTest, WriteThenOpenFromDisk) {
    std::vector<Tensor> tensors = one_tensor_per_dtype();
    SafetensorsWriter writer;
    for (const Tensor& t : tensors) writer.add_borrowed(t.name, t.dtype, t.shape, t.bytes);
    std::string path = temp_dir("write_open") + "/one.safetensors";
    ASSERT_TRUE(writer.write(Env::default_env(), path).is_ok());
    Result<SafetensorsFile> file = SafetensorsFile::open(Env::default_env(), path);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(file->path(), path);
    SafetensorsFile moved = std::move(file).value();  // views stay valid after a move
    expect_same_tensors(moved, tensors);
    EXPECT_TRUE(moved.metadata().empty());
}

TEST(SafetensorsTest, ManyTensorsAreSortedByOffset) {
    SafetensorsWriter writer;
    std::vector<Tensor> tensors;
    for (int i = 0; i < 1000; ++i) {
        int64_t n = i % 7;  // includes zero-size tensors
        tensors.push_back({"layer." + std::to_string(i) + ".w",
                           DType::kBF16,
                           {n, 3},
                           pattern_bytes(static_cast<size_t>(n * 6), static_cast<uint64_t>(i))});
    }
    for (const Tensor& t : tensors) writer.add_borrowed(t.name, t.dtype, t.shape, t.bytes);
    Result<std::string> bytes = writer.serialize();
    ASSERT_TRUE(bytes.is_ok());
    Result<SafetensorsFile> file = SafetensorsFile::parse_bytes(as_bytes(*bytes));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    expect_same_tensors(*file, tensors);
    for (size_t i = 1; i < file->entries().size(); ++i) {
        EXPECT_EQ(file->entries()[i - 1].end, file->entries()[i].begin);
    }
}

TEST(SafetensorsTest, ZeroSizeAndNoTensors) {
    SafetensorsWriter empty;
    Result<std::string> bytes = empty.serialize();
    ASSERT_TRUE(bytes.is_ok());
    Result<SafetensorsFile> file = SafetensorsFile::parse_bytes(as_bytes(*bytes));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_TRUE(file->entries().empty());

    SafetensorsWriter zero;
    zero.add("z", DType::kF32, {4, 0}, {});
    bytes = zero.serialize();
    ASSERT_TRUE(bytes.is_ok());
    file = SafetensorsFile::parse_bytes(as_bytes(*bytes));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    Result<TensorView> v = file->view("z");
    ASSERT_TRUE(v.is_ok());
    EXPECT_EQ(v->numel(), 0);
    EXPECT_TRUE(v->data.empty());
}

TEST(SafetensorsTest, MissingTensorNamesFileAndTensor) {
    SafetensorsWriter writer;
    const std::string bytes = *writer.serialize();  // parse_bytes borrows it
    Result<SafetensorsFile> file = SafetensorsFile::parse_bytes(as_bytes(bytes), "x.safetensors");
    ASSERT_TRUE(file.is_ok());
    EXPECT_EQ(file->find("nope"), nullptr);
    expect_error(file->view("nope").status(), StatusCode::kNotFound, {"x.safetensors", "'nope'"});
}

TEST(SafetensorsTest, EmptyAndMissingFiles) {
    Env* env = Env::default_env();
    std::string path = temp_dir("empty") + "/empty.safetensors";
    ASSERT_TRUE(env->write_file(path, "").is_ok());
    expect_error(SafetensorsFile::open(env, path).status(), StatusCode::kDataLoss,
                 {path, "too short"});
    expect_error(SafetensorsFile::open(env, path + ".missing").status(), StatusCode::kNotFound,
                 {path + ".missing"});
}

// ---------------------------------------------------------------------------------
// Writer mistakes

TEST(SafetensorsTest, WriterReportsMistakesNamingTheTensor) {
    struct Case {
        std::string name;
        DType dtype;
        std::vector<int64_t> shape;
        size_t nbytes;
        std::string_view expect;
    };
    const Case cases[] = {
        {"__metadata__", DType::kF32, {1}, 4, "reserved"},
        {"q", DType::kQ8_0, {32}, 34, "no safetensors name"},
        {"short", DType::kF32, {3}, 8, "needs 12"},
        {"neg", DType::kF32, {-1}, 0, "negative"},
        {"bad\xff", DType::kI8, {1}, 1, "UTF-8"},
    };
    for (const Case& c : cases) {
        SafetensorsWriter writer;
        writer.add(c.name, c.dtype, c.shape, std::vector<uint8_t>(c.nbytes));
        Result<std::string> out = writer.serialize();
        expect_error(out.status(), StatusCode::kInvalidArgument, {c.expect});
        if (c.expect != "UTF-8") {
            expect_error(out.status(), StatusCode::kInvalidArgument, {"'" + c.name + "'"});
        }
    }
    SafetensorsWriter dup;
    dup.add("w", DType::kI8, {1}, std::vector<uint8_t>(1));
    dup.add("w", DType::kI8, {1}, std::vector<uint8_t>(1));
    std::string path = temp_dir("writer_errors") + "/dup.safetensors";
    Status s = dup.write(Env::default_env(), path);
    expect_error(s, StatusCode::kInvalidArgument, {path, "'w'", "twice"});
    EXPECT_FALSE(Env::default_env()->file_exists(path));
}

// ---------------------------------------------------------------------------------
// Malformed input: one case per failure mode. Every message names the file and, where
// there is one, the tensor.

struct BadHeader {
    const char* what;
    std::string header;
    size_t data_bytes;
    StatusCode code;
    std::vector<std::string> parts;  // besides the path
};

std::string f32_entry(const std::string& name, uint64_t begin, uint64_t end,
                      const std::string& shape = "[1]") {
    return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(begin) + "," + std::to_string(end) + "]}";
}

TEST(SafetensorsMalformedTest, EachFailureModeIsAStatusNamingFileAndTensor) {
    using C = StatusCode;
    const BadHeader cases[] = {
        {"json syntax", "{\"w\": {", 0, C::kInvalidArgument, {"not valid JSON"}},
        {"empty header", "", 0, C::kInvalidArgument, {"not valid JSON"}},
        {"trailing garbage", "{} x", 0, C::kInvalidArgument, {"not valid JSON"}},
        {"bad utf8", "{\"w\xff\": 1}", 0, C::kInvalidArgument, {"not valid JSON"}},
        {"not an object", "[1, 2]", 0, C::kInvalidArgument, {"not a JSON object"}},
        {"scalar root", "7", 0, C::kInvalidArgument, {"not a JSON object"}},
        {"entry not object", "{\"w\": 5}", 0, C::kInvalidArgument, {"'w'", "not a JSON object"}},
        {"entry is list", "{\"w\": [1]}", 0, C::kInvalidArgument, {"'w'", "not a JSON object"}},
        {"missing dtype",
         "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}",
         4,
         C::kInvalidArgument,
         {"'w'", "dtype"}},
        {"unknown dtype",
         "{\"w\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         4,
         C::kInvalidArgument,
         {"'w'", "unsupported dtype 'F99'"}},
        {"missing shape",
         "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}",
         4,
         C::kInvalidArgument,
         {"'w'", "shape"}},
        {"negative dim",
         "{" + f32_entry("w", 0, 4, "[-2, 2]") + "}",
         4,
         C::kInvalidArgument,
         {"'w'", "dimension 0 is negative (-2)"}},
        {"float dim",
         "{" + f32_entry("w", 0, 4, "[1.5]") + "}",
         4,
         C::kInvalidArgument,
         {"'w'", "not an integer"}},
        {"dim above int64",
         "{" + f32_entry("w", 0, 4, "[9223372036854775808]") + "}",
         4,
         C::kInvalidArgument,
         {"'w'", "too large"}},
        {"dim above uint64",
         "{" + f32_entry("w", 0, 4, "[18446744073709551616]") + "}",
         4,
         C::kInvalidArgument,
         {"'w'", "not an integer"}},
        {"numel overflow",
         "{" + f32_entry("w", 0, 4, "[4294967296, 4294967296]") + "}",
         4,
         C::kInvalidArgument,
         {"'w'", "overflows"}},
        {"bytes overflow",
         "{" + f32_entry("w", 0, 4, "[4611686018427387904]") + "}",
         4,
         C::kInvalidArgument,
         {"'w'", "overflows"}},
        {"too many dims",
         "{" + f32_entry("w", 0, 4, "[1,1,1,1,1,1,1,1,1]") + "}",
         4,
         C::kInvalidArgument,
         {"'w'", "more than 8"}},
        {"nested list",
         "{" + f32_entry("w", 0, 4, "[[1]]") + "}",
         4,
         C::kInvalidArgument,
         {"'w'", "nested list"}},
        {"nested object",
         "{" + f32_entry("w", 0, 4, "{\"a\":1}") + "}",
         4,
         C::kInvalidArgument,
         {"'w'", "nested object"}},
        {"missing offsets",
         "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}",
         4,
         C::kInvalidArgument,
         {"'w'", "data_offsets"}},
        {"one offset",
         "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
         4,
         C::kInvalidArgument,
         {"'w'", "data_offsets"}},
        {"negative offset",
         "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
         4,
         C::kInvalidArgument,
         {"'w'", "data_offsets"}},
        {"begin after end",
         "{" + f32_entry("w", 8, 4) + "}",
         8,
         C::kInvalidArgument,
         {"'w'", "begin after end"}},
        {"size mismatch",
         "{" + f32_entry("w", 0, 8) + "}",
         8,
         C::kInvalidArgument,
         {"'w'", "hold 8 bytes", "needs 4"}},
        {"offsets past end",
         "{" + f32_entry("w", 4, 8) + "}",
         4,
         C::kOutOfRange,
         {"'w'", "past the end"}},
        {"huge offsets",
         "{" + f32_entry("w", 18446744073709551611ull, 18446744073709551615ull) + "}",
         4,
         C::kOutOfRange,
         {"'w'", "past the end"}},
        {"overlap",
         "{" + f32_entry("a", 0, 4, "[1]") + "," + f32_entry("b", 2, 6) + "}",
         6,
         C::kInvalidArgument,
         {"'b'", "overlaps", "'a'"}},
        {"hole",
         "{" + f32_entry("a", 0, 4) + "," + f32_entry("b", 8, 12) + "}",
         12,
         C::kInvalidArgument,
         {"'b'", "hole"}},
        {"trailing data",
         "{" + f32_entry("a", 0, 4) + "}",
         9,
         C::kInvalidArgument,
         {"5 bytes after the last tensor"}},
        {"duplicate tensor",
         "{" + f32_entry("a", 0, 4) + "," + f32_entry("a", 4, 8) + "}",
         8,
         C::kInvalidArgument,
         {"'a'", "more than once"}},
        {"duplicate field",
         "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         4,
         C::kInvalidArgument,
         {"'w'", "'dtype'", "more than once"}},
        {"metadata not string",
         "{\"__metadata__\":{\"k\":1}}",
         0,
         C::kInvalidArgument,
         {"__metadata__", "'k'"}},
        {"metadata not object",
         "{\"__metadata__\":\"x\"}",
         0,
         C::kInvalidArgument,
         {"__metadata__", "not a JSON object"}},
    };
    for (const BadHeader& c : cases) {
        SCOPED_TRACE(c.what);
        Status s = parse_status(raw_file(c.header, c.data_bytes));
        expect_error(s, c.code, {kPath});
        for (const std::string& part : c.parts) expect_error(s, c.code, {part});
    }
}

TEST(SafetensorsMalformedTest, HeaderLengthProblems) {
    expect_error(parse_status("abc"), StatusCode::kDataLoss, {kPath, "too short"});
    std::string huge(8, '\0');
    huge[0] = static_cast<char>(0x01);  // 100'000'001 = 0x05F5E101
    huge[1] = static_cast<char>(0xE1);
    huge[2] = static_cast<char>(0xF5);
    huge[3] = static_cast<char>(0x05);
    expect_error(parse_status(huge), StatusCode::kInvalidArgument, {kPath, "exceeds the limit"});
    std::string all_ones(8, static_cast<char>(0xff));
    expect_error(parse_status(all_ones), StatusCode::kInvalidArgument, {kPath, "exceeds"});
    std::string truncated = raw_file("{}", 0);
    truncated[0] = 40;  // says 40 header bytes, has 2
    expect_error(parse_status(truncated), StatusCode::kDataLoss, {kPath, "truncated"});
}

TEST(SafetensorsMalformedTest, EveryTruncationOfAValidFileFails) {
    SafetensorsWriter writer;
    writer.add("a", DType::kF32, {2}, pattern_bytes(8, 1));
    writer.add("b", DType::kI8, {3}, pattern_bytes(3, 2));
    std::string full = *writer.serialize();
    for (size_t n = 0; n < full.size(); ++n) {
        Status s = parse_status(full.substr(0, n));
        EXPECT_FALSE(s.is_ok()) << n;
        EXPECT_NE(s.message().find(kPath), std::string::npos) << s.to_string();
    }
    EXPECT_TRUE(parse_status(full).is_ok());
}

// ---------------------------------------------------------------------------------
// Sharded directories

std::vector<SafetensorsTensor> as_set_tensors(const std::vector<Tensor>& tensors) {
    std::vector<SafetensorsTensor> out;
    for (const Tensor& t : tensors) out.push_back({t.name, t.dtype, t.shape, t.bytes});
    return out;
}

TEST(SafetensorsSetTest, ShardedRoundTripWithIndex) {
    Env* env = Env::default_env();
    std::vector<Tensor> tensors;
    for (int i = 0; i < 10; ++i) {
        tensors.push_back({"t" + std::to_string(i),
                           DType::kF32,
                           {25},
                           pattern_bytes(100, static_cast<uint64_t>(i))});
    }
    std::string dir = temp_dir("sharded");
    std::vector<SafetensorsTensor> in = as_set_tensors(tensors);
    ASSERT_TRUE(write_sharded_safetensors(env, dir, in, 250, {{"format", "pt"}}).is_ok());
    // 100-byte tensors, at most 250 bytes a shard: 5 shards of two.
    EXPECT_TRUE(env->file_exists(dir + "/model-00001-of-00005.safetensors"));
    EXPECT_TRUE(env->file_exists(dir + "/model-00005-of-00005.safetensors"));
    EXPECT_FALSE(env->file_exists(dir + "/model.safetensors"));
    std::string index = *env->read_file(dir + "/model.safetensors.index.json");
    EXPECT_NE(index.find("\"total_size\": 1000"), std::string::npos) << index;

    Result<SafetensorsSet> set = SafetensorsSet::open_dir(env, dir);
    ASSERT_TRUE(set.is_ok()) << set.status().to_string();
    EXPECT_EQ(set->files().size(), 5u);
    std::vector<std::string> names = set->names();
    ASSERT_EQ(names.size(), 10u);
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    for (const Tensor& t : tensors) {
        EXPECT_TRUE(set->has(t.name));
        Result<TensorView> v = set->view(t.name);
        ASSERT_TRUE(v.is_ok());
        EXPECT_EQ(std::vector<uint8_t>(v->data.begin(), v->data.end()), t.bytes);
        EXPECT_EQ(set->file_of(t.name)->metadata().at("format"), "pt");
        EXPECT_EQ(set->find(t.name)->shape, t.shape);
    }
    EXPECT_FALSE(set->has("t10"));
    expect_error(set->view("t10").status(), StatusCode::kNotFound, {dir, "'t10'"});
}

TEST(SafetensorsSetTest, SingleShardIsModelSafetensors) {
    Env* env = Env::default_env();
    std::vector<Tensor> tensors = one_tensor_per_dtype();
    std::string dir = temp_dir("single");
    ASSERT_TRUE(write_sharded_safetensors(env, dir, as_set_tensors(tensors), 1 << 20).is_ok());
    EXPECT_TRUE(env->file_exists(dir + "/model.safetensors"));
    EXPECT_FALSE(env->file_exists(dir + "/model.safetensors.index.json"));
    Result<SafetensorsSet> set = SafetensorsSet::open_dir(env, dir);
    ASSERT_TRUE(set.is_ok()) << set.status().to_string();
    EXPECT_EQ(set->names().size(), tensors.size());
    expect_same_tensors(set->files()[0], tensors);
}

TEST(SafetensorsSetTest, OversizedTensorGetsItsOwnShard) {
    Env* env = Env::default_env();
    std::vector<Tensor> tensors = {{"small", DType::kI8, {4}, pattern_bytes(4, 1)},
                                   {"big", DType::kI8, {64}, pattern_bytes(64, 2)},
                                   {"small2", DType::kI8, {4}, pattern_bytes(4, 3)}};
    std::string dir = temp_dir("oversized");
    ASSERT_TRUE(write_sharded_safetensors(env, dir, as_set_tensors(tensors), 16).is_ok());
    Result<SafetensorsSet> set = SafetensorsSet::open_dir(env, dir);
    ASSERT_TRUE(set.is_ok()) << set.status().to_string();
    EXPECT_EQ(set->files().size(), 3u);
    EXPECT_EQ(set->view("big")->data.size(), 64u);
}

TEST(SafetensorsSetTest, DuplicateNamesAcrossShardsAreRejected) {
    std::vector<Tensor> tensors = {{"a", DType::kI8, {4}, pattern_bytes(4, 1)},
                                   {"a", DType::kI8, {4}, pattern_bytes(4, 2)}};
    std::string dir = temp_dir("dup_shards");
    expect_error(write_sharded_safetensors(Env::default_env(), dir, as_set_tensors(tensors), 4),
                 StatusCode::kInvalidArgument, {"'a'", "twice"});
}

TEST(SafetensorsSetTest, BrokenDirectoriesAndIndexes) {
    Env* env = Env::default_env();
    std::string dir = temp_dir("broken");
    expect_error(SafetensorsSet::open_dir(env, dir).status(), StatusCode::kNotFound,
                 {dir, "model.safetensors"});

    SafetensorsWriter writer;
    writer.add("a", DType::kI8, {2}, pattern_bytes(2, 1));
    ASSERT_TRUE(writer.write(env, dir + "/shard.safetensors").is_ok());
    const std::string index_path = dir + "/model.safetensors.index.json";
    struct Case {
        const char* what;
        std::string index;
        StatusCode code;
        std::vector<std::string> parts;
    };
    const Case cases[] = {
        {"syntax", "{\"weight_map\": ", StatusCode::kInvalidArgument, {"not valid JSON"}},
        {"no weight_map", "{\"metadata\": {}}", StatusCode::kInvalidArgument, {"weight_map"}},
        {"value not string", "{\"weight_map\": {\"a\": 3}}", StatusCode::kInvalidArgument, {"'a'"}},
        {"path escape",
         "{\"weight_map\": {\"a\": \"../shard.safetensors\"}}",
         StatusCode::kInvalidArgument,
         {"'a'", "file name"}},
        {"missing shard",
         "{\"weight_map\": {\"a\": \"gone.safetensors\"}}",
         StatusCode::kNotFound,
         {"gone.safetensors"}},
        {"tensor not in shard",
         "{\"weight_map\": {\"zz\": \"shard.safetensors\"}}",
         StatusCode::kDataLoss,
         {"'zz'", "shard.safetensors"}},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        ASSERT_TRUE(env->write_file(index_path, c.index).is_ok());
        Status s = SafetensorsSet::open_dir(env, dir).status();
        expect_error(s, c.code, {dir});
        for (const std::string& part : c.parts) expect_error(s, c.code, {part});
    }
    ASSERT_TRUE(
        env->write_file(index_path, "{\"weight_map\": {\"a\": \"shard.safetensors\"}}").is_ok());
    Result<SafetensorsSet> set = SafetensorsSet::open_dir(env, dir);
    ASSERT_TRUE(set.is_ok()) << set.status().to_string();
    EXPECT_EQ(to_string(set->view("a")->data), to_string(pattern_bytes(2, 1)));
}

}  // namespace
}  // namespace dsi
