// Structured output through the server's request path, in process: response_format /
// text.format / guided_regex / guided_grammar are read, compiled through the
// StructuredOutput service into the request's mask, thinking is turned off, bad
// grammars are a 400 in the caller's shape; and a chat request with a JSON schema runs
// on a tiny in-memory model through EngineService and renders JSON content that
// parses and satisfies the schema.
#include "server/structured_output.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>

#include "grammar/test_tokenizer.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "server/api.h"
#include "server/engine_service.h"

namespace dsi::server {
namespace {

using J = nlohmann::json;

const Tokenizer& tokenizer() { return grammar::test_util::real_tokenizer(); }

StructuredOutput& structured() {
    static StructuredOutput so(tokenizer());
    return so;
}

// The tests' server context: limits of 1000 prompt / 200 output tokens.
ApiContext context() {
    ServerLimits limits;
    limits.max_prompt_tokens = 1000;
    limits.max_tokens = 200;
    return ApiContext{.tokenizer = &tokenizer(),
                      .special = protocol::SpecialTokens::from_tokenizer(tokenizer()),
                      .model_id = "m",
                      .max_model_len = 4096,
                      .limits = limits,
                      .structured_output = &structured()};
}

constexpr const char* kSchema =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},)"
    R"("age":{"type":"integer","minimum":0,"maximum":120},"ok":{"type":"boolean"}},)"
    R"("required":["name","age","ok"],"additionalProperties":false})";

std::string chat_body(const std::string& extra) {
    return R"({"model":"m","max_tokens":150,"temperature":1,"seed":3,)"
           R"("messages":[{"role":"user","content":"A person as JSON"}])" +
           extra + "}";
}

TEST(StructuredOutput, ReadsEachApisFields) {
    ApiContext ctx = context();
    const std::string rf = R"(,"response_format":{"type":"json_schema","json_schema":)"
                           R"({"name":"p","strict":true,"schema":)" +
                           std::string(kSchema) + "}}";
    auto p = prepare_request(ctx, Endpoint::kChatCompletions, chat_body(rf), 1);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_NE(p->request.mask, nullptr);
    EXPECT_FALSE(p->thinking_prompt);

    // Thinking requested: off under a grammar.
    auto t = prepare_request(ctx, Endpoint::kChatCompletions,
                             chat_body(rf + R"(,"thinking":{"type":"enabled"})"), 1);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_FALSE(t->thinking_prompt);
    auto t0 = prepare_request(ctx, Endpoint::kChatCompletions,
                              chat_body(R"(,"thinking":{"type":"enabled"})"), 1);
    ASSERT_TRUE(t0.is_ok());
    EXPECT_TRUE(t0->thinking_prompt);  // (without a grammar it stays on)

    for (const char* extra :
         {R"(,"response_format":{"type":"json_object"})", R"(,"response_format":{"type":"text"})",
          R"(,"guided_regex":"[a-z]{1,5}@x\\.com")",
          R"(,"guided_grammar":"root ::= \"yes\" | \"no\"")"}) {
        auto q = prepare_request(ctx, Endpoint::kChatCompletions, chat_body(extra), 1);
        ASSERT_TRUE(q.is_ok()) << extra << " " << q.status().to_string();
        EXPECT_EQ(q->request.mask != nullptr, std::string(extra).find("text") == std::string::npos)
            << extra;
    }
    auto r = prepare_request(
        ctx, Endpoint::kResponses,
        R"({"model":"m","input":"Hi","text":{"format":{"type":"json_schema","name":"p","schema":)" +
            std::string(kSchema) + "}}}",
        1);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_NE(r->request.mask, nullptr);
    auto c = prepare_request(ctx, Endpoint::kCompletions,
                             R"({"model":"m","prompt":"Hi","guided_regex":"\\d{3}"})", 1);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_NE(c->request.mask, nullptr);
}

