// Adapters: request cases from tests/cases/protocol/adapters/requests.json (the
// exact 400 message naming the field), and streaming sequences checked against
// each protocol's ordering rules (the invariants the official SDKs enforce).
#include "protocol/adapters.h"

#include <gtest/gtest.h>

#include "protocol/encoder.h"
#include "protocol/internal/test_util.h"
#include "protocol/structured_output.h"
#include "support/build_paths.h"

namespace dsi::protocol {
namespace {

using internal::read_file_or_empty;
using J = nlohmann::ordered_json;

ApiProtocol api_of(const std::string& s) {
    if (s == "responses") {
        return ApiProtocol::kResponses;
    }
    return s == "messages" ? ApiProtocol::kMessages : ApiProtocol::kChatCompletions;
}

TEST(Adapters, RequestCases) {
    const J cases = J::parse(read_file_or_empty(std::string(DSINFER_SOURCE_DIR) +
                                                "/tests/cases/protocol/adapters/requests.json"));
    ASSERT_GE(cases.size(), 15u);
    for (const J& k : cases) {
        const std::string name = k["name"];
        const std::string body = k.contains("raw") ? k["raw"].get<std::string>() : k["body"].dump();
        auto r = parse_request(api_of(k["api"]), body);
        if (k.contains("error")) {
            ASSERT_FALSE(r.is_ok()) << name;
            EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << name;
            EXPECT_EQ(http_status(r.status().code()), 400);
            EXPECT_TRUE(r.status().message().starts_with(k["error"].get<std::string>()))
                << name << ": " << r.status().message();
            const J err = J::parse(json_error_body(api_of(k["api"]), r.status()));
            EXPECT_TRUE(err.contains("error")) << name;
            continue;
        }
        ASSERT_TRUE(r.is_ok()) << name << ": " << r.status().to_string();
        const J& e = k["expect"];
        EXPECT_EQ(r->messages.size(), e.value("num_messages", size_t{0})) << name;
        EXPECT_EQ(r->tools.size(), e.value("num_tools", size_t{0})) << name;
        EXPECT_EQ(r->thinking, e.value("thinking", false)) << name;
        if (e.contains("max_tokens")) {
            EXPECT_EQ(r->sampling.max_tokens.value_or(-1), e["max_tokens"].get<int64_t>()) << name;
        }
        // Every accepted request encodes with the V3.2 encoder.
        auto p = encode_conversation(ChatEncoding::kDeepSeekV32, *r, SpecialTokens{});
        EXPECT_TRUE(p.is_ok()) << name << ": " << p.status().to_string();
    }
}

// dsinfer's JSON options (issue 21) as read_structured_request() reads them: next to
// `schema` in each API's field (json_object: in the format object), into the spec;
// anything but a boolean or null is an error naming the field.
TEST(StructuredRequest, JsonOptionsPerApi) {
    struct Case {
        ApiProtocol api;
        const char* body;
        bool flexible, any_order;
        const char* field;  // the request's grammar field
    };
    const Case cases[] = {
        {ApiProtocol::kChatCompletions,
         R"({"response_format":{"type":"json_schema","json_schema":{"name":"p","flexible_whitespace":true,"schema":{}}}})",
         true, false, "response_format.json_schema.schema"},
        {ApiProtocol::kChatCompletions,
         R"({"response_format":{"type":"json_object","any_property_order":true,"flexible_whitespace":null}})",
         false, true, "response_format"},
        {ApiProtocol::kResponses,
         R"({"text":{"format":{"type":"json_schema","name":"p","any_property_order":true,"flexible_whitespace":true,"schema":{}}}})",
         true, true, "text.format.schema"},
        {ApiProtocol::kMessages,
         R"({"output_config":{"effort":"low","format":{"type":"json_schema","any_property_order":false,"schema":{"type":"object"}}}})",
         false, false, "output_config.format.schema"},
    };
    for (const Case& c : cases) {
        auto r = read_structured_request(c.api, J::parse(c.body));
        ASSERT_TRUE(r.is_ok()) << c.body << ": " << r.status().to_string();
        ASSERT_TRUE(r->has_value()) << c.body;
        EXPECT_EQ((*r)->spec.flexible_whitespace, c.flexible) << c.body;
        EXPECT_EQ((*r)->spec.any_property_order, c.any_order) << c.body;
        EXPECT_EQ((*r)->field, c.field) << c.body;
    }
    // Anthropic without output_config.format: no grammar.
    auto none = read_structured_request(ApiProtocol::kMessages,
                                        J::parse(R"({"output_config":{"effort":"low"}})"));
    ASSERT_TRUE(none.is_ok());
    EXPECT_FALSE(none->has_value());
    const std::pair<ApiProtocol, const char*> bad[] = {
        {ApiProtocol::kChatCompletions,
         R"({"response_format":{"type":"json_schema","json_schema":{"name":"p","any_property_order":"true","schema":{}}}})"},
        {ApiProtocol::kResponses,
         R"({"text":{"format":{"type":"json_object","flexible_whitespace":0}}})"},
        {ApiProtocol::kMessages,
         R"({"output_config":{"format":{"type":"json_schema","flexible_whitespace":"no","schema":{}}}})"},
    };
    const char* named[] = {"response_format.json_schema.any_property_order: expected a boolean",
                           "text.format.flexible_whitespace: expected a boolean",
                           "output_config.format.flexible_whitespace: expected a boolean"};
    for (size_t i = 0; i < std::size(bad); ++i) {
        auto r = read_structured_request(bad[i].first, J::parse(bad[i].second));
        ASSERT_FALSE(r.is_ok()) << bad[i].second;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        EXPECT_EQ(r.status().message(), named[i]);
    }
}

std::vector<Event> sample_events() {
    std::vector<Event> ev;
    auto add = [&](EventKind k, std::string text, int idx = -1) {
        Event e;
        e.kind = k;
        e.text = std::move(text);
        e.tool_index = idx;
        ev.push_back(e);
    };
    add(EventKind::kReasoningDelta, "thinking ");
    add(EventKind::kReasoningDelta, "more");
    add(EventKind::kContentDelta, "Let me check.");
    Event s;
    s.kind = EventKind::kToolCallStart;
    s.tool_index = 0;
    s.tool_id = "call_0";
    s.tool_name = "get_weather";
    ev.push_back(s);
    add(EventKind::kToolCallArgs, "{\"city\": \"", 0);
    add(EventKind::kToolCallArgs, "Paris\"}", 0);
    add(EventKind::kToolCallEnd, "", 0);
    Event f;
    f.kind = EventKind::kFinish;
    f.finish = StopReason::kToolCalls;
    ev.push_back(f);
    return ev;
}

std::vector<SseEvent> stream(ApiProtocol api, const std::vector<Event>& events) {
    ResponseMeta meta{"id1", "m", 1, 3, 9, 2, true};
    StreamWriter w(api, meta);
    std::vector<SseEvent> out = w.start();
    for (const Event& e : events) {
        for (auto& s : w.on_event(e)) {
            out.push_back(std::move(s));
        }
    }
    return out;
}

TEST(Adapters, ChatCompletionsStreamOrder) {
    const auto sse = stream(ApiProtocol::kChatCompletions, sample_events());
    ASSERT_GE(sse.size(), 4u);
    EXPECT_EQ(sse.back().data, "[DONE]");
    EXPECT_EQ(J::parse(sse[0].data)["choices"][0]["delta"]["role"], "assistant");
    std::string reasoning, args;
    bool saw_start = false, saw_finish = false;
    for (size_t i = 0; i + 1 < sse.size(); ++i) {
        EXPECT_TRUE(sse[i].event.empty());
        const J c = J::parse(sse[i].data);
        if (c["choices"].empty()) {
            EXPECT_TRUE(saw_finish);  // usage chunk after finish_reason
            EXPECT_EQ(c["usage"]["total_tokens"], 12);
            continue;
        }
        const J& ch = c["choices"][0];
        EXPECT_FALSE(saw_finish);
        if (!ch["finish_reason"].is_null()) {
            EXPECT_EQ(ch["finish_reason"], "tool_calls");
            saw_finish = true;
        }
        const J& d = ch["delta"];
        if (d.contains("reasoning_content")) {
            reasoning += d["reasoning_content"].get<std::string>();
        }
        if (d.contains("tool_calls")) {
            const J& tc = d["tool_calls"][0];
            EXPECT_EQ(tc["index"], 0);
            if (!saw_start) {
                EXPECT_EQ(tc["id"], "call_0");
                EXPECT_EQ(tc["type"], "function");
                EXPECT_EQ(tc["function"]["name"], "get_weather");
                saw_start = true;
            } else {
                EXPECT_FALSE(tc.contains("id"));
            }
            args += tc["function"]["arguments"].get<std::string>();
        }
    }
    EXPECT_EQ(reasoning, "thinking more");
    EXPECT_EQ(J::parse(args), J::parse("{\"city\": \"Paris\"}"));
    EXPECT_TRUE(saw_finish);
}

TEST(Adapters, ResponsesStreamOrder) {
    const auto sse = stream(ApiProtocol::kResponses, sample_events());
    ASSERT_GE(sse.size(), 3u);
    EXPECT_EQ(sse[0].event, "response.created");
    EXPECT_EQ(sse[1].event, "response.in_progress");
    EXPECT_EQ(sse.back().event, "response.completed");
    std::vector<int> state;  // per output_index: 1 added, 2 done
    int64_t seq = -1;
    bool reasoning_part = false;  // the SDK needs the part before reasoning_text deltas
    for (const auto& s : sse) {
        const J j = J::parse(s.data);
        if (s.event == "response.content_part.added" && j["part"]["type"] == "reasoning_text") {
            reasoning_part = true;
        }
        if (s.event == "response.reasoning_text.delta") {
            EXPECT_TRUE(reasoning_part);
        }
        EXPECT_EQ(j["type"], s.event);
        EXPECT_EQ(j["sequence_number"].get<int64_t>(), seq + 1);
        seq = j["sequence_number"].get<int64_t>();
        if (j.contains("response")) {
            EXPECT_EQ(j["response"]["id"], "id1");
        }
        if (s.event == "response.output_item.added") {
            EXPECT_EQ(j["output_index"].get<size_t>(), state.size());
            state.push_back(1);
        } else if (j.contains("output_index")) {
            const size_t idx = j["output_index"].get<size_t>();
            ASSERT_LT(idx, state.size()) << s.event;
            EXPECT_EQ(state[idx], 1) << s.event;
            if (s.event == "response.output_item.done") {
                state[idx] = 2;
            }
        }
    }
    for (int st : state) {
        EXPECT_EQ(st, 2);  // every item finished before response.completed
    }
    const J done = J::parse(sse.back().data)["response"];
    ASSERT_EQ(done["output"].size(), 3u);
    EXPECT_EQ(done["output"][2]["type"], "function_call");
    EXPECT_EQ(done["output"][2]["arguments"], "{\"city\": \"Paris\"}");
}

TEST(Adapters, MessagesStreamOrder) {
    const auto sse = stream(ApiProtocol::kMessages, sample_events());
    ASSERT_GE(sse.size(), 3u);
    EXPECT_EQ(sse.front().event, "message_start");
    EXPECT_EQ(sse.back().event, "message_stop");
    EXPECT_EQ(sse[sse.size() - 2].event, "message_delta");
    EXPECT_EQ(J::parse(sse[sse.size() - 2].data)["delta"]["stop_reason"], "tool_use");
    int open = -1;
    int next = 0;
    std::string partial;
    for (const auto& s : sse) {
        ASSERT_FALSE(s.event.empty());  // the SDK skips messages without event:
        const J j = J::parse(s.data);
        EXPECT_EQ(j["type"], s.event);
        if (s.event == "content_block_start") {
            EXPECT_EQ(open, -1);
            EXPECT_EQ(j["index"], next);
            open = next++;
        } else if (s.event == "content_block_delta") {
            EXPECT_EQ(j["index"], open);
            if (j["delta"]["type"] == "input_json_delta") {
                partial += j["delta"]["partial_json"].get<std::string>();
            }
        } else if (s.event == "content_block_stop") {
            EXPECT_EQ(j["index"], open);
            open = -1;
        }
    }
    EXPECT_EQ(open, -1);
    EXPECT_EQ(next, 3);
    EXPECT_EQ(J::parse(partial)["city"], "Paris");
}

TEST(Adapters, NonStreamingResponses) {
    const Completion c = fold_events(sample_events());
    ResponseMeta meta{"id1", "m", 1, 3, 9, 2, false};
    const J chat = J::parse(build_response(ApiProtocol::kChatCompletions, meta, c));
    EXPECT_EQ(chat["choices"][0]["message"]["reasoning_content"], "thinking more");
    EXPECT_EQ(chat["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(chat["choices"][0]["finish_reason"], "tool_calls");
    const J resp = J::parse(build_response(ApiProtocol::kResponses, meta, c));
    EXPECT_EQ(resp["status"], "completed");
    EXPECT_EQ(resp["output"][0]["type"], "reasoning");
    const J msg = J::parse(build_response(ApiProtocol::kMessages, meta, c));
    EXPECT_EQ(msg["stop_reason"], "tool_use");
    EXPECT_EQ(msg["content"][2]["input"]["city"], "Paris");
}

// Usage's speculative extension appears when the request asked for it (all APIs,
// streaming and not) and nowhere else.
TEST(Adapters, SpeculativeUsageOnRequest) {
    const Completion c = fold_events(sample_events());
    ResponseMeta meta;
    meta.id = "id1";
    meta.model = "m";
    meta.prompt_tokens = 3;
    meta.completion_tokens = 9;
    meta.include_usage = true;
    meta.speculative = {12, 7, 4};
    auto usage_of = [&](ApiProtocol api) { return J::parse(build_response(api, meta, c))["usage"]; };
    for (ApiProtocol api :
         {ApiProtocol::kChatCompletions, ApiProtocol::kResponses, ApiProtocol::kMessages}) {
        meta.speculative_usage = false;
        EXPECT_FALSE(usage_of(api).contains("speculative")) << usage_of(api);
        meta.speculative_usage = true;
        const J u = usage_of(api);
        ASSERT_TRUE(u.contains("speculative")) << u;
        EXPECT_EQ(u["speculative"], J::parse(R"({"draft_tokens":12,"accepted_tokens":7,"verify_steps":4})"));
        EXPECT_EQ(u.contains("output_tokens") ? u["output_tokens"] : u["completion_tokens"], 9);
    }
    // Streaming: the closing usage (Chat usage chunk, Responses completed, Messages
    // message_delta) carries it.
    for (ApiProtocol api :
         {ApiProtocol::kChatCompletions, ApiProtocol::kResponses, ApiProtocol::kMessages}) {
        StreamWriter w(api, meta);
        std::vector<SseEvent> out = w.start();
        for (const Event& e : sample_events()) {
            for (auto& s : w.on_event(e)) out.push_back(std::move(s));
        }
        bool seen = false;
        for (const SseEvent& s : out) {
            if (s.data == "[DONE]") continue;
            const J j = J::parse(s.data);
            const J* u = j.contains("usage") ? &j["usage"]
                         : j.contains("response") && j["response"].contains("usage")
                             ? &j["response"]["usage"]
                             : nullptr;
            if (u == nullptr || u->is_null() || !u->contains("speculative")) continue;
            EXPECT_EQ((*u)["speculative"]["accepted_tokens"], 7) << s.data;
            seen = true;
        }
        EXPECT_TRUE(seen) << static_cast<int>(api);
    }
}

}  // namespace
}  // namespace dsi::protocol
