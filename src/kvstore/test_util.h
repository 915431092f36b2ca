// Test helpers shared by the kvstore tests and the benchmark: deterministic blocks and
// temp dirs. Not part of the library. Thread model: none (test code).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "base/env.h"
#include "kvstore/block_format.h"

namespace dsi::kvstore::testing {

struct TestBlock {
    BlockInfo info;
    std::vector<std::vector<uint8_t>> layers;
    std::vector<std::span<const uint8_t>> spans() const { return {layers.begin(), layers.end()}; }
};

inline TestBlock make_block(uint64_t seed, uint32_t num_layers = 4, size_t layer_bytes = 1000,
                            TrafficClass cls = TrafficClass::kChatbot) {
    TestBlock b;
    b.info.key = {seed * 0x9e3779b97f4a7c15ULL + 1, seed ^ 0x5555};
    b.info.model = model_identity("test-model");
    b.info.num_layers = num_layers;
    b.info.dtype = 7;
    b.info.num_tokens = 128;
    std::vector<int32_t> ids(128);
    for (int i = 0; i < 128; ++i) {
        ids[i] = static_cast<int32_t>(seed * 131 + i);
    }
    b.info.token_hash = token_ids_hash(ids);
    b.info.traffic_class = cls;
    SplitMix64 rng(seed);
    b.layers.resize(num_layers);
    for (auto& l : b.layers) {
        l.resize(layer_bytes);
        for (size_t i = 0; i < layer_bytes; i += 8) {
            uint64_t v = rng.next();
            for (size_t j = 0; j < 8 && i + j < layer_bytes; ++j) {
                l[i + j] = static_cast<uint8_t>(v >> (8 * j));
            }
        }
    }
    return b;
}

// A fresh directory under TMPDIR, removed with the object.
class TempDir {
public:
    TempDir() {
        const char* base = std::getenv("TMPDIR");
        std::string tmpl = std::string(base ? base : "/tmp") + "/dsi_kvstore_XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        path_ = ::mkdtemp(buf.data());
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

}  // namespace dsi::kvstore::testing
