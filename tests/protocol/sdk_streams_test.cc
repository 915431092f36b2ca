// Our SSE streams through the official SDKs' own stream parsers and accumulators
// (tests/protocol/check_sdk_streams.mjs: openai's ChatCompletionStream and
// ResponseStream, @anthropic-ai/sdk's MessageStream, each fed our bytes by a fake
// fetch -- no network). Scenarios come from tests/cases/protocol/streams/*.json:
// an assistant message is rendered as the model would generate it
// (encode_completion), tokenised with the reference vocabulary, parsed token by
// token by OutputParser, and the events written by StreamWriter for each API.
// The SDKs must raise no error and reconstruct the message (content, reasoning,
// tool calls with their parsed arguments, finish reason).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "protocol/adapters.h"
#include "protocol/encoder.h"
#include "protocol/internal/test_util.h"
#include "node_util.h"
#include "support/build_paths.h"

namespace dsi::protocol {
namespace {

using J = nlohmann::ordered_json;
namespace fs = std::filesystem;
using internal::reference_tokenizer;

const std::string kSource = DSINFER_SOURCE_DIR;

const std::pair<ApiProtocol, std::string_view> kApis[] = {
    {ApiProtocol::kChatCompletions, "chat"},
    {ApiProtocol::kResponses, "responses"},
    {ApiProtocol::kMessages, "messages"}};

TEST(SdkStreams, OfficialParsersReconstructOurStreams) {
    const std::string node_dir = kSource + "/tests/protocol";
    ASSERT_TRUE(fs::exists(node_dir + "/node_modules/openai") &&
                fs::exists(node_dir + "/node_modules/@anthropic-ai/sdk"))
        << "run scripts/setup.sh (npm ci in tests/protocol)";
    const Tokenizer* tok = reference_tokenizer();
    ASSERT_NE(tok, nullptr) << "reference tokenizer missing; run scripts/setup.sh";
    const SpecialTokens st = SpecialTokens::from_tokenizer(*tok);

    const fs::path tmp =
        fs::temp_directory_path() / ("dsinfer_sdk_streams_" + std::to_string(::getpid()));
    fs::create_directories(tmp);
    J manifest = J::array();
    const std::string cases_dir = kSource + "/tests/cases/protocol/streams";
    for (const fs::path& file : node_test::json_case_files(cases_dir)) {
        for (const J& k : J::parse(internal::read_file_or_empty(file.string()))) {
            const std::string name = k["name"].get<std::string>();
            SCOPED_TRACE(name);
            const bool v4 = k.value("dialect", "v32") == "v4";
            const bool thinking = k.value("thinking", false);
            const J& m = k["message"];
            Message msg;
            msg.role = Role::kAssistant;
            msg.content = m.value("content", "");
            if (m.contains("reasoning")) {
                msg.reasoning = m["reasoning"].get<std::string>();
            }
            J expect_calls = J::array();
            for (const J& c : m.value("tool_calls", J::array())) {
                msg.tool_calls.push_back(
                    ToolCall{"", c["name"].get<std::string>(), c["arguments"].dump()});
                expect_calls.push_back(c);
            }
            auto completion = encode_completion(
                v4 ? ChatEncoding::kDeepSeekV4 : ChatEncoding::kDeepSeekV32, msg, thinking, st);
            ASSERT_TRUE(completion.is_ok()) << completion.status().to_string();
            std::vector<int32_t> ids = completion->encode(*tok);
            const bool drop_eos = k.value("drop_eos", false);
            if (drop_eos) {
                ASSERT_EQ(ids.back(), st.eos);
                ids.pop_back();
            }

            ParserOptions popt;
            popt.dialect = v4 ? DsmlDialect::kV4 : DsmlDialect::kV32;
            popt.thinking = thinking;
            popt.tool_call_id_prefix = "call_" + name + "_";
            OutputParser parser(*tok, st, popt);
            std::vector<Event> events;
            for (int32_t id : ids) {
                parser.push(std::span<const int32_t>(&id, 1), &events);
            }
            if (!parser.done()) {
                parser.finish(StopReason::kLength, &events);
            }

            J entry = {{"name", name}, {"streams", J::object()}};
            for (const auto& [api, api_name] : kApis) {
                ResponseMeta meta;
                meta.id = "id_" + name;
                meta.model = "deepseek-test";
                meta.created_s = 1700000000;
                meta.prompt_tokens = 17;
                meta.completion_tokens = static_cast<int64_t>(ids.size());
                meta.include_usage = true;
                StreamWriter writer(api, meta);
                std::string wire;
                for (const SseEvent& s : writer.start()) {
                    wire += s.to_wire();
                }
                for (const Event& e : events) {
                    for (const SseEvent& s : writer.on_event(e)) {
                        wire += s.to_wire();
                    }
                }
                const std::string out = name + "." + std::string(api_name) + ".sse";
                std::ofstream(tmp / out, std::ios::binary) << wire;
                entry["streams"][std::string(api_name)] = out;
            }
            entry["expect"] = {
                {"reasoning", msg.reasoning.value_or("")},
                {"content", msg.content},
                {"tool_calls", expect_calls},
                {"finish", drop_eos ? "length" : (msg.tool_calls.empty() ? "stop" : "tool_calls")}};
            manifest.push_back(entry);
        }
    }
    ASSERT_GE(manifest.size(), 5u);
    std::ofstream(tmp / "manifest.json") << manifest.dump(1);
    const std::string cmd = node_test::node_command("check_sdk_streams.mjs", {tmp.string()});
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << " (streams kept in " << tmp << ")";
    if (!HasFailure()) {
        fs::remove_all(tmp);
    }
}

}  // namespace
}  // namespace dsi::protocol
