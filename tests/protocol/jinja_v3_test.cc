// The V3 chat template encoder (ChatEncoding::kDeepSeekV3Template) against the
// reference: @huggingface/jinja rendering the real `chat_template` of the original
// V3 tokenizer_config.json (tests/protocol/render_v3_template.mjs). Conversations
// come from tests/cases/protocol/jinja/*.json (Chat Completions messages; the C++
// side reads them through the Chat Completions request adapter, as the server
// does). Checked: the rendered text byte for byte, and -- except for cases marked
// "injection", where caller text spells special tokens on purpose -- the token ids
// equal HF's tokenisation of the rendered string (special tokens recognised).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "protocol/adapters.h"
#include "protocol/encoder.h"
#include "protocol/internal/test_util.h"
#include "node_util.h"
#include "support/build_paths.h"

namespace dsi::protocol {
namespace {

namespace fs = std::filesystem;
using internal::read_file_or_empty;
using internal::reference_tokenizer;
using J = nlohmann::ordered_json;

const std::string kSource = DSINFER_SOURCE_DIR;

TEST(JinjaV3, MatchesHuggingFaceJinja) {
    const std::string node_dir = kSource + "/tests/protocol";
    ASSERT_TRUE(fs::exists(node_dir + "/node_modules/@huggingface/jinja"))
        << "run scripts/setup.sh (npm ci in tests/protocol)";
    const Tokenizer* tok = reference_tokenizer();
    ASSERT_NE(tok, nullptr) << "reference tokenizer missing; run scripts/setup.sh";
    auto tok_dir = find_reference_tokenizer_dir(Env::default_env(), kSource);
    ASSERT_TRUE(tok_dir.is_ok());
    const std::string config = *tok_dir + "/tokenizer_config.json";
    const std::string cases_dir = kSource + "/tests/cases/protocol/jinja";

    const fs::path tmp = fs::temp_directory_path() /
                         ("dsinfer_jinja_v3_" + std::to_string(::getpid()));
    fs::create_directories(tmp);
    const std::string out_path = (tmp / "rendered.json").string();
    const std::string cmd =
        node_test::node_command("render_v3_template.mjs", {config, cases_dir, out_path});
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const J rendered = J::parse(read_file_or_empty(out_path));
    fs::remove_all(tmp);

    const SpecialTokens st = SpecialTokens::from_tokenizer(*tok);
    size_t checked = 0;
    for (const fs::path& file : node_test::json_case_files(cases_dir)) {
        const J cases = J::parse(read_file_or_empty(file.string()));
        for (const J& k : cases) {
            const std::string key =
                file.filename().string() + "/" + k["name"].get<std::string>();
            SCOPED_TRACE(key);
            ASSERT_TRUE(rendered.contains(key));
            J body = {{"model", "deepseek-v3"}, {"messages", k["messages"]}};
            if (k.contains("tools")) {
                body["tools"] = k["tools"];
            }
            auto conv = parse_chat_completions_request(body.dump());
            ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
            EncodeOptions opt;
            opt.add_generation_prompt = k.value("add_generation_prompt", true);
            opt.add_bos = k.value("add_bos", true);
            auto prompt = encode_conversation(ChatEncoding::kDeepSeekV3Template, *conv, st, opt);
            ASSERT_TRUE(prompt.is_ok()) << prompt.status().to_string();
            const std::string want = rendered[key].get<std::string>();
            EXPECT_EQ(prompt->to_text(), want);
            if (!k.value("injection", false)) {
                EXPECT_EQ(prompt->encode(*tok), tok->encode_with_special(want));
            }
            ++checked;
        }
    }
    EXPECT_EQ(checked, rendered.size());
    EXPECT_GE(checked, 20u);
}

// The template has no branch for `developer` messages (it would drop them
// silently); the encoder refuses them instead (docs/protocol.md).
TEST(JinjaV3, DeveloperRoleIsRejected) {
    Conversation c;
    Message dev;
    dev.role = Role::kDeveloper;
    dev.content = "be terse";
    Message user;
    user.content = "hi";
    c.messages = {dev, user};
    auto p = encode_conversation(ChatEncoding::kDeepSeekV3Template, c, SpecialTokens{});
    ASSERT_FALSE(p.is_ok());
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsi::protocol
