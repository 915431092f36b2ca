// Protocol layer cost: V3.2 chat encoding (render + tokenize) and the streaming
// DSML parser, per token, on the V3.2 golden conversation scaled up. Prints a
// small table for bench/RESULTS.md.
#include <chrono>
#include <cstdio>

#include "protocol/adapters.h"
#include "protocol/encoder.h"
#include "protocol/internal/test_util.h"
#include "protocol/output_parser.h"
#include "support/build_paths.h"

using namespace dsi;            // NOLINT
using namespace dsi::protocol;  // NOLINT

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

int main() {
    const Tokenizer* tok = dsi::protocol::internal::reference_tokenizer();
    if (tok == nullptr) {
        std::fprintf(stderr, "reference tokenizer missing: run scripts/setup.sh\n");
        return 1;
    }
    const SpecialTokens st = SpecialTokens::from_tokenizer(*tok);
    auto in = nlohmann::ordered_json::parse(dsi::protocol::internal::read_file_or_empty(
        std::string(DSINFER_SOURCE_DIR) + "/tests/data/deepseek-encoding/dsv32/test_input.json"));
    nlohmann::ordered_json body = {{"model", "m"}, {"messages", in["messages"]},
                                   {"tools", in["tools"]}};
    auto conv = parse_chat_completions_request(body.dump());
    if (!conv.is_ok()) {
        std::fprintf(stderr, "%s\n", conv.status().to_string().c_str());
        return 1;
    }
    EncodeOptions opt;
    opt.thinking = true;
    // Encode: render + tokenize, repeated.
    const int kReps = 200;
    size_t tokens = 0;
    double t0 = now_s();
    for (int i = 0; i < kReps; ++i) {
        auto p = encode_conversation(ChatEncoding::kDeepSeekV32, *conv, st, opt);
        tokens += p->encode(*tok).size();
    }
    const double enc_s = now_s() - t0;
    double t1 = now_s();
    for (int i = 0; i < kReps; ++i) {
        auto p = encode_conversation(ChatEncoding::kDeepSeekV32, *conv, st, opt);
        tokens += p->pieces().empty() ? 1 : 0;
    }
    const double render_s = now_s() - t1;

    // Parse: a completion with reasoning, content and two tool calls, one token at a time.
    Message m;
    m.role = Role::kAssistant;
    m.reasoning = in["messages"][4]["reasoning_content"].get<std::string>();
    m.content = in["messages"][5].value("content", "");
    for (const auto& tc : in["messages"][4]["tool_calls"]) {
        m.tool_calls.push_back(ToolCall{"", tc["function"]["name"].get<std::string>(),
                                        tc["function"]["arguments"].get<std::string>()});
    }
    std::vector<int32_t> ids = encode_completion(ChatEncoding::kDeepSeekV32, m, true, st)
                                   ->encode(*tok);
    ParserOptions popt;
    popt.thinking = true;
    const int kParseReps = 20000;
    size_t num_events = 0;
    double t2 = now_s();
    for (int i = 0; i < kParseReps; ++i) {
        OutputParser parser(*tok, st, popt);
        std::vector<Event> ev;
        for (int32_t id : ids) {
            parser.push(std::span<const int32_t>(&id, 1), &ev);
        }
        num_events += ev.size();
    }
    const double parse_s = now_s() - t2;
    const size_t prompt_tokens = tokens / kReps;
    std::printf("| V3.2 encode (render + tokenize), golden conversation | %zu tokens | %.2f us/token |\n",
                prompt_tokens, enc_s * 1e6 / static_cast<double>(tokens));
    std::printf("| V3.2 render only (no tokenize) | %zu tokens | %.3f us/token |\n", prompt_tokens,
                render_s * 1e6 / static_cast<double>(prompt_tokens * kReps));
    std::printf("| DSML streaming parse, one token per push | %zu tokens | %.3f us/token (%zu events/run) |\n",
                ids.size(), parse_s * 1e6 / static_cast<double>(ids.size() * kParseReps),
                num_events / kParseReps);
    return 0;
}
