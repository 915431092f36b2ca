#include "workload/trace.h"
#include "support/build_paths.h"

#include <gtest/gtest.h>

namespace dsi::workload {
namespace {

std::string traces_dir() { return std::string(DSINFER_SOURCE_DIR) + "/tests/data/traces/"; }

TEST(TraceTest, ParsesMooncakeLines) {
    auto t = parse_mooncake_jsonl(
        "{\"timestamp\": 5, \"input_length\": 1000, \"output_length\": 7, \"hash_ids\": [1, 2]}\n"
        "\n"
        "{\"timestamp\": 2, \"input_length\": 600, \"output_length\": 0, \"hash_ids\": [1]}\n");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    ASSERT_EQ(t->requests.size(), 2u);
    EXPECT_EQ(t->requests[0].input_tokens, 600);  // sorted by arrival
    EXPECT_EQ(t->requests[0].arrival_ns, 0);
    EXPECT_EQ(t->requests[1].arrival_ns, 3'000'000);
    EXPECT_EQ(t->blocks_of(t->requests[1]).size(), 2u);
    EXPECT_EQ(t->blocks_of(t->requests[1])[1], 2u);
}

TEST(TraceTest, BadMooncakeLinesNameTheLine) {
    struct Case {
        const char* text;
        const char* want;
    };
    const Case cases[] = {
        {"{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1}\nnot json\n", "line 2"},
        {"{\"timestamp\": 1, \"output_length\": 1}\n", "input_length"},
        {"{\"timestamp\": -1, \"input_length\": 10, \"output_length\": 1}\n", "timestamp"},
        {"{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 1}\n", "input_length"},
        {"{\"timestamp\": 1, \"input_length\": 10.5, \"output_length\": 1}\n", "integers"},
        {"{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": 3}\n",
         "array"},
        {"{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1, 2]}\n",
         "more hash_ids"},
        {"{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [-4]}\n",
         "non-negative"},
        {"[1, 2]\n", "line 1"},
        {"", "no requests"},
    };
    for (const Case& c : cases) {
        auto t = parse_mooncake_jsonl(c.text);
        ASSERT_FALSE(t.is_ok()) << c.text;
        EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(t.status().message().find(c.want), std::string::npos)
            << t.status().to_string() << " / want " << c.want;
    }
}

TEST(TraceTest, ParsesAzureCsvAndRejectsBadLines) {
    auto t = parse_azure_csv(
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        "2023-11-16 18:17:03.9799600,4808,10\r\n"
        "2023-11-16 18:17:04.0319600,3180,8\r\n");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    ASSERT_EQ(t->requests.size(), 2u);
    EXPECT_EQ(t->requests[1].arrival_ns, 52'000'000);
    EXPECT_EQ(t->requests[0].input_tokens, 4808);
    EXPECT_EQ(t->requests[1].output_tokens, 8);

    const char* bad[] = {
        "A,B,C\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,12\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,12,3\n2023-13-01 "
        "00:00:00,1,1\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,x,3\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,5,-3\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,5,3,4\n",
    };
    const char* line[] = {"line 1", "line 2", "line 3", "line 2", "line 2", "line 2"};
    for (size_t i = 0; i < std::size(bad); ++i) {
        auto r = parse_azure_csv(bad[i]);
        ASSERT_FALSE(r.is_ok()) << bad[i];
        EXPECT_NE(r.status().message().find(line[i]), std::string::npos) << r.status().to_string();
    }
}

TEST(TraceTest, LoadsTheRealTraces) {
    Env* env = Env::default_env();
    auto m = load_trace(env, traces_dir() + "mooncake_synthetic_trace.jsonl");
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(m->requests.size(), 3993u);
    auto code = load_trace(env, traces_dir() + "azure2023_code.csv");
    ASSERT_TRUE(code.is_ok()) << code.status().to_string();
    // 8,819 data rows (the README says 8,818: the file has no final newline).
    EXPECT_EQ(code->requests.size(), 8819u);
    auto conv = load_trace(env, traces_dir() + "azure2023_conv.csv");
    ASSERT_TRUE(conv.is_ok());
    EXPECT_EQ(conv->requests.size(), 19366u);
    EXPECT_FALSE(load_trace(env, traces_dir() + "README.md").is_ok());
    EXPECT_FALSE(load_trace(env, "/nonexistent/x.jsonl").is_ok());
}

TEST(TraceTest, SyntheticIsDeterministicAndRoundTrips) {
    SyntheticTraceSettings s;
    s.num_requests = 2000;
    s.long_context_fraction = 0.05;
    auto a = generate_synthetic_trace(s);
    auto b = generate_synthetic_trace(s);
    ASSERT_TRUE(a.is_ok());
    EXPECT_EQ(to_mooncake_jsonl(*a), to_mooncake_jsonl(*b));
    int64_t long_ones = 0;
    for (const auto& r : a->requests) {
        long_ones += r.input_tokens >= 262144 ? 1 : 0;
    }
    EXPECT_GT(long_ones, 50);  // the >= 256K bucket is exercised
    auto back = parse_mooncake_jsonl(to_mooncake_jsonl(*a));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->requests.size(), a->requests.size());
    EXPECT_EQ(back->blocks, a->blocks);
    s.rate_per_s = 0;
    EXPECT_FALSE(generate_synthetic_trace(s).is_ok());
}

}  // namespace
}  // namespace dsi::workload
