// JSON-Schema-Test-Suite (draft 2020-12, vendored in tests/data/json-schema-test-suite): for each schema we
// support, valid instances (compact JSON) are accepted — byte by byte and token by
// token with the real DeepSeek V3 vocabulary — and invalid ones are rejected. Zero
// false accepts is a hard failure; a rejected valid instance is counted as "fail"
// in the per-file table (written to build/grammar_conformance.md).
// Also: random walks of the automaton (sampling only allowed tokens) write their
// outputs to build/grammar_samples.jsonl for the ajv check (tests/grammar/).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/test_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "support/build_paths.h"

namespace dsi::grammar {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

const Tokenizer& tokenizer() { return test_util::real_tokenizer(); }

TEST(JsonSchemaSuite, Draft2020_12) {
    const fs::path dir =
        fs::path(DSINFER_SOURCE_DIR) / "tests" / "data" / "json-schema-test-suite" / "draft2020-12";
    ASSERT_TRUE(fs::exists(dir)) << "vendored suite missing at " << dir;
    auto vocab = Vocabulary::from_tokenizer(tokenizer());
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() == ".json") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    std::string table =
        "| file | groups compiled | groups unsupported | instances pass | instances fail "
        "(valid rejected) | false accepts |\n|---|---|---|---|---|---|\n";
    int total_pass = 0, total_fail = 0, total_unsup = 0, total_groups = 0, false_accepts = 0;
    for (const auto& path : files) {
        std::ifstream f(path);
        ojson groups = ojson::parse(f);
        int compiled = 0, unsup = 0, pass = 0, fail = 0, fa = 0;
        for (const auto& group : groups) {
            // Validation of instances someone wrote: integers as 1.0 / 1E1 too.
            JsonSchemaOptions options;
            options.integer_spellings = true;
            auto g = compile_json_schema(group["schema"], options);
            if (!g.is_ok()) {
                ++unsup;
                EXPECT_TRUE(g.status().code() == StatusCode::kUnimplemented ||
                            g.status().code() == StatusCode::kInvalidArgument)
                    << path.filename() << ": " << g.status().to_string();
                continue;
            }
            ++compiled;
            auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), vocab);
            for (const auto& test : group["tests"]) {
                std::string text = test["data"].dump(-1, ' ', false, ojson::error_handler_t::replace);
                bool valid = test["valid"].get<bool>();
                GrammarMatcher m(cg);
                bool accepted = m.advance_bytes(text) && m.is_accepted();
                if (accepted && !valid) {
                    ++fa;
                    ADD_FAILURE() << "FALSE ACCEPT " << path.filename() << " / "
                                  << group["description"] << " / " << test["description"] << ": "
                                  << text;
                }
                if (accepted == valid) {
                    ++pass;
                } else {
                    ++fail;
                }
                if (accepted) {
                    // Token by token with the real vocabulary, each token in the mask.
                    GrammarMatcher tm(cg);
                    TokenBitmask mask(vocab->size());
                    for (int32_t id : tokenizer().encode(text)) {
                        tm.fill_mask(&mask);
                        ASSERT_TRUE(mask.test(id)) << text << " token " << id;
                        ASSERT_TRUE(tm.advance(id)) << text;
                    }
                    EXPECT_TRUE(tm.is_accepted()) << text;
                    tm.fill_mask(&mask);
                    EXPECT_TRUE(mask.test(tokenizer().eos_id())) << text;
                }
            }
        }
        table += "| " + path.filename().string() + " | " + std::to_string(compiled) + " | " +
                 std::to_string(unsup) + " | " + std::to_string(pass) + " | " +
                 std::to_string(fail) + " | " + std::to_string(fa) + " |\n";
        total_pass += pass;
        total_fail += fail;
        total_unsup += unsup;
        total_groups += compiled + unsup;
        false_accepts += fa;
    }
    table += "| **total** | " + std::to_string(total_groups - total_unsup) + " | " +
             std::to_string(total_unsup) + " | " + std::to_string(total_pass) + " | " +
             std::to_string(total_fail) + " | " + std::to_string(false_accepts) + " |\n";
    std::ofstream(std::string(DSINFER_BINARY_DIR) + "/grammar_conformance.md") << table;
    std::cout << table;
    EXPECT_EQ(false_accepts, 0);
    // Groups compiled when this floor was last raised (issue 21's Checks: a floor at
    // the achieved count, as the real-world corpus test has): raise it with coverage.
    constexpr int kCompiledGroupsFloor = 185;
    EXPECT_GE(total_groups - total_unsup, kCompiledGroupsFloor);
}

// Random walks: sample uniformly among allowed tokens (stop with probability 1/2
// when allowed) and write each completed output for the ajv check.
TEST(JsonSchemaSamples, RandomWalksProduceValidJson) {
    std::ifstream f(std::string(DSINFER_SOURCE_DIR) + "/tests/cases/grammar/json_schema.json");
    ojson cases = ojson::parse(f);
    auto vocab = Vocabulary::from_tokenizer(tokenizer());
    std::ofstream out(std::string(DSINFER_BINARY_DIR) + "/grammar_samples.jsonl");
    std::mt19937_64 rng(7);
    int complete = 0, total = 0;
    for (const auto& c : cases["cases"]) {
        if (c.contains("error")) continue;
        auto g = compile_json_schema(c["schema"]);
        ASSERT_TRUE(g.is_ok()) << g.status().to_string();
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), vocab);
        for (int k = 0; k < 10; ++k) {
            GrammarMatcher m(cg);
            TokenBitmask mask(vocab->size());
            std::vector<int32_t> ids;
            ++total;
            for (int step = 0; step < 200 && !m.is_terminated(); ++step) {
                m.fill_mask(&mask);
                std::vector<int32_t> allowed;
                for (int32_t t = 0; t < vocab->size(); ++t) {
                    if (mask.test(t)) allowed.push_back(t);
                }
                ASSERT_FALSE(allowed.empty()) << "dead end after " << tokenizer().decode(ids);
                int32_t pick = allowed[rng() % allowed.size()];
                if (m.is_accepted() && rng() % 2 == 0) pick = tokenizer().eos_id();
                ASSERT_TRUE(m.advance(pick));
                if (pick != tokenizer().eos_id()) ids.push_back(pick);
            }
            if (!m.is_terminated()) continue;
            ++complete;
            std::string text = tokenizer().decode(ids);
            ojson line = {{"schema", c["schema"]}, {"output", text}};
            out << line.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
            // Our own check: the grammar accepts its own output byte by byte.
            GrammarMatcher check(cg);
            EXPECT_TRUE(check.advance_bytes(text) && check.is_accepted()) << text;
        }
    }
    std::cout << complete << " of " << total << " walks completed\n";
    EXPECT_GT(complete, total / 3);
}

}  // namespace
}  // namespace dsi::grammar
