// Issue 7's generation check: 20 JSON schemas (tests/cases/grammar/
// generation_schemas.json) x 10 sampled outputs (temperature 1, seeds 1..10) plus one
// greedy output each, on the `tiny` synthetic model with the real DeepSeek V3
// vocabulary, masked by GrammarMaskProvider. Every output must finish with EOS where
// the grammar accepts (checked on a fresh matcher); the outputs go to
// build/grammar_generation_samples.jsonl, which grammar_generation_ajv_check validates
// with ajv (draft 2020-12 + ajv-formats).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/engine.h"
#include "grammar/compile_service.h"
#include "grammar/mask_provider.h"
#include "grammar/test_tokenizer.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "support/build_paths.h"

namespace dsi::grammar {
namespace {

constexpr int kSampled = 10;
constexpr int64_t kWait = int64_t{60} * 1000000000;

TEST(GrammarGeneration, TwentySchemasSampledAndGreedyOnTiny) {
    const Tokenizer& tok = test_util::real_tokenizer();
    std::ifstream in(std::string(DSINFER_SOURCE_DIR) + "/tests/cases/grammar/generation_schemas.json");
    ASSERT_TRUE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    const nlohmann::ordered_json schemas = nlohmann::ordered_json::parse(ss.str());
    ASSERT_EQ(schemas.size(), 20u);

    auto vocab = Vocabulary::from_tokenizer(tok);
    CompileService svc;
    std::vector<std::shared_ptr<const CompiledGrammar>> grammars;
    for (const auto& s : schemas) {
        auto h = svc.submit(GrammarSpec{GrammarKind::kJsonSchema, s.dump()}, vocab);
        ASSERT_TRUE(h.is_ok()) << h.status().to_string();
        CompileResult r = (*h)->wait_for(kWait);
        ASSERT_TRUE(r.is_ok()) << s.dump() << ": " << r.status().to_string();
        grammars.push_back(*r);
    }

    ModelConfig c = synthetic_preset("tiny").value();
    auto model = DeepseekModel::load(synthetic_memory_model(c, 11), {2});
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    engine::EngineOptions o;
    o.num_kv_blocks = 512;
    o.tokenizer = &tok;
    auto eng = engine::Engine::create(model->get(), o, Env::default_env());
    ASSERT_TRUE(eng.is_ok()) << eng.status().to_string();

    struct Out {
        size_t schema = 0;
        bool greedy = false;
        std::vector<int32_t> tokens;
        engine::FinishReason reason = engine::FinishReason::kNone;
    };
    std::map<engine::RequestId, Out> outs;
    const std::vector<int32_t> prompt = tok.encode("Reply with JSON: ");
    for (size_t i = 0; i < schemas.size(); ++i) {
        for (int k = 0; k <= kSampled; ++k) {
            engine::GenerateRequest r;
            r.prompt = prompt;
            const bool greedy = k == kSampled;
            r.sampling.temperature = greedy ? 0.0 : 1.0;
            r.sampling.seed = 1000 * i + k + 1;
            r.sampling.max_tokens = 256;
            r.mask = std::make_shared<GrammarMaskProvider>(grammars[i]);
            auto id = (*eng)->add_request(std::move(r), [&outs](const engine::TokenEvent& ev) {
                Out& out = outs[ev.request_id];
                if (ev.token >= 0) out.tokens.push_back(ev.token);
                if (ev.finished) out.reason = ev.reason;
            });
            ASSERT_TRUE(id.is_ok()) << id.status().to_string();
            outs[*id].schema = i;
            outs[*id].greedy = greedy;
        }
    }
    ASSERT_TRUE((*eng)->run().is_ok());

    std::ofstream samples(std::string(DSINFER_BINARY_DIR) + "/grammar_generation_samples.jsonl");
    std::set<std::string> distinct;
    int checked = 0;
    for (const auto& [id, out] : outs) {
        const std::string what = schemas[out.schema].dump() + (out.greedy ? " greedy" : "");
        ASSERT_EQ(out.reason, engine::FinishReason::kStop) << what;
        ASSERT_FALSE(out.tokens.empty());
        ASSERT_EQ(out.tokens.back(), tok.eos_id()) << what;
        GrammarMatcher m(grammars[out.schema]);
        for (size_t t = 0; t + 1 < out.tokens.size(); ++t) {
            ASSERT_TRUE(m.advance(out.tokens[t])) << what << " token " << t;
        }
        ASSERT_TRUE(m.is_accepted()) << what;
        const std::string text =
            tok.decode(std::span<const int32_t>(out.tokens.data(), out.tokens.size() - 1));
        distinct.insert(text);
        samples << nlohmann::ordered_json{{"schema", schemas[out.schema]}, {"output", text}}.dump()
                << "\n";
        ++checked;
    }
    EXPECT_EQ(checked, 20 * (kSampled + 1));
    EXPECT_GT(distinct.size(), 40u);  // temperature 1 with different seeds: varied outputs
    std::printf("grammar generation: %d outputs, %zu distinct\n", checked, distinct.size());
}

}  // namespace
}  // namespace dsi::grammar
