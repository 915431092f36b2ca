// Test helpers shared by safetensors_test.cc and gguf_test.cc. Test-only.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace dsi::format_testing {

inline std::span<const uint8_t> as_bytes(std::string_view s) {
    return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

inline std::string to_string(std::span<const uint8_t> b) {
    return {reinterpret_cast<const char*>(b.data()), b.size()};
}

inline std::string temp_root() {
    const char* t = std::getenv("TMPDIR");
    return std::string(t ? t : "/tmp") + "/dsi_model_format_test_" + std::to_string(::getpid());
}

// Removes temp_root() when the test binary finishes.
class TempRootCleanup : public ::testing::Environment {
public:
    void TearDown() override {
        std::error_code ec;
        std::filesystem::remove_all(temp_root(), ec);
    }
};
inline ::testing::Environment* const kTempRootCleanup =
    ::testing::AddGlobalTestEnvironment(new TempRootCleanup);

// A fresh directory under temp_root() for `name`.
inline std::string temp_dir(const std::string& name) {
    std::string dir = temp_root() + "/" + name;
    EXPECT_TRUE(Env::default_env()->create_dirs(dir).is_ok());
    return dir;
}

// `n` deterministic pseudo-random bytes.
inline std::vector<uint8_t> pattern_bytes(size_t n, uint64_t seed) {
    SplitMix64 rng(seed);
    std::vector<uint8_t> out(n);
    for (auto& b : out) b = static_cast<uint8_t>(rng.next());
    return out;
}

struct TestTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

// Gives each tensor a distinct byte pattern of the size its dtype and shape need.
inline void fill_bytes(std::vector<TestTensor>& tensors) {
    uint64_t seed = 1;
    for (TestTensor& t : tensors) {
        int64_t blocks = shape_numel(t.shape) / dtype_block_elems(t.dtype);
        t.bytes = pattern_bytes(static_cast<size_t>(blocks * dtype_block_bytes(t.dtype)), seed++);
    }
}

// Asserts a view has the tensor's dtype, shape and bytes.
inline void expect_view(const Result<TensorView>& v, const TestTensor& t) {
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_EQ(v->dtype, t.dtype) << t.name;
    EXPECT_EQ(v->shape, t.shape) << t.name;
    EXPECT_EQ(std::vector<uint8_t>(v->data.begin(), v->data.end()), t.bytes) << t.name;
}

// Asserts `status` has `code` and its message contains every one of `parts`.
inline void expect_error(const Status& status, StatusCode code,
                         std::initializer_list<std::string_view> parts) {
    EXPECT_EQ(status.code(), code) << status.to_string();
    for (std::string_view part : parts) {
        EXPECT_NE(status.message().find(part), std::string::npos)
            << "'" << part << "' missing from: " << status.to_string();
    }
}

}  // namespace dsi::format_testing
