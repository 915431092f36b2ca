// server/ without sockets: request preparation and limits, error shapes, the
// renderer's SSE / JSON output for a forced tool call (grammar-free: the DSML
// completion is encoded and fed as engine updates), and EngineService end to end
// on a tiny in-memory model (completion, abort frees every KV block).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "kv/block_key.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "protocol/encoder.h"
#include "server/api.h"
#include "server/engine_service.h"
#include "server/http_rules.h"
#include "server/metrics.h"
#include "server/test_support.h"

namespace dsi::server {
namespace {

using J = nlohmann::json;

using testing::tokenizer;

ApiContext context() { return testing::api_context(); }

// Parses SSE text into (event, data) pairs.
std::vector<std::pair<std::string, std::string>> parse_sse(const std::string& s) {
    std::vector<std::pair<std::string, std::string>> out;
    std::string event;
    size_t pos = 0;
    while (pos < s.size()) {
        size_t nl = s.find('\n', pos);
        if (nl == std::string::npos) nl = s.size();
        std::string line = s.substr(pos, nl - pos);
        pos = nl + 1;
        if (line.rfind("event: ", 0) == 0) event = line.substr(7);
        if (line.rfind("data: ", 0) == 0) {
            out.emplace_back(event, line.substr(6));
            event.clear();
        }
    }
    return out;
}

TEST(Api, Routes) {
    EXPECT_EQ(endpoint_for_path("/v1/chat/completions"), Endpoint::kChatCompletions);
    EXPECT_EQ(endpoint_for_path("/v1/messages"), Endpoint::kMessages);
    EXPECT_EQ(endpoint_for_path("/v1/responses"), Endpoint::kResponses);
    EXPECT_EQ(endpoint_for_path("/v1/completions"), Endpoint::kCompletions);
    EXPECT_FALSE(endpoint_for_path("/v1/nope").has_value());
}

TEST(Api, PrepareChat) {
    ApiContext ctx = context();
    auto p = prepare_request(ctx, Endpoint::kChatCompletions,
                             R"({"model":"m","messages":[{"role":"user","content":"Hi"}],
                                 "max_tokens":7,"seed":5,"stream":true,"logprobs":true,
                                 "top_logprobs":2,"stop":["x"]})",
                             1);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_TRUE(p->stream);
    EXPECT_EQ(p->request.sampling.max_tokens, 7);
    EXPECT_EQ(p->request.sampling.seed, 5u);
    EXPECT_EQ(p->request.sampling.logprobs, 2);
    EXPECT_EQ(p->request.sampling.stop, std::vector<std::string>{"x"});
    EXPECT_FALSE(p->request.prompt.empty());
}

TEST(Api, Rejections) {
    ApiContext ctx = context();
    auto code = [&](Endpoint e, const std::string& body) {
        auto p = prepare_request(ctx, e, body, 1);
        return p.is_ok() ? 200 : http_status(p.status().code());
    };
    EXPECT_EQ(code(Endpoint::kChatCompletions, "{nope"), 400);
    EXPECT_EQ(code(Endpoint::kChatCompletions, "[]"), 400);
    EXPECT_EQ(code(Endpoint::kChatCompletions, R"({"model":"m","messages":"x"})"), 400);
    EXPECT_EQ(code(Endpoint::kChatCompletions,
                   R"({"model":"other","messages":[{"role":"user","content":"Hi"}]})"),
              404);
    EXPECT_EQ(code(Endpoint::kChatCompletions,
                   R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":101})"),
              400);
    const std::string long_text(6000, 'a');
    EXPECT_EQ(
        code(Endpoint::kChatCompletions, R"({"model":"m","messages":[{"role":"user","content":")" +
                                             std::string(3000, 'x') + " " + long_text + R"("}]})"),
        400);
    EXPECT_EQ(code(Endpoint::kCompletions, R"({"model":"m","prompt":5})"), 400);
    EXPECT_EQ(code(Endpoint::kCompletions, R"({"model":"m","prompt":"hi","max_tokens":3})"), 200);
    EXPECT_EQ(code(Endpoint::kMessages, R"({"model":"m","messages":[]})"), 400);
}

TEST(Api, ErrorShapes) {
    HttpReply a = error_reply(Endpoint::kMessages, 429, "slow down");
    J ja = J::parse(a.body);
    EXPECT_EQ(a.status, 429);
    EXPECT_EQ(ja["type"], "error");
    EXPECT_EQ(ja["error"]["type"], "rate_limit_error");
    HttpReply o = error_reply(Endpoint::kChatCompletions, invalid_argument("messages: bad"));
    J jo = J::parse(o.body);
    EXPECT_EQ(o.status, 400);
    EXPECT_EQ(jo["error"]["param"], "messages");
    EXPECT_EQ(error_reply(Endpoint::kResponses, not_found("model: x")).status, 404);
}

// The ids of an assistant turn that calls a tool, as the model would generate it.
std::vector<int32_t> tool_call_ids(const ApiContext& ctx) {
    protocol::Message m;
    m.role = protocol::Role::kAssistant;
    m.content = "Let me check.";
    m.tool_calls.push_back({"", "get_weather", R"({"city": "Paris", "days": 2})"});
    auto prompt =
        protocol::encode_completion(protocol::ChatEncoding::kDeepSeekV32, m, false, ctx.special);
    EXPECT_TRUE(prompt.is_ok()) << prompt.status().to_string();
    return prompt->encode(tokenizer());
}

std::vector<Update> updates_for(const std::vector<int32_t>& ids) {
    std::vector<Update> out;
    for (size_t i = 0; i < ids.size(); ++i) {
        Update u;
        u.tokens.push_back(TokenOut{ids[i], "", -0.5f, {}});
        u.finished = i + 1 == ids.size();
        u.reason = engine::FinishReason::kStop;
        out.push_back(std::move(u));
    }
    return out;
}

