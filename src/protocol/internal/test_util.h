// Test helpers shared by the protocol tests: file reading and the reference
// tokenizer. Thread model: test-only, single thread.
#pragma once

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "base/env.h"
#include "tokenizer/tokenizer.h"
#include "support/build_paths.h"

namespace dsi::protocol::internal {

inline std::string read_file_or_empty(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The reference tokenizer (scripts/setup.sh installs it); nullptr when missing.
inline const Tokenizer* reference_tokenizer() {
    static std::unique_ptr<Tokenizer> tok = [] {
        std::unique_ptr<Tokenizer> t;
        auto dir = find_reference_tokenizer_dir(Env::default_env(), DSINFER_SOURCE_DIR);
        if (dir.is_ok()) {
            auto r = Tokenizer::load(Env::default_env(), *dir);
            if (r.is_ok()) {
                t = std::move(r.value());
            }
        }
        return t;
    }();
    return tok.get();
}

}  // namespace dsi::protocol::internal
