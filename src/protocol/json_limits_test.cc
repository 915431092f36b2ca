// Issue 22 D1: request bodies nested 20,000 and 100,000 levels deep in every place a
// client can nest JSON are 400s naming the field (and this process survives them);
// the depth scanner's paths; python_dumps without recursion.
#include "protocol/json_limits.h"

#include <gtest/gtest.h>

#include "protocol/adapters.h"
#include "protocol/internal/python_json.h"

namespace dsi::protocol {
namespace {

using J = nlohmann::ordered_json;

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// A JSON string literal holding `text` (for arguments given as strings).
std::string quoted(const std::string& text) { return J(text).dump(); }

struct DeepCase {
    ApiProtocol api;
    std::string field;  // the path the 400 must name
    std::string body;
};

std::vector<DeepCase> deep_cases(int depth) {
    const std::string d = nested(depth);
    const std::string user = R"({"role":"user","content":"hi"})";
    return {
        {ApiProtocol::kChatCompletions, "tools[0].function.parameters.x",
         R"({"model":"m","messages":[)" + user +
             R"(],"tools":[{"type":"function","function":{"name":"f","parameters":{"x":)" + d +
             "}}}]}"},
        {ApiProtocol::kChatCompletions, "messages[1].tool_calls[0].function.arguments.x",
         R"({"model":"m","messages":[)" + user +
             R"(,{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",)"
             R"("function":{"name":"f","arguments":)" +
             quoted(R"({"x":)" + d + "}") + "}}]}]}"},
        {ApiProtocol::kChatCompletions, "response_format.json_schema.schema.x",
         R"({"model":"m","messages":[)" + user +
             R"(],"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"x":)" +
             d + "}}}}"},
        {ApiProtocol::kResponses, "tools[0].parameters.x",
         R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f","parameters":{"x":)" +
             d + "}}]}"},
        {ApiProtocol::kResponses, "input[1].arguments.x",
         R"({"model":"m","input":[)" + user +
             R"(,{"type":"function_call","call_id":"c","name":"f","arguments":)" +
             quoted(R"({"x":)" + d + "}") + "}]}"},
        {ApiProtocol::kResponses, "text.format.schema.x",
         R"({"model":"m","input":"hi","text":{"format":{"type":"json_schema","name":"s","schema":{"x":)" +
             d + "}}}}"},
        {ApiProtocol::kMessages, "tools[0].input_schema.x",
         R"({"model":"m","max_tokens":5,"messages":[)" + user +
             R"(],"tools":[{"name":"f","input_schema":{"x":)" + d + "}}]}"},
        {ApiProtocol::kMessages, "messages[1].content[0].input.x",
         R"({"model":"m","max_tokens":5,"messages":[)" + user +
             R"(,{"role":"assistant","content":[{"type":"tool_use","id":"c","name":"f","input":{"x":)" +
             d + "}}]}]}"},
    };
}

TEST(JsonLimits, DeepRequestsAre400NamingTheField) {
    for (int depth : {20000, 100000}) {
        for (const DeepCase& c : deep_cases(depth)) {
            auto r = parse_request(c.api, c.body);
            ASSERT_FALSE(r.is_ok()) << c.field << " at " << depth;
            EXPECT_EQ(http_status(r.status().code()), 400);
            EXPECT_EQ(r.status().message(),
                      c.field + ": JSON nested deeper than " +
                          std::to_string(kDefaultMaxJsonDepth) + " levels")
                << depth;
            // The protocol's error object names the field as `param`.
            const J err = J::parse(json_error_body(c.api, r.status()));
            if (c.api != ApiProtocol::kMessages) {
                EXPECT_EQ(err["error"]["param"], c.field);
            }
        }
    }
}

TEST(JsonLimits, AtTheLimitParses) {
    // Body (1) + tools array (2) + tool (3) + function (4) + parameters (5) + x: the
    // deepest array that fits is max_depth - 5 levels.
    const int limit = 16;
    auto body = [](int depth) {
        return R"({"model":"m","messages":[{"role":"user","content":"hi"}],)"
               R"("tools":[{"type":"function","function":{"name":"f","parameters":{"x":)" +
               nested(depth) + "}}}]}";
    };
    EXPECT_TRUE(parse_chat_completions_request(body(limit - 5), limit).is_ok());
    auto r = parse_chat_completions_request(body(limit - 4), limit);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(),
              "tools[0].function.parameters.x: JSON nested deeper than 16 levels");
}

TEST(JsonLimits, ScannerPaths) {
    EXPECT_TRUE(check_json_depth("[[1]]", 2, "").is_ok());
    EXPECT_EQ(check_json_depth("[[[1]]]", 2, "").message(),
              "body: JSON nested deeper than 2 levels");
    EXPECT_EQ(check_json_depth("{}", 0, "").message(), "body: JSON nested deeper than 0 levels");
    // Brackets inside strings (also after escaped quotes) do not count; keys with
    // escapes are named; indices count commas.
    EXPECT_TRUE(check_json_depth(R"({"a":"[[[[\"[[[["})", 1, "").is_ok());
    EXPECT_EQ(check_json_depth(R"({"a\"b":[1,"x,]",[[0]]]})", 3, "f").message(),
              "f.a\"b: JSON nested deeper than 3 levels");
    EXPECT_EQ(check_json_depth(R"({"a":1,"b":{"c":[{}]}})", 3, "").message(),
              "b.c: JSON nested deeper than 3 levels");
    // Not JSON: passes the scan (the parser rejects it), without reading past the end.
    EXPECT_TRUE(check_json_depth("]]]}}\"", 1, "").is_ok());
    EXPECT_TRUE(check_json_depth("\"\\", 1, "").is_ok());
    // Paths name members (the first 8 steps at most), not runs of indices.
    EXPECT_EQ(check_json_depth(nested(50), 20, "").message(),
              "body: JSON nested deeper than 20 levels");
    std::string deep_objects;
    for (int i = 0; i < 30; ++i) {
        deep_objects += "{\"a\":";
    }
    EXPECT_EQ(check_json_depth(deep_objects, 20, "").message(),
              "a.a.a.a.a.a.a.a: JSON nested deeper than 20 levels");
    auto parsed = parse_json(nested(30), 20, "tools");
    ASSERT_FALSE(parsed.is_ok());
    EXPECT_EQ(parsed.status().message(), "tools: JSON nested deeper than 20 levels");
    EXPECT_EQ(parse_json("{", 20, "x").status().message().substr(0, 17), "x: invalid JSON: ");
}

TEST(JsonLimits, PythonDumpsHasNoRecursion) {
    // Built in memory (parse would refuse it): 100,000 levels, dumped without recursion.
    const int depth = 100000;
    J v = J::array();
    J* inner = &v;
    for (int i = 1; i < depth; ++i) {
        inner->push_back(J::array());
        inner = &inner->back();
    }
    EXPECT_EQ(internal::python_dumps(v), nested(depth));
    EXPECT_EQ(internal::python_dumps(J::parse(R"({"a":[1,{"b":"x\ny"},[]],"c":{}})")),
              R"({"a": [1, {"b": "x\ny"}, []], "c": {}})");
}

}  // namespace
}  // namespace dsi::protocol