TEST(Prepare, UnknownTopLevelFieldsAreRejectedInEachProtocolsWords) {
    ApiContext ctx = context();
    const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
    auto r = prepare_request(ctx, Endpoint::kChatCompletions,
                             R"({"model":"m",)" + msgs + R"(,"foo":1})", 1);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(), "Unrecognized request argument supplied: foo");
    HttpReply h = error_reply(Endpoint::kChatCompletions, r.status());
    EXPECT_EQ(h.status, 400);
    J j = J::parse(h.body);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(j["error"]["param"].is_null());
    r = prepare_request(ctx, Endpoint::kMessages,
                        R"({"model":"m","max_tokens":2,)" + msgs + R"(,"bar":true})", 1);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(), "bar: Extra inputs are not permitted");
    j = J::parse(error_reply(Endpoint::kMessages, r.status()).body);
    EXPECT_EQ(j["type"], "error");
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    // Another API's field is unknown here.
    r = prepare_request(ctx, Endpoint::kCompletions, R"({"model":"m","prompt":"x",)" + msgs + "}", 1);
    EXPECT_EQ(r.status().message(), "Unrecognized request argument supplied: messages");
    r = prepare_request(ctx, Endpoint::kResponses, R"({"model":"m","input":"x","max_tokens":3})", 1);
    EXPECT_EQ(r.status().message(), "Unrecognized request argument supplied: max_tokens");
    // Fields the official SDKs and common clients send are accepted; ignore_eos is applied.
    r = prepare_request(ctx, Endpoint::kChatCompletions,
                        R"({"model":"m",)" + msgs +
                            R"(,"stream":true,"stream_options":{"include_usage":true},)"
                            R"("metadata":{"a":"b"},"store":false,"user":"u","max_tokens":3,)"
                            R"("reasoning_effort":"low","ignore_eos":true,"parallel_tool_calls":true})",
                        1);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(r->request.sampling.ignore_eos);
    r = prepare_request(ctx, Endpoint::kResponses,
                        R"({"model":"m","input":"x","max_output_tokens":3,"store":false,)"
                        R"("include":[],"truncation":"disabled","instructions":"be brief"})",
                        1);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    r = prepare_request(ctx, Endpoint::kMessages,
                        R"({"model":"m","max_tokens":2,)" + msgs +
                            R"(,"metadata":{"user_id":"u"},"stop_sequences":["x"],"top_k":5})",
                        1);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    r = prepare_request(ctx, Endpoint::kCompletions,
                        R"({"model":"m","prompt":"x","ignore_eos":"yes"})", 1);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

// Issue 22 D1: 20,000 / 100,000 nested arrays anywhere in a body are a 400 in the
// caller's error shape naming the field, before anything copies or dumps the value
// (protocol/json_limits_test.cc covers every nesting place of each API).
TEST(Prepare, DeeplyNestedBodiesAre400InEachApisShape) {
    ApiContext ctx = context();
    const std::string user = R"([{"role":"user","content":"x"}])";
    for (int depth : {20000, 100000}) {
        const std::string d = std::string(depth, '[') + std::string(depth, ']');
        const std::vector<std::tuple<Endpoint, std::string, std::string>> cases = {
            {Endpoint::kChatCompletions, "tools[0].function.parameters.x",
             R"({"model":"m","messages":)" + user +
                 R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"x":)" + d +
                 "}}}]}"},
            {Endpoint::kChatCompletions, "response_format.json_schema.schema.x",
             R"({"model":"m","messages":)" + user +
                 R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{"x":)" + d +
                 "}}}}"},
            {Endpoint::kResponses, "text.format.schema.x",
             R"({"model":"m","input":"x","text":{"format":{"type":"json_schema","schema":{"x":)" +
                 d + "}}}}"},
            {Endpoint::kMessages, "tools[0].input_schema.x",
             R"({"model":"m","max_tokens":2,"messages":)" + user +
                 R"(,"tools":[{"name":"f","input_schema":{"x":)" + d + "}}]}"},
            {Endpoint::kCompletions, "prompt", R"({"model":"m","prompt":)" + d + "}"},
        };
        for (const auto& [e, field, body] : cases) {
            auto r = prepare_request(ctx, e, body, 1);
            ASSERT_FALSE(r.is_ok()) << field;
            EXPECT_EQ(r.status().message(), field + ": JSON nested deeper than 128 levels");
            HttpReply h = error_reply(e, r.status());
            EXPECT_EQ(h.status, 400);
            J j = J::parse(h.body);
            if (e == Endpoint::kMessages) {
                EXPECT_EQ(j["type"], "error");
                EXPECT_EQ(j["error"]["type"], "invalid_request_error");
            } else {
                EXPECT_EQ(j["error"]["type"], "invalid_request_error");
            }
        }
    }
    // The limit is a setting.
    ctx.limits.max_json_depth = 4;
    auto r = prepare_request(ctx, Endpoint::kChatCompletions,
                             R"({"model":"m","messages":)" + user + R"(,"metadata":{"a":[[[1]]]}})",
                             1);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(), "metadata.a: JSON nested deeper than 4 levels");
}

