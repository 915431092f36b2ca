// Real-world schemas (issue 21): every schema of the vendored corpus
// (tests/data/realworld-schemas: GitHub's REST API component schemas and webhook
// payload schemas; realworld_corpus.h) is compiled as the server compiles it, every
// instance fed byte by byte, and each accepted one again token by token with the real
// DeepSeek V3 vocabulary, each token checked against the full mask.
// Hard failures: an instance ajv rejects that the grammar accepts (a false accept), a
// token of an accepted instance missing from its mask, and fewer compiled schemas than
// the floor (the count achieved when it was last raised). Valid instances rejected
// (false rejects, with where each fails) and compile errors by kind are written to
// build/grammar_realworld.md.
#include "grammar/realworld_corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/test_json.h"
#include "grammar/test_tokenizer.h"
#include "support/build_paths.h"

namespace dsi::grammar {
namespace {

// Compiled schemas of the 1,178 when this floor was last raised: raise it with coverage.
constexpr int kCompiledFloor = 1161;

TEST(RealWorldSchemas, ZeroFalseAcceptsAndCompiledFloor) {
    const auto corpus = realworld::load_corpus(DSINFER_SOURCE_DIR);
    MatcherOptions options;
    options.table_cache = std::make_shared<PositionTableCache>();  // as the compile service
    const auto run = realworld::run_corpus(corpus, test_util::real_tokenizer(), options);
    // Every false reject (where each fails) and compile failure in the file, the first 40
    // in the log.
    std::ofstream(std::string(DSINFER_BINARY_DIR) + "/grammar_realworld.md")
        << run.markdown(std::max(run.false_rejected.size(), run.compile_failures.size()));
    std::cout << run.markdown(40);
    for (const auto& f : run.false_accepted) ADD_FAILURE() << "FALSE ACCEPT " << f;
    for (const auto& f : run.token_failures) ADD_FAILURE() << "TOKEN REPLAY " << f;
    EXPECT_EQ(run.false_accepts, 0);
    EXPECT_TRUE(run.token_failures.empty());
    EXPECT_GE(run.num_compiled, kCompiledFloor);
    EXPECT_GT(run.valid_accepted, 0);
}

// JsonSchemaOptions::flexible_whitespace on every third schema: each instance
// re-serialised with two-space indentation (the usual pretty form) keeps ajv's
// verdict up to false rejects: zero false accepts, and most valid ones accepted.
TEST(RealWorldSchemas, FlexibleWhitespaceZeroFalseAccepts) {
    const auto corpus = realworld::load_corpus(DSINFER_SOURCE_DIR);
    auto vocab = Vocabulary::from_tokenizer(test_util::real_tokenizer());
    JsonSchemaOptions flexible;
    flexible.flexible_whitespace = true;
    int num_valid = 0, valid_accepted = 0, num_invalid = 0, false_accepts = 0;
    for (size_t i = 0; i < corpus.size(); i += 3) {
        auto g = compile_json_schema(corpus[i].schema, flexible);
        if (!g.is_ok()) continue;
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), vocab);
        for (const auto& inst : corpus[i].instances) {
            auto v = nlohmann::ordered_json::parse(inst.text);
            if (v.dump() != inst.text) continue;  // a number nlohmann spells differently
            const std::string pretty = v.dump(2);
            GrammarMatcher m(cg);
            const bool accepted = m.advance_bytes(pretty) && m.is_accepted();
            if (inst.valid) {
                ++num_valid;
                valid_accepted += accepted;
            } else {
                ++num_invalid;
                if (accepted) {
                    ++false_accepts;
                    ADD_FAILURE() << "FALSE ACCEPT " << corpus[i].id << ": " << pretty;
                }
            }
        }
    }
    std::cout << "flexible whitespace: " << valid_accepted << " of " << num_valid
              << " valid accepted, " << false_accepts << " of " << num_invalid
              << " invalid accepted\n";
    EXPECT_EQ(false_accepts, 0);
    EXPECT_GT(num_invalid, 500);
    EXPECT_GE(valid_accepted, num_valid * 9 / 10);
}

// JsonSchemaOptions::any_property_order on every schema: each instance as labelled and
// with every object's members reversed (JSON Schema does not read member order, so the
// label holds for both). Zero false accepts; with the option fewer valid instances
// are rejected than without it (declaration order), counted on the same instances.
TEST(RealWorldSchemas, AnyPropertyOrderZeroFalseAccepts) {
    const auto corpus = realworld::load_corpus(DSINFER_SOURCE_DIR);
    auto vocab = Vocabulary::from_tokenizer(test_util::real_tokenizer());
    JsonSchemaOptions any_order;
    any_order.any_property_order = true;
    int num_valid = 0, num_invalid = 0, false_accepts = 0, any_rejects = 0, fixed_rejects = 0;
    for (const auto& s : corpus) {
        auto g = compile_json_schema(s.schema, any_order);
        auto fixed = compile_json_schema(s.schema);
        ASSERT_EQ(g.is_ok(), fixed.is_ok()) << s.id;  // the option changes no verdict on a schema
        if (!g.is_ok()) continue;
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), vocab);
        auto fixed_cg = std::make_shared<CompiledGrammar>(std::move(fixed).value(), vocab);
        for (const auto& inst : s.instances) {
            auto v = nlohmann::ordered_json::parse(inst.text);
            std::vector<std::string> texts = {inst.text};
            if (v.dump() == inst.text && test_util::reversed_keys(v).dump() != inst.text) {
                texts.push_back(test_util::reversed_keys(v).dump());
            }
            for (const auto& text : texts) {
                GrammarMatcher m(cg), f(fixed_cg);
                const bool accepted = m.advance_bytes(text) && m.is_accepted();
                const bool fixed_accepted = f.advance_bytes(text) && f.is_accepted();
                if (inst.valid) {
                    ++num_valid;
                    any_rejects += !accepted;
                    fixed_rejects += !fixed_accepted;
                    EXPECT_TRUE(accepted || !fixed_accepted) << s.id << ": " << text;
                } else {
                    ++num_invalid;
                    if (accepted) {
                        ++false_accepts;
                        ADD_FAILURE() << "FALSE ACCEPT " << s.id << ": " << text;
                    }
                }
            }
        }
    }
    std::cout << "any property order: " << any_rejects << " of " << num_valid
              << " valid rejected (declaration order: " << fixed_rejects << "), " << false_accepts
              << " of " << num_invalid << " invalid accepted\n";
    EXPECT_EQ(false_accepts, 0);
    EXPECT_GT(num_invalid, 3000);
    EXPECT_LT(any_rejects, fixed_rejects);
}

}  // namespace
}  // namespace dsi::grammar
