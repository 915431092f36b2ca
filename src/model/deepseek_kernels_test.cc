// The forward pass on kernels/ (issue 3): every weight format stays batch invariant
// (a sequence alone vs inside a batch, 1 vs 2 threads: bitwise equal) and close to
// the reference loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/deepseek.h"
#include "model/synthetic.h"

namespace dsi {
namespace {

std::unique_ptr<DeepseekModel> load(const char* preset, int threads, const std::string& format,
                                    bool reference = false) {
    ModelConfig c = synthetic_preset(preset).value();
    c.vocab_size = 512;
    DeepseekModel::Options o;
    o.num_threads = threads;
    o.weight_format = format;
    o.reference_kernels = reference;
    auto m = DeepseekModel::load(synthetic_memory_model(c, 1234), o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return std::move(m).value();
}

std::vector<float> logits_alone(DeepseekModel& m, const std::vector<int32_t>& toks) {
    auto cache = m.new_kv_cache(32);
    ForwardOutput o;
    EXPECT_TRUE(m.forward(toks, 0, *cache, true, o).is_ok());
    return o.logits;
}

class KernelFormats : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(KernelFormats, BatchInvariantAndCloseToReference) {
    const auto [preset, format] = GetParam();
    auto m1 = load(preset, 1, format);
    auto m2 = load(preset, 2, format);
    const std::vector<std::vector<int32_t>> prompts = {{3}, {1, 2, 3, 4, 5, 6, 7}, {400, 9, 9}};
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<SequenceStep> steps;
    for (const auto& p : prompts) {
        caches.push_back(m2->new_kv_cache(32));
        steps.push_back({p, 0, caches.back().get(), true});
    }
    BatchOutput b;
    ASSERT_TRUE(m2->forward_batch(steps, b).is_ok());
    auto ref = load(preset, 1, "auto", /*reference=*/true);
    for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<float> alone = logits_alone(*m1, prompts[i]);
        std::vector<float> batched(b.logits.begin() + b.logit_row[i] * 512,
                                   b.logits.begin() + (b.logit_row[i] + prompts[i].size()) * 512);
        EXPECT_EQ(alone, batched) << format << " sequence " << i;
        std::vector<float> r = logits_alone(*ref, prompts[i]);
        double maxdiff = 0, maxabs = 0;
        for (size_t j = 0; j < r.size(); ++j) {
            maxdiff = std::max(maxdiff, static_cast<double>(std::fabs(r[j] - alone[j])));
            maxabs = std::max(maxabs, static_cast<double>(std::fabs(r[j])));
        }
        // q8_0 rounds weights and activations to 8 bits, bf16 rounds the f32 weights;
        // mxfp4 rounds the routed experts' weights to e2m1 (3 bits + sign) per 32: on
        // these random Gaussian weights up to 0.28 of max |logit| (a sanity bound; the
        // kernels are checked exactly in kernels_test and against llama.cpp).
        const std::string f = format;
        const double rel = f.find("mxfp4") != std::string::npos ? 0.5
                           : f.find("q8_0") != std::string::npos ? 0.1
                           : f.find("bf16") != std::string::npos ? 0.05
                                                                 : 1e-4;
        std::printf("%s %s sequence %zu: max |logit - reference| = %.3g of max |logit| %.3g\n",
                    preset, format, i, maxdiff, maxabs);
        EXPECT_LE(maxdiff, rel * maxabs) << format << " sequence " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(All, KernelFormats,
                         ::testing::Combine(::testing::Values("tiny", "tiny-v3"),
                                            ::testing::Values("auto", "bf16", "q8_0",
                                                              "experts=q8_0,attn=bf16",
                                                              "experts=mxfp4")));

TEST(KernelFormatsTest, RejectsUnknownFormat) {
    ModelConfig c = synthetic_preset("tiny").value();
    c.vocab_size = 512;
    DeepseekModel::Options o;
    o.weight_format = "experts=q3";
    EXPECT_FALSE(DeepseekModel::load(synthetic_memory_model(c, 1), o).is_ok());
}

}  // namespace
}  // namespace dsi