// Issue 14 part 2: cache_salt, traffic_class and timeout_ms reach the engine request
// from all four APIs; the API key's salt namespaces the client's.
TEST(Prepare, ServingControlsReachTheEngineFromEveryApi) {
    ApiContext ctx = context();
    FakeClockEnv clock(1000);
    ctx.env = &clock;
    const std::string controls =
        R"("cache_salt":"t1","traffic_class":"agent","timeout_ms":5000,"speculative_usage":true)";
    for (Endpoint e : {Endpoint::kChatCompletions, Endpoint::kCompletions, Endpoint::kResponses,
                       Endpoint::kMessages}) {
        const std::string base = e == Endpoint::kCompletions ? R"({"model":"m","prompt":"Hi",)"
                                 : e == Endpoint::kResponses ? R"({"model":"m","input":"Hi",)"
                                 : e == Endpoint::kMessages
                                     ? R"({"model":"m","max_tokens":4,"messages":[{"role":"user","content":"Hi"}],)"
                                     : R"({"model":"m","messages":[{"role":"user","content":"Hi"}],)";
        auto p = prepare_request(ctx, e, base + controls + "}", 1);
        ASSERT_TRUE(p.is_ok()) << endpoint_name(e) << ": " << p.status().to_string();
        EXPECT_EQ(p->request.cache_salt, "t1");
        EXPECT_TRUE(p->request.agent_traffic);
        EXPECT_EQ(p->request.deadline_ns, 1000 + int64_t{5000} * 1000000);
        EXPECT_TRUE(p->speculative_usage);
        // Under a salted API key: a namespace of its own, and per client salt.
        auto k = prepare_request(ctx, e, base + controls + "}", 1, "tenantA");
        ASSERT_TRUE(k.is_ok());
        EXPECT_EQ(k->request.cache_salt, effective_cache_salt("tenantA", "t1"));
        EXPECT_NE(k->request.cache_salt, "t1");
        // Defaults: no salt, chat class, no deadline.
        auto d = prepare_request(ctx, e, base + R"("traffic_class":"chat"})", 1);
        ASSERT_TRUE(d.is_ok()) << d.status().to_string();
        EXPECT_EQ(d->request.cache_salt, "");
        EXPECT_FALSE(d->request.agent_traffic);
        EXPECT_EQ(d->request.deadline_ns, 0);
        EXPECT_FALSE(d->speculative_usage);

        // Bad values: 400 in the API's shape, naming the field.
        for (const char* bad :
             {R"("cache_salt":"")", R"("cache_salt":5)", R"("cache_salt":"a\nb")",
              R"("traffic_class":"batch")", R"("traffic_class":1)", R"("timeout_ms":0)",
              R"("timeout_ms":-1)", R"("timeout_ms":1.5)", R"("timeout_ms":"1s")",
              R"("timeout_ms":100000000000)", R"("speculative_usage":"yes")",
              R"("speculative_usage":1)"}) {
            auto r = prepare_request(ctx, e, base + bad + "}", 1);
            ASSERT_FALSE(r.is_ok()) << bad;
            const std::string field = std::string(bad).substr(1, std::string(bad).find('"', 1) - 1);
            EXPECT_TRUE(r.status().message().starts_with(field + ": ")) << r.status().message();
            HttpReply h = error_reply(e, r.status());
            EXPECT_EQ(h.status, 400);
            J j = J::parse(h.body);
            EXPECT_EQ(j["error"]["type"], "invalid_request_error") << h.body;
            if (e == Endpoint::kMessages) {
                EXPECT_EQ(j["type"], "error");
            }
        }
    }
    const std::string long_salt(257, 's');
    EXPECT_FALSE(prepare_request(ctx, Endpoint::kCompletions,
                                 R"({"model":"m","prompt":"Hi","cache_salt":")" + long_salt + "\"}", 1)
                     .is_ok());
    // Key salts: no client salt reaches another key's namespace.
    EXPECT_NE(effective_cache_salt("A", ""), effective_cache_salt("B", ""));
    EXPECT_NE(effective_cache_salt("A", "x"), effective_cache_salt("", "x"));
    EXPECT_EQ(effective_cache_salt("", "x"), "x");
    auto key = parse_api_key("sk-1:tenant");
    ASSERT_TRUE(key.is_ok());
    EXPECT_EQ(key->key, "sk-1");
    EXPECT_EQ(key->cache_salt, "tenant");
    EXPECT_EQ(parse_api_key("sk-2")->cache_salt, "");
    EXPECT_FALSE(parse_api_key("").is_ok());
    EXPECT_FALSE(parse_api_key("sk:").is_ok());
    EXPECT_FALSE(parse_api_key("s k").is_ok());
}