// Whether the request's grammar mask lets `text` through: the provider fed its tokens
// masks everything when the grammar refused one of them.
bool mask_accepts(const Prepared& p, const std::string& text) {
    TokenMask allowed(tokenizer().vocab_size());
    p.request.mask->fill(tokenizer().encode(text), allowed);
    for (uint64_t w : allowed.words()) {
        if (w != 0) return true;
    }
    return false;
}

// dsinfer's JSON options (issue 21) in each API's structured-output field:
// flexible_whitespace and any_property_order next to `schema` (json_object: in the
// format object), off by default.
TEST(StructuredOutput, JsonOptionsInEachApi) {
    ApiContext ctx = context();
    const std::string schema =
        R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}}})";
    const std::string spaced = R"({ "a": 1, "b": 2 })";  // one space after , and : is always allowed
    const std::string reordered = R"({"b":2,"a":1})";
    struct Case {
        Endpoint e;
        std::function<std::string(const std::string& options)> body;
    };
    const std::vector<Case> cases = {
        {Endpoint::kChatCompletions,
         [&](const std::string& o) {
             return chat_body(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"p",)" +
                              o + R"("schema":)" + schema + "}}");
         }},
        {Endpoint::kResponses,
         [&](const std::string& o) {
             return R"({"model":"m","input":"Hi","text":{"format":{"type":"json_schema","name":"p",)" +
                    o + R"("schema":)" + schema + "}}}";
         }},
        {Endpoint::kMessages,
         [&](const std::string& o) {
             return R"({"model":"m","max_tokens":50,"messages":[{"role":"user","content":"Hi"}],)"
                    R"("output_config":{"format":{"type":"json_schema",)" +
                    o + R"("schema":)" + schema + "}}}";
         }},
    };
    for (const Case& c : cases) {
        for (const char* o : {"", R"("flexible_whitespace":true,)", R"("any_property_order":true,)",
                              R"("flexible_whitespace":false,"any_property_order":null,)"}) {
            const std::string body = c.body(o);
            auto p = prepare_request(ctx, c.e, body, 1);
            ASSERT_TRUE(p.is_ok()) << body << " " << p.status().to_string();
            ASSERT_NE(p->request.mask, nullptr) << body;
            EXPECT_FALSE(p->thinking_prompt) << body;
            EXPECT_TRUE(mask_accepts(*p, R"({"a":1,"b":2})")) << body;
            EXPECT_EQ(mask_accepts(*p, spaced), std::string(o).find("whitespace\":true") != std::string::npos)
                << body;
            EXPECT_EQ(mask_accepts(*p, reordered), std::string(o).find("order\":true") != std::string::npos)
                << body;
        }
    }
    // json_object: the option in the format object.
    auto j = prepare_request(
        ctx, Endpoint::kChatCompletions,
        chat_body(R"(,"response_format":{"type":"json_object","flexible_whitespace":true})"), 1);
    ASSERT_TRUE(j.is_ok()) << j.status().to_string();
    EXPECT_TRUE(mask_accepts(*j, R"({ "k" : [1, 2] })"));
    auto j0 = prepare_request(ctx, Endpoint::kChatCompletions,
                              chat_body(R"(,"response_format":{"type":"json_object"})"), 1);
    ASSERT_TRUE(j0.is_ok());
    EXPECT_FALSE(mask_accepts(*j0, R"({ "k" : [1, 2] })"));
}

TEST(StructuredOutput, BadGrammarsAre400InTheCallersShape) {
    ApiContext ctx = context();
    struct Case {
        Endpoint e;
        std::string body;
        std::string says;
    };
    const std::vector<Case> cases = {
        {Endpoint::kChatCompletions,
         chat_body(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x",)"
                   R"("schema":{"type":"object","unevaluatedProperties":false}}})"),
         "unevaluatedProperties"},
        {Endpoint::kChatCompletions,
         chat_body(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x",)"
                   R"("schema":{"type":"frog"}}})"),
         "frog"},
        // Schemas no value satisfies (issue 22 D5): rejected at compile time.
        {Endpoint::kChatCompletions,
         chat_body(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x",)"
                   R"("schema":{"enum":[]}}})"),
         "accepts no input"},
        {Endpoint::kChatCompletions,
         chat_body(R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)"
                   R"({"type":"object","properties":{"a":{"enum":[]}},"required":["a"]}}}],)"
                   R"("tool_choice":"required")"),
         "accepts no input"},
        {Endpoint::kChatCompletions, chat_body(R"(,"guided_regex":"(a")"), "guided_regex"},
        {Endpoint::kChatCompletions, chat_body(R"(,"guided_regex":"(a)\\1")"), "guided_regex"},
        {Endpoint::kChatCompletions, chat_body(R"(,"guided_grammar":"root ::= foo")"),
         "guided_grammar"},
        {Endpoint::kChatCompletions,
         chat_body(R"(,"guided_regex":"a","response_format":{"type":"json_object"})"),
         "only one"},
        {Endpoint::kResponses,
         R"({"model":"m","input":"Hi","text":{"format":{"type":"json_schema","name":"p",)"
         R"("schema":{"type":"object","$dynamicRef":"#x"}}}})",
         "$dynamicRef"},
        // dsinfer's JSON options (issue 21): booleans, named in the error.
        {Endpoint::kChatCompletions,
         chat_body(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x",)"
                   R"("flexible_whitespace":"yes","schema":{"type":"object"}}})"),
         "response_format.json_schema.flexible_whitespace: expected a boolean"},
        {Endpoint::kChatCompletions,
         chat_body(R"(,"response_format":{"type":"json_object","any_property_order":1})"),
         "response_format.any_property_order: expected a boolean"},
        {Endpoint::kResponses,
         R"({"model":"m","input":"Hi","text":{"format":{"type":"json_schema","name":"p",)"
         R"("any_property_order":[true],"schema":{"type":"object"}}}})",
         "text.format.any_property_order: expected a boolean"},
        {Endpoint::kMessages,
         R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"Hi"}],)"
         R"("output_config":{"format":{"type":"json_schema","flexible_whitespace":{},)"
         R"("schema":{"type":"object"}}}})",
         "output_config.format.flexible_whitespace: expected a boolean"},
        {Endpoint::kMessages,
         R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"Hi"}],)"
         R"("output_config":{"format":{"type":"json_object"}}})",
         "output_config.format.type: unknown type 'json_object'"},
        {Endpoint::kMessages,
         R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"Hi"}],)"
         R"("output_config":{"format":{"type":"json_schema","schema":{"type":"frog"}}}})",
         "frog"},
    };
    for (const Case& c : cases) {
        auto p = prepare_request(ctx, c.e, c.body, 1);
        ASSERT_FALSE(p.is_ok()) << c.body;
        HttpReply r = error_reply(c.e, p.status());
        EXPECT_EQ(r.status, 400) << c.body << " " << r.body;
        J j = J::parse(r.body);
        EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r.body;
        EXPECT_NE(j["error"]["message"].get<std::string>().find(c.says), std::string::npos)
            << r.body;
    }
}

std::vector<Update> run(EngineService& service, engine::GenerateRequest request) {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Update> got;
    service.submit(1, std::move(request), [&](Update u) {
        std::lock_guard<std::mutex> lock(mu);
        got.push_back(std::move(u));
        cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120),
                            [&] { return !got.empty() && got.back().finished; }));
    return got;
}

// The tiny synthetic model (in memory) behind an EngineService.
struct TinyEngine {
    std::unique_ptr<DeepseekModel> model;
    std::unique_ptr<EngineService> service;
};

TinyEngine tiny_engine() {
    TinyEngine t;
    ModelConfig mc = synthetic_preset("tiny").value();
    auto model = DeepseekModel::load(synthetic_memory_model(mc, 7), {1});
    DSI_CHECK(model.is_ok(), model.status().to_string());
    t.model = std::move(model).value();
    engine::EngineOptions eo;
    eo.num_kv_blocks = 64;
    eo.tokenizer = &tokenizer();
    auto eng = engine::Engine::create(t.model.get(), eo, Env::default_env());
    DSI_CHECK(eng.is_ok(), eng.status().to_string());
    t.service = std::make_unique<EngineService>(std::move(eng).value());
    return t;
}