// Issue 22 D6-D9 (API level): each API's checks on fields it knows.
TEST(Prepare, KnownFieldsAreTypeCheckedAndToolNamesValidated) {
    ApiContext ctx = context();
    auto message = [&](Endpoint e, const std::string& body) {
        auto p = prepare_request(ctx, e, body, 1);
        return p.is_ok() ? std::string("ok") : p.status().message();
    };
    const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
    // Completions bounds temperature as Chat does.
    EXPECT_EQ(message(Endpoint::kCompletions, R"({"model":"m","prompt":"x","temperature":1e30})"),
              "temperature: must be between 0.0 and 2.0");
    EXPECT_EQ(message(Endpoint::kChatCompletions, R"({"model":"m",)" + msgs + R"(,"temperature":1e30})"),
              "temperature: must be between 0.0 and 2.0");
    // Responses: seed is an integer, and applied.
    EXPECT_EQ(message(Endpoint::kResponses, R"({"model":"m","input":"x","seed":"x"})"),
              "seed: expected an integer");
    auto r = prepare_request(ctx, Endpoint::kResponses, R"({"model":"m","input":"x","seed":77})", 1);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->request.sampling.seed, 77u);
    // Known but ignored fields keep their types.
    const std::string mbase = R"({"model":"m","max_tokens":4,)" + msgs;
    EXPECT_EQ(message(Endpoint::kMessages,
                      mbase + R"(,"thinking":{"type":"enabled","budget_tokens":-5}})"),
              "thinking.budget_tokens: must be between 1 and 9223372036854775807");
    EXPECT_EQ(message(Endpoint::kMessages, mbase + R"(,"thinking":{"type":"enabled","budget_tokens":8}})"),
              "ok");
    EXPECT_EQ(message(Endpoint::kMessages, mbase + R"(,"metadata":"x"})"),
              "metadata: expected an object");
    EXPECT_EQ(message(Endpoint::kChatCompletions, R"({"model":"m",)" + msgs + R"(,"user":5})"),
              "user: expected a string");
    EXPECT_EQ(message(Endpoint::kResponses, R"({"model":"m","input":"x","store":"yes"})"),
              "store: expected a boolean");
    // Tool names: ^[a-zA-Z0-9_-]{1,64}$ (Anthropic: up to 128).
    const std::string chat_tool = R"({"model":"m",)" + msgs +
                                  R"(,"tools":[{"type":"function","function":{"name":")";
    EXPECT_EQ(message(Endpoint::kChatCompletions, chat_tool + R"(get_weather-2"}}]})"), "ok");
    EXPECT_TRUE(message(Endpoint::kChatCompletions, chat_tool + R"(bad name"}}]})")
                    .starts_with("tools[0].function.name: must match ^[a-zA-Z0-9_-]{1,64}$"));
    EXPECT_TRUE(message(Endpoint::kChatCompletions, chat_tool + std::string(65, 'a') + R"("}}]})")
                    .starts_with("tools[0].function.name: must match"));
    EXPECT_TRUE(message(Endpoint::kResponses,
                        R"({"model":"m","input":"x","tools":[{"type":"function","name":"a<b"}]})")
                    .starts_with("tools[0].name: must match"));
    const std::string anthropic_tool =
        mbase + R"(,"tools":[{"input_schema":{"type":"object"},"name":")";
    EXPECT_EQ(message(Endpoint::kMessages, anthropic_tool + std::string(100, 'a') + R"("}]})"),
              "ok");
    EXPECT_TRUE(message(Endpoint::kMessages, anthropic_tool + R"(x.y"}]})")
                    .starts_with("tools[0].name: must match ^[a-zA-Z0-9_-]{1,128}$"));
}

Prepared prepared_for(const ApiContext& ctx, Endpoint e, bool stream) {
    const std::string msgs = e == Endpoint::kResponses
                                 ? R"("input":"Weather?")"
                                 : R"("messages":[{"role":"user","content":"Weather?"}])";
    const std::string max = e == Endpoint::kResponses ? "max_output_tokens" : "max_tokens";
    const std::string body = R"({"model":"m",")" + max + R"(":50,"stream":)" +
                             std::string(stream ? "true" : "false") + "," + msgs + "}";
    auto p = prepare_request(ctx, e, body, 1);
    EXPECT_TRUE(p.is_ok()) << p.status().to_string();
    return std::move(p).value();
}

TEST(Renderer, ChatStreamToolCall) {
    ApiContext ctx = context();
    Prepared p = prepared_for(ctx, Endpoint::kChatCompletions, true);
    Renderer r(ctx, p, "chatcmpl-1", 1);
    std::string sse;
    for (const Update& u : updates_for(tool_call_ids(ctx))) sse += r.on_update_sse(u);
    EXPECT_TRUE(r.finished());
    auto events = parse_sse(sse);
    ASSERT_GE(events.size(), 4u);
    EXPECT_EQ(events.back().second, "[DONE]");
    std::string name, args, content, finish;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        J c = J::parse(events[i].second);
        const J& d = c["choices"][0]["delta"];
        if (d.contains("content") && d["content"].is_string()) content += d["content"];
        if (d.contains("tool_calls")) {
            const J& t = d["tool_calls"][0];
            if (t.contains("function") && t["function"].contains("name"))
                name = t["function"]["name"];
            if (t.contains("function") && t["function"].contains("arguments")) {
                args += t["function"]["arguments"].get<std::string>();
            }
        }
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(content, "Let me check.");
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(J::parse(args), J::parse(R"({"city": "Paris", "days": 2})"));
    EXPECT_EQ(finish, "tool_calls");
}

TEST(Renderer, MessagesAndResponsesToolCall) {
    ApiContext ctx = context();
    {
        Prepared p = prepared_for(ctx, Endpoint::kMessages, true);
        Renderer r(ctx, p, "msg_1", 1);
        std::string sse;
        for (const Update& u : updates_for(tool_call_ids(ctx))) sse += r.on_update_sse(u);
        auto events = parse_sse(sse);
        ASSERT_FALSE(events.empty());
        EXPECT_EQ(events.front().first, "message_start");
        EXPECT_EQ(events.back().first, "message_stop");
        bool tool_use = false;
        for (const auto& [ev, data] : events) {
            J j = J::parse(data);
            if (ev == "content_block_start" && j["content_block"]["type"] == "tool_use") {
                tool_use = j["content_block"]["name"] == "get_weather";
            }
            if (ev == "message_delta") {
                EXPECT_EQ(j["delta"]["stop_reason"], "tool_use");
                EXPECT_GT(j["usage"]["output_tokens"].get<int>(), 0);
            }
        }
        EXPECT_TRUE(tool_use);
    }
    {
        Prepared p = prepared_for(ctx, Endpoint::kResponses, false);
        Renderer r(ctx, p, "resp_1", 1);
        for (const Update& u : updates_for(tool_call_ids(ctx))) r.on_update(u);
        J j = J::parse(r.reply().body);
        bool call = false;
        for (const J& item : j["output"]) {
            if (item["type"] == "function_call") call = item["name"] == "get_weather";
        }
        EXPECT_TRUE(call) << j.dump();
        EXPECT_GT(j["usage"]["output_tokens"].get<int>(), 0);
    }
}