TEST(StructuredOutput, ChatJsonSchemaOutputValidates) {
    TinyEngine tiny = tiny_engine();
    EngineService& service = *tiny.service;
    ApiContext ctx = context();
    for (int seed = 1; seed <= 3; ++seed) {
        const std::string body =
            R"({"model":"m","max_tokens":150,"temperature":1,"seed":)" + std::to_string(seed) +
            R"(,"messages":[{"role":"user","content":"A person"}],"response_format":)"
            R"({"type":"json_schema","json_schema":{"name":"p","schema":)" +
            std::string(kSchema) + "}}}";
        auto p = prepare_request(ctx, Endpoint::kChatCompletions, body, 1);
        ASSERT_TRUE(p.is_ok()) << p.status().to_string();
        Renderer r(ctx, *p, "id", 1);
        std::vector<Update> ups = run(service, std::move(p->request));
        ASSERT_FALSE(ups.empty());
        EXPECT_EQ(ups.back().reason, engine::FinishReason::kStop);
        for (const Update& u : ups) r.on_update(u);
        J j = J::parse(r.reply().body);
        const std::string content = j["choices"][0]["message"]["content"].get<std::string>();
        J v = J::parse(content, nullptr, false);
        ASSERT_FALSE(v.is_discarded()) << content;
        ASSERT_TRUE(v.is_object()) << content;
        EXPECT_EQ(v.size(), 3u) << content;
        ASSERT_TRUE(v["name"].is_string()) << content;
        EXPECT_LE(v["name"].get<std::string>().size(), 8u * 4) << content;  // 8 code points
        ASSERT_TRUE(v["age"].is_number_integer()) << content;
        EXPECT_GE(v["age"].get<int64_t>(), 0);
        EXPECT_LE(v["age"].get<int64_t>(), 120);
        EXPECT_TRUE(v["ok"].is_boolean()) << content;
        EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    }
    // guided_regex on the legacy completions endpoint.
    auto p = prepare_request(
        ctx, Endpoint::kCompletions,
        R"x({"model":"m","prompt":"Mail:","max_tokens":40,"seed":5,)x"
        R"x("guided_regex":"[a-z]{1,6}@[a-z]{1,6}\\.(com|org)"})x",
        1);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    Renderer r(ctx, *p, "id", 1);
    for (const Update& u : run(service, std::move(p->request))) r.on_update(u);
    const std::string text = J::parse(r.reply().body)["choices"][0]["text"];
    EXPECT_TRUE(std::regex_match(text, std::regex("[a-z]{1,6}@[a-z]{1,6}\\.(com|org)"))) << text;
}

constexpr const char* kTools =
    R"([{"type":"function","function":{"name":"get_weather","description":"weather",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":10},)"
    R"("days":{"type":"integer","minimum":1,"maximum":7},)"
    R"("unit":{"enum":["c","f"]}},"required":["city","days"]}}},)"
    R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object",)"
    R"("properties":{"zone":{"type":"string","format":"uuid"}},"required":["zone"]}}}])";

// Checks one tool call's arguments against kTools' schemas.
void check_call(const J& call) {
    const std::string name = call["function"]["name"];
    J args = J::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(args.is_object()) << call;
    if (name == "get_weather") {
        ASSERT_TRUE(args["city"].is_string()) << call;
        ASSERT_TRUE(args["days"].is_number_integer()) << call;
        EXPECT_GE(args["days"].get<int64_t>(), 1);
        EXPECT_LE(args["days"].get<int64_t>(), 7);
        if (args.contains("unit")) {
            EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << call;
        }
        for (const auto& [k, v] : args.items()) {
            EXPECT_TRUE(k == "city" || k == "days" || k == "unit") << call;
        }
    } else {
        ASSERT_EQ(name, "get_time");
        ASSERT_TRUE(args["zone"].is_string()) << call;
        EXPECT_EQ(args["zone"].get<std::string>().size(), 36u) << call;
        EXPECT_EQ(args.size(), 1u) << call;
    }
}