TEST(Renderer, ResponsesLogprobsWhenIncluded) {
    ApiContext ctx = context();
    const std::vector<int32_t> ids = tokenizer().encode("hello world");
    for (bool stream : {false, true}) {
        const std::string body =
            R"({"model":"m","input":"Hi","max_output_tokens":8,"top_logprobs":2,)"
            R"("include":["message.output_text.logprobs"],"stream":)" +
            std::string(stream ? "true" : "false") + "}";
        auto p = prepare_request(ctx, Endpoint::kResponses, body, 1);
        ASSERT_TRUE(p.is_ok()) << p.status().to_string();
        EXPECT_EQ(p->logprobs, 2);
        EXPECT_EQ(p->request.sampling.logprobs, 2);
        Renderer r(ctx, *p, "resp_1", 1);
        std::vector<Update> ups = updates_for(ids);
        for (Update& u : ups) u.tokens[0].top_logprobs = {{ids[0], -0.1f}, {ids[0], -0.2f}};
        J text_part;
        size_t delta_entries = 0;
        if (stream) {
            std::string sse;
            for (const Update& u : ups) sse += r.on_update_sse(u);
            for (const auto& [event, data] : parse_sse(sse)) {
                J j = J::parse(data);
                if (j["type"] == "response.output_text.delta") delta_entries += j["logprobs"].size();
                if (j["type"] == "response.completed") text_part = j["response"]["output"].back()["content"][0];
            }
            EXPECT_EQ(delta_entries, ids.size());
        } else {
            for (const Update& u : ups) r.on_update(u);
            text_part = J::parse(r.reply().body)["output"].back()["content"][0];
        }
        ASSERT_EQ(text_part["type"], "output_text") << text_part;
        const J& lp = text_part["logprobs"];
        ASSERT_EQ(lp.size(), ids.size()) << lp;
        EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.5f);
        EXPECT_EQ(lp[0]["top_logprobs"].size(), 2u);
        EXPECT_TRUE(lp[0]["bytes"].is_array());
    }
    // Without include there are none; bad values are 400s.
    auto p = prepare_request(ctx, Endpoint::kResponses, R"({"model":"m","input":"Hi","top_logprobs":2})", 1);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->logprobs, -1);
    EXPECT_FALSE(prepare_request(ctx, Endpoint::kResponses,
                                 R"({"model":"m","input":"Hi","top_logprobs":21})", 1)
                     .is_ok());
    EXPECT_FALSE(
        prepare_request(ctx, Endpoint::kResponses, R"({"model":"m","input":"Hi","include":"x"})", 1)
            .is_ok());
}

TEST(Renderer, StopStringCutsContent) {
    ApiContext ctx = context();
    auto p = prepare_request(ctx, Endpoint::kChatCompletions,
                             R"({"model":"m","messages":[{"role":"user","content":"x"}],
                                 "stop":["wor"]})",
                             1);
    ASSERT_TRUE(p.is_ok());
    Renderer r(ctx, *p, "c", 1);
    std::vector<int32_t> ids = tokenizer().encode("hello world");
    std::vector<Update> ups = updates_for(ids);
    for (Update& u : ups) r.on_update(u);
    J j = J::parse(r.reply().body);
    EXPECT_EQ(j["choices"][0]["message"]["content"], "hello ");
}

std::unique_ptr<DeepseekModel> tiny_model() {
    ModelConfig c = synthetic_preset("tiny").value();
    auto m = DeepseekModel::load(synthetic_memory_model(c, 7), {1});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return std::move(m).value();
}

// An EngineService over `model` with a 64-block pool.
std::unique_ptr<EngineService> tiny_service(DeepseekModel* model) {
    engine::EngineOptions eo;
    eo.num_kv_blocks = 64;
    eo.tokenizer = &tokenizer();
    auto eng = engine::Engine::create(model, eo, Env::default_env());
    DSI_CHECK(eng.is_ok(), eng.status().to_string());
    return std::make_unique<EngineService>(std::move(eng).value());
}

TEST(EngineService, CompletesAndAbortFreesBlocks) {
    std::unique_ptr<DeepseekModel> model = tiny_model();
    std::unique_ptr<EngineService> owned = tiny_service(model.get());
    EngineService& service = *owned;
    const int64_t baseline = service.stats_snapshot().engine.pool.num_used;

    std::mutex mu;
    std::condition_variable cv;
    std::map<Ticket, std::vector<Update>> got;
    auto sink = [&](Update u) {
        std::lock_guard<std::mutex> lock(mu);
        got[u.ticket].push_back(std::move(u));
        cv.notify_all();
    };
    auto finished = [&](Ticket t) { return !got[t].empty() && got[t].back().finished; };
    for (Ticket t = 1; t <= 8; ++t) {
        engine::GenerateRequest r;
        r.prompt = tokenizer().encode("Hello there, how are you today?");
        r.sampling.max_tokens = t <= 4 ? 6 : 100000 / 1000;
        r.sampling.ignore_eos = true;
        service.submit(t, std::move(r), sink);
    }
    for (Ticket t = 5; t <= 8; ++t) service.abort(t);
    {
        std::unique_lock<std::mutex> lock(mu);
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] {
            for (Ticket t = 1; t <= 8; ++t) {
                if (!finished(t)) return false;
            }
            return true;
        }));
        for (Ticket t = 1; t <= 4; ++t) {
            EXPECT_EQ(got[t].back().reason, engine::FinishReason::kLength);
            int n = 0;
            for (const Update& u : got[t]) n += static_cast<int>(u.tokens.size());
            EXPECT_EQ(n, 6);
        }
        for (Ticket t = 5; t <= 8; ++t)
            EXPECT_EQ(got[t].back().reason, engine::FinishReason::kAbort);
    }
    // Stats are published after each loop iteration.
    for (int i = 0; i < 100 && service.stats_snapshot().num_running != 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ServiceStats s = service.stats_snapshot();
    EXPECT_EQ(s.num_running, 0);
    EXPECT_EQ(s.engine.pool.num_used, baseline);
    Metrics m;
    m.on_request("chat_completions", 200);
    m.on_first_token(0.01);
    const std::string text = m.render(s, 0, true);
    EXPECT_NE(text.find("dsinfer_requests_total{endpoint=\"chat_completions\",status=\"200\"} 1"),
              std::string::npos);
    EXPECT_NE(text.find("dsinfer_kv_blocks_used"), std::string::npos);
}