TEST(StructuredOutput, ToolChoiceRequiredAndNamedGiveValidToolCalls) {
    TinyEngine tiny = tiny_engine();
    EngineService& service = *tiny.service;
    ApiContext ctx = context();
    struct Case {
        Endpoint e;
        std::string choice;  // request fragment
        std::string only;    // the one function expected, or empty
    };
    const std::vector<Case> cases = {
        {Endpoint::kChatCompletions, R"("required","parallel_tool_calls":false)", ""},
        {Endpoint::kChatCompletions, R"({"type":"function","function":{"name":"get_weather"}})",
         "get_weather"},
        {Endpoint::kChatCompletions, R"({"type":"function","function":{"name":"get_time"}})",
         "get_time"},
        {Endpoint::kMessages, R"({"type":"tool","name":"get_weather"})", "get_weather"},
    };
    int seed = 0;
    for (const Case& c : cases) {
        for (int rep = 0; rep < 1; ++rep) {
            ++seed;
            std::string body;
            if (c.e == Endpoint::kMessages) {
                body = R"({"model":"m","max_tokens":200,"temperature":1,"messages":[{"role":"user",)"
                       R"("content":"Weather?"}],"tools":[{"name":"get_weather","input_schema":)" +
                       J::parse(kTools)[0]["function"]["parameters"].dump() +
                       R"(}],"tool_choice":)" + c.choice + "}";
            } else {
                body = R"({"model":"m","max_tokens":200,"temperature":1,"seed":)" +
                       std::to_string(seed) +
                       R"(,"messages":[{"role":"user","content":"Weather?"}],"tools":)" +
                       std::string(kTools) + R"(,"tool_choice":)" + c.choice + "}";
            }
            auto p = prepare_request(ctx, c.e, body, static_cast<uint64_t>(seed));
            ASSERT_TRUE(p.is_ok()) << p.status().to_string();
            ASSERT_NE(p->request.mask, nullptr);
            Renderer r(ctx, *p, "id", 1);
            for (const Update& u : run(service, std::move(p->request))) r.on_update(u);
            J j = J::parse(r.reply().body);
            if (c.e == Endpoint::kMessages) {
                EXPECT_EQ(j["stop_reason"], "tool_use") << j;
                int n = 0;
                for (const J& block : j["content"]) {
                    if (block["type"] != "tool_use") continue;
                    ++n;
                    EXPECT_EQ(block["name"], "get_weather");
                    check_call(J{{"function",
                                  {{"name", block["name"]}, {"arguments", block["input"].dump()}}}});
                }
                EXPECT_EQ(n, 1) << j;
                continue;
            }
            const J& choice = j["choices"][0];
            EXPECT_EQ(choice["finish_reason"], "tool_calls") << j;
            ASSERT_TRUE(choice["message"]["tool_calls"].is_array()) << j;
            ASSERT_GE(choice["message"]["tool_calls"].size(), 1u) << j;
            if (!c.only.empty()) {
                EXPECT_EQ(choice["message"]["tool_calls"].size(), 1u) << j;
            }
            for (const J& call : choice["message"]["tool_calls"]) {
                if (!c.only.empty()) {
                    EXPECT_EQ(call["function"]["name"], c.only);
                }
                check_call(call);
            }
        }
    }
    // Without tools, or with a response_format too: 400.
    for (const std::string& body :
         {chat_body(R"(,"tools":[],"tool_choice":"required")"),
          chat_body(R"(,"tools":)" + std::string(kTools) +
                    R"(,"tool_choice":"required","response_format":{"type":"json_object"})")}) {
        auto p = prepare_request(ctx, Endpoint::kChatCompletions, body, 1);
        ASSERT_FALSE(p.is_ok()) << body;
        EXPECT_EQ(error_reply(Endpoint::kChatCompletions, p.status()).status, 400);
        EXPECT_NE(p.status().message().find("tool_choice"), std::string::npos)
            << p.status().to_string();
    }
}

}  // namespace
}  // namespace dsi::server