// The engine reports each request's prefix-cache hit; every protocol's usage shows it.
TEST(EngineService, CachedPromptTokensPerRequestInUsage) {
    std::unique_ptr<DeepseekModel> model = tiny_model();
    std::unique_ptr<EngineService> owned = tiny_service(model.get());
    EngineService& service = *owned;
    std::string text;
    for (int i = 0; i < 60; ++i) text += "the quick brown fox " + std::to_string(i) + " ";
    const std::vector<int32_t> prompt = tokenizer().encode(text);
    ASSERT_GT(prompt.size(), 2u * kv::kBlockTokens);
    std::mutex mu;
    std::condition_variable cv;
    std::map<Ticket, std::vector<Update>> got;
    auto sink = [&](Update u) {
        std::lock_guard<std::mutex> lock(mu);
        got[u.ticket].push_back(std::move(u));
        cv.notify_all();
    };
    for (Ticket t = 1; t <= 2; ++t) {  // one after the other: the second hits the cache
        engine::GenerateRequest r;
        r.prompt = prompt;
        r.sampling.max_tokens = 3;
        r.sampling.ignore_eos = true;
        service.submit(t, std::move(r), sink);
        std::unique_lock<std::mutex> lock(mu);
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60),
                                [&] { return !got[t].empty() && got[t].back().finished; }));
    }
    const int64_t full_blocks = static_cast<int64_t>(prompt.size()) / kv::kBlockTokens;
    EXPECT_EQ(got[1].back().cached_prompt_tokens, 0);
    // All full blocks but possibly the last (the engine recomputes at least one token).
    EXPECT_GE(got[2].back().cached_prompt_tokens, (full_blocks - 1) * kv::kBlockTokens);
    EXPECT_LE(got[2].back().cached_prompt_tokens, full_blocks * kv::kBlockTokens);
    const int64_t cached = got[2].back().cached_prompt_tokens;

    ApiContext ctx = context();
    for (Endpoint e : {Endpoint::kChatCompletions, Endpoint::kResponses, Endpoint::kMessages,
                       Endpoint::kCompletions}) {
        Prepared p = e == Endpoint::kCompletions
                         ? prepare_request(ctx, e, R"({"model":"m","prompt":"Hi"})", 1).value()
                         : prepared_for(ctx, e, false);
        Renderer r(ctx, p, "id-1", 1);
        for (const Update& u : got[2]) r.on_update(u);
        J j = J::parse(r.reply().body);
        const J& usage = j["usage"];
        switch (e) {
            case Endpoint::kChatCompletions:
            case Endpoint::kCompletions:
                EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], cached) << usage;
                break;
            case Endpoint::kResponses:
                EXPECT_EQ(usage["input_tokens_details"]["cached_tokens"], cached) << usage;
                break;
            case Endpoint::kMessages:
                EXPECT_EQ(usage["cache_read_input_tokens"], cached) << usage;
                EXPECT_EQ(usage["input_tokens"].get<int64_t>(),
                          static_cast<int64_t>(p.request.prompt.size()) - cached);
                break;
        }
    }
    // Streaming chat with include_usage: the usage chunk carries it too.
    Prepared ps = prepare_request(ctx, Endpoint::kChatCompletions,
                                  R"({"model":"m","stream":true,"stream_options":)"
                                  R"({"include_usage":true},"messages":[{"role":"user",)"
                                  R"("content":"Hi"}]})",
                                  1)
                      .value();
    Renderer rs(ctx, ps, "id-2", 1);
    std::string sse;
    for (const Update& u : got[2]) sse += rs.on_update_sse(u);
    bool saw = false;
    for (const auto& [event, data] : parse_sse(sse)) {
        if (data == "[DONE]") continue;
        J c = J::parse(data);
        if (c.contains("usage") && !c["usage"].is_null()) {
            EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], cached);
            saw = true;
        }
    }
    EXPECT_TRUE(saw);
}

// Two API keys with different salts never share a prefix (cached_tokens 0); the same
// key does (issue 14 part 2 check), through prepare_request and the engine.
TEST(EngineService, KeySaltsSeparateTenantsPrefixes) {
    std::unique_ptr<DeepseekModel> model = tiny_model();
    std::unique_ptr<EngineService> owned = tiny_service(model.get());
    EngineService& service = *owned;
    ApiContext ctx = context();
    std::string text;
    for (int i = 0; i < 60; ++i) text += "the quick brown fox " + std::to_string(i) + " ";
    const std::string body = R"({"model":"m","max_tokens":2,"ignore_eos":true,)"
                             R"("messages":[{"role":"user","content":")" + text + R"("}]})";
    std::mutex mu;
    std::condition_variable cv;
    std::map<Ticket, std::vector<Update>> got;
    Ticket next = 1;
    auto cached = [&](std::string_view key_salt) {
        Prepared p = prepare_request(ctx, Endpoint::kChatCompletions, body, 1, key_salt).value();
        const Ticket t = next++;
        service.submit(t, std::move(p.request), [&](Update u) {
            std::lock_guard<std::mutex> lock(mu);
            got[u.ticket].push_back(std::move(u));
            cv.notify_all();
        });
        std::unique_lock<std::mutex> lock(mu);
        EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60),
                                [&] { return !got[t].empty() && got[t].back().finished; }));
        return got[t].back().cached_prompt_tokens;
    };
    EXPECT_EQ(cached("tenantA"), 0);
    EXPECT_EQ(cached("tenantB"), 0);  // same prompt, other key: no shared blocks
    EXPECT_EQ(cached(""), 0);         // nor with an unsalted key
    EXPECT_GE(cached("tenantA"), kv::kBlockTokens);  // the same key hits its own blocks
    EXPECT_GE(cached("tenantB"), kv::kBlockTokens);
}

// ---- answer_offline: the HTTP sessions' request path on bytes (issue 22) ----

std::vector<int> answer(std::string_view input) {
    ApiContext c = context();
    c.limits.max_body_bytes = 4096;
    return answer_offline(c, /*api_keys=*/{}, input);
}

std::string post(std::string_view path, std::string_view body, std::string_view extra = "") {
    return std::string("POST ") + std::string(path) + " HTTP/1.1\r\nHost: x\r\n" +
           std::string(extra) + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
           std::string(body);
}

TEST(AnswerOffline, PipelinedRequestsInOrder) {
    const std::string chat = R"({"model":"m","messages":[{"role":"user","content":"hi"}]})";
    const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    EXPECT_EQ(answer(post("/v1/chat/completions", chat) + health), (std::vector<int>{200, 200}));
    // A bad body is answered and the next request still is.
    EXPECT_EQ(answer(post("/v1/chat/completions", "{") + "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n" +
                     post("/v1/messages", R"({"model":"m","max_tokens":2,"messages":[]})")),
              (std::vector<int>{400, 404, 400}));
    // Connection: close ends the stream; so does HTTP/1.0 without keep-alive.
    EXPECT_EQ(answer("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                     "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"),
              (std::vector<int>{200}));
    EXPECT_EQ(answer("GET /health HTTP/1.0\r\n\r\nGET /health HTTP/1.0\r\n\r\n"),
              (std::vector<int>{200}));
    EXPECT_EQ(answer("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
                     "GET /health HTTP/1.0\r\n\r\n"),
              (std::vector<int>{200, 200}));
}

TEST(AnswerOffline, FramingErrors) {
    EXPECT_EQ(answer("GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n"),
              (std::vector<int>{400}));
    EXPECT_EQ(answer("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n"),
              (std::vector<int>{400}));
    EXPECT_EQ(answer("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n"),
              (std::vector<int>{400}));
    EXPECT_EQ(answer("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(17000, 'a') +
                     "\r\n\r\n"),
              (std::vector<int>{431}));
    EXPECT_EQ(answer("GET /health HTTP/1.1\r\n\r\n"), (std::vector<int>{400}));
    EXPECT_EQ(answer("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
              (std::vector<int>{501}));
    // A chunked body is decoded; one over the limit is 413.
    const std::string body = R"({"model":"m","prompt":"hi","max_tokens":2})";
    char size[16];
    std::snprintf(size, sizeof(size), "%zx", body.size());
    const std::string chunked =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    EXPECT_EQ(answer(chunked + size + "\r\n" + body + "\r\n0\r\n\r\n"), (std::vector<int>{200}));
    EXPECT_EQ(answer(chunked + "2000\r\n" + std::string(0x2000, ' ') + "\r\n0\r\n\r\n"),
              (std::vector<int>{413}));
    // A body that is not UTF-8: a 400 whose message quotes the bytes (dump() used to
    // throw on them; fuzz_http).
    EXPECT_EQ(answer(post("/v1/chat/completions", "{\"model\":\"m\",\"x\x84\":1}")),
              (std::vector<int>{400}));
    EXPECT_EQ(answer(post("/v1/completions", "{\"model\":\"m\",\"x\x84\":1}")),
              (std::vector<int>{400}));
    for (Endpoint e : {Endpoint::kMessages, Endpoint::kCompletions}) {
        HttpReply r = error_reply(e, invalid_argument("bad \x84 byte"));
        EXPECT_EQ(r.status, 400);
        EXPECT_NE(r.body.find("bad \xEF\xBF\xBD byte"), std::string::npos) << r.body;
    }
    // Incomplete input at EOF: the connection closes without a reply.
    EXPECT_EQ(answer("GET /health HTTP/1.1\r\nHo"), (std::vector<int>{}));
    EXPECT_EQ(answer("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab"),
              (std::vector<int>{}));
}

// Speculative decoding counters (issue 24): totals and per draft position, as counters.
TEST(MetricsTest, RendersSpeculationCounters) {
    ServiceStats st;
    st.engine.spec_verify_steps = 7;
    st.engine.spec_draft_tokens = 21;
    st.engine.spec_accepted_tokens = 12;
    st.engine.spec_steps = 5;
    st.engine.spec_varlen_cut_tokens = 9;
    st.engine.spec_drafted_at[0] = 7;
    st.engine.spec_accepted_at[0] = 6;
    st.engine.spec_drafted_at[2] = 7;
    st.engine.spec_accepted_at[2] = 2;
    const std::string text = Metrics().render(st, 0, true);
    for (const char* want :
         {"# TYPE dsinfer_spec_draft_tokens_total counter\n", "dsinfer_spec_verify_steps_total 7\n",
          "dsinfer_spec_draft_tokens_total 21\n", "dsinfer_spec_accepted_tokens_total 12\n",
          "dsinfer_spec_steps_total 5\n", "dsinfer_spec_varlen_cut_tokens_total 9\n",
          "# TYPE dsinfer_spec_accepted_at_position_total counter\n",
          "dsinfer_spec_drafted_at_position_total{position=\"0\"} 7\n",
          "dsinfer_spec_accepted_at_position_total{position=\"0\"} 6\n",
          "dsinfer_spec_accepted_at_position_total{position=\"2\"} 2\n",
          "dsinfer_spec_accepted_at_position_total{position=\"15\"} 0\n"}) {
        EXPECT_NE(text.find(want), std::string::npos) << want;
    }
}

// A service's own figures (ServiceStats::extra_counters): a name ending in _total is a
// counter, any other a level, exported as a gauge (Prometheus' rate() of a level would
// be nonsense).
TEST(MetricsTest, AServicesFiguresAreCountersOrGaugesByName) {
    ServiceStats st;
    st.extra_counters = {{"router_kv_handoffs_total", "hand-overs", 3},
                         {"router_engines", "engines now", 2},
                         {"kv_landing_blocks_held", "blocks held now", 5}};
    const std::string text = Metrics().render(st, 0, true);
    for (const char* want :
         {"# TYPE dsinfer_router_kv_handoffs_total counter\n", "dsinfer_router_kv_handoffs_total 3\n",
          "# TYPE dsinfer_router_engines gauge\n", "dsinfer_router_engines 2\n",
          "# TYPE dsinfer_kv_landing_blocks_held gauge\n", "dsinfer_kv_landing_blocks_held 5\n"}) {
        EXPECT_NE(text.find(want), std::string::npos) << want;
    }
}

// The DSpark gate's counters (issue 24): steps and probes per loop mode, switches,
// switches priced out, the MTP catch-up rows and times.
TEST(MetricsTest, RendersSpeculationGateCounters) {
    ServiceStats st;
    st.engine.spec_gate_steps = {40, 12};
    st.engine.spec_gate_probe_steps = {4, 8};
    st.engine.spec_gate_switches = 3;
    st.engine.spec_gate_priced_out = 2;
    st.engine.spec_catchup_rows = 1900;
    st.engine.spec_deferred_catchup_rows = 1500;
    st.engine.spec_deferred_catchup_ns = 3'000'000'000;
    st.engine.spec_draft_ns = 250'000'000;
    const std::string text = Metrics().render(st, 0, true);
    for (const char* want :
         {"# TYPE dsinfer_spec_gate_steps_total counter\n",
          "dsinfer_spec_gate_steps_total{mode=\"plain\"} 40\n",
          "dsinfer_spec_gate_steps_total{mode=\"speculating\"} 12\n",
          "# TYPE dsinfer_spec_gate_probe_steps_total counter\n",
          "dsinfer_spec_gate_probe_steps_total{mode=\"plain\"} 4\n",
          "dsinfer_spec_gate_probe_steps_total{mode=\"speculating\"} 8\n",
          "dsinfer_spec_gate_switches_total 3\n", "dsinfer_spec_gate_priced_out_total 2\n",
          "dsinfer_spec_catchup_rows_total 1900\n",
          "dsinfer_spec_deferred_catchup_rows_total 1500\n",
          "dsinfer_spec_deferred_catchup_seconds_total 3\n",
          "dsinfer_spec_drafter_seconds_total 0.25\n"}) {
        EXPECT_NE(text.find(want), std::string::npos) << want;
    }
}

// SWA state cache counters (issue 16): per traffic class, and the engine's own.
TEST(MetricsTest, RendersSwaCacheCounters) {
    ServiceStats st;
    kv::SwaCacheClassCounters& chat = st.engine.swa.by_class[0];
    chat.requests = 4;
    chat.block_hit_tokens = 768;
    chat.swa_exact_hits = 2;
    chat.pool_bytes = 1000;
    st.engine.swa.by_class[1].replay_tokens = 128;
    st.engine.swa_fallback_tokens = 256;
    st.engine.swa_states_rejected = 1;
    st.engine.yoco_by_class[0] = {.decoder_tokens = 140, .decoder_skipped_tokens = 860};
    st.engine.yoco_by_class[1] = {.decoder_tokens = 280, .decoder_skipped_tokens = 0};
    const std::string text = Metrics().render(st, 0, true);
    for (const char* want :
         {"# TYPE dsinfer_swa_requests_total counter\n",
          "dsinfer_swa_requests_total{traffic_class=\"chatbot\"} 4\n",
          "dsinfer_swa_requests_total{traffic_class=\"agent\"} 0\n",
          "dsinfer_swa_block_hit_tokens_total{traffic_class=\"chatbot\"} 768\n",
          "dsinfer_swa_exact_hits_total{traffic_class=\"chatbot\"} 2\n",
          "# TYPE dsinfer_swa_pool_bytes gauge\n",
          "dsinfer_swa_pool_bytes{traffic_class=\"chatbot\"} 1000\n",
          "dsinfer_swa_replay_tokens_total{traffic_class=\"agent\"} 128\n",
          "dsinfer_swa_fallback_tokens_total 256\n", "dsinfer_swa_states_rejected_total 1\n",
          "dsinfer_yoco_decoder_tokens_total{traffic_class=\"chatbot\"} 140\n",
          "dsinfer_yoco_decoder_tokens_total{traffic_class=\"agent\"} 280\n",
          "dsinfer_yoco_decoder_skipped_tokens_total{traffic_class=\"chatbot\"} 860\n",
          "dsinfer_yoco_decoder_skipped_tokens_total{traffic_class=\"agent\"} 0\n"}) {
        EXPECT_NE(text.find(want), std::string::npos) << want;
    }
}

}  // namespace
}  // namespace dsi::server
