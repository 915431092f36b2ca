// KV cache dtypes (SPEC S-ENG-9; kernels/attention.h): per dtype the forward pass
// stays batch and chunk invariant (bitwise), stays within a stated distance of the
// f32 cache, and the reference loops read the same cache.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "model/deepseek.h"
#include "model/synthetic.h"

namespace dsi {
namespace {

constexpr int64_t kVocab = 512;

std::unique_ptr<DeepseekModel> load(const char* preset, int threads, const std::string& kv_dtype,
                                    bool reference = false) {
    ModelConfig c = synthetic_preset(preset).value();
    c.vocab_size = kVocab;
    DeepseekModel::Options o;
    o.num_threads = threads;
    o.kv_dtype = kv_dtype;
    o.reference_kernels = reference;
    auto m = DeepseekModel::load(synthetic_memory_model(c, 77), o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return std::move(m).value();
}

std::vector<int32_t> prompt(int64_t n, int32_t seed) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 37 + seed * 11) % kVocab);
    return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
    return d;
}

class KvDtypes : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(KvDtypes, InvariantAndCloseToF32) {
    const auto [preset, dtype] = GetParam();
    auto m1 = load(preset, 1, dtype);
    auto m2 = load(preset, 2, dtype);
    // 136 tokens: the prompt crosses the 128-position tile boundary.
    const std::vector<int32_t> toks = prompt(136, 1);
    const int64_t T = static_cast<int64_t>(toks.size());
    // Whole prefill, 1 thread.
    auto whole_cache = m1->new_kv_cache(T);
    ForwardOutput whole;
    ASSERT_TRUE(m1->forward(toks, 0, *whole_cache, true, whole).is_ok());
    // Chunks of 60 + 70, then token-by-token decode, 2 threads.
    auto cache = m2->new_kv_cache(T);
    std::vector<float> pieces;
    ForwardOutput part;
    ASSERT_TRUE(m2->forward(std::span(toks).first(60), 0, *cache, true, part).is_ok());
    pieces.insert(pieces.end(), part.logits.begin(), part.logits.end());
    ASSERT_TRUE(m2->forward(std::span(toks).subspan(60, 70), 60, *cache, true, part).is_ok());
    pieces.insert(pieces.end(), part.logits.begin(), part.logits.end());
    for (int64_t i = 130; i < T; ++i) {
        ASSERT_TRUE(m2->forward(std::span(toks).subspan(i, 1), i, *cache, false, part).is_ok());
        pieces.insert(pieces.end(), part.logits.begin(), part.logits.end());
    }
    EXPECT_EQ(pieces, whole.logits) << dtype;
    // Inside a batch with two other sequences (one in decode, one in prefill).
    std::vector<std::unique_ptr<KvCache>> caches;
    for (int i = 0; i < 3; ++i) caches.push_back(m2->new_kv_cache(T));
    const std::vector<int32_t> other = prompt(20, 2);
    ForwardOutput warm;
    ASSERT_TRUE(m2->forward(std::span(other).first(19), 0, *caches[1], false, warm).is_ok());
    std::vector<SequenceStep> steps = {{std::span(other).subspan(19, 1), 19, caches[1].get(), false},
                                       {toks, 0, caches[0].get(), true},
                                       {std::span(other).first(10), 0, caches[2].get(), false}};
    BatchOutput b;
    ASSERT_TRUE(m2->forward_batch(steps, b).is_ok());
    const std::vector<float> batched(b.logits.begin() + b.logit_row[1] * kVocab,
                                     b.logits.begin() + (b.logit_row[1] + T) * kVocab);
    EXPECT_EQ(batched, whole.logits) << dtype;

    // Distance from the f32 cache over the first kShort positions (further on, a
    // random-weight model amplifies any change chaotically), relative to the largest
    // logit; stated per dtype in docs/kernels.md.
    constexpr int64_t kShort = 16;
    const std::span<const int32_t> head = std::span(toks).first(kShort);
    const std::vector<float> mine(whole.logits.begin(), whole.logits.begin() + kShort * kVocab);
    auto f32 = load(preset, 1, "f32");
    auto f32_cache = f32->new_kv_cache(kShort);
    ForwardOutput exact;
    ASSERT_TRUE(f32->forward(head, 0, *f32_cache, true, exact).is_ok());
    double maxabs = 0;
    for (float v : exact.logits) maxabs = std::max(maxabs, double(std::fabs(v)));
    const double diff = max_abs_diff(mine, exact.logits);
    const std::string d = dtype;
    const double bound = d == "f32" ? 0.0 : d == "bf16" ? 0.08 : 0.3;
    std::printf("%s kv %s: max |logit - f32 kv logit| / max |logit| = %.3g (bound %.3g)\n",
                preset, dtype, diff / maxabs, bound);
    EXPECT_LE(diff, bound * maxabs) << dtype;
    if (d != "f32") {
        EXPECT_GT(diff, 0.0) << "the dtype is really in use";
    }

    // The reference loops read the same encoded cache.
    auto ref = load(preset, 1, dtype, /*reference=*/true);
    auto ref_cache = ref->new_kv_cache(kShort);
    ForwardOutput r;
    ASSERT_TRUE(ref->forward(head, 0, *ref_cache, true, r).is_ok());
    const double ref_diff = max_abs_diff(r.logits, mine);
    std::printf("%s kv %s: reference vs kernels %.3g\n", preset, dtype, ref_diff / maxabs);
    EXPECT_LE(ref_diff, 1e-3 * maxabs) << dtype;
}

INSTANTIATE_TEST_SUITE_P(All, KvDtypes,
                         ::testing::Combine(::testing::Values("tiny", "tiny-v3"),
                                            ::testing::Values("f32", "bf16", "e4m3")));

TEST(KvDtypesTest, RowSizeFollowsDtype) {
    // tiny: kv_lora_rank 64 + qk_rope_head_dim 16 = 80 values per row.
    EXPECT_EQ(load("tiny", 1, "f32")->kv_row_floats(), 80);
    EXPECT_EQ(load("tiny", 1, "bf16")->kv_row_floats(), 40);
    EXPECT_EQ(load("tiny", 1, "e4m3")->kv_row_floats(), 20 + 5);
    EXPECT_EQ(load("tiny", 1, "fp8")->kv_dtype(), kernels::KvDtype::kE4m3);
}

TEST(KvDtypesTest, RejectsUnknownDtypeAndE4m3OnOddSizes) {
    ModelConfig c = synthetic_preset("tiny").value();
    c.vocab_size = kVocab;
    DeepseekModel::Options o;
    o.kv_dtype = "f16";
    EXPECT_EQ(DeepseekModel::load(synthetic_memory_model(c, 1), o).status().code(),
              StatusCode::kInvalidArgument);
    c.kv_lora_rank = 40;  // not a multiple of 16: groups of 16 would straddle c_kv / k_pe
    o.kv_dtype = "e4m3";
    EXPECT_EQ(DeepseekModel::load(synthetic_memory_model(c, 1), o).status().code(),
              StatusCode::kInvalidArgument);
    o.kv_dtype = "bf16";
    EXPECT_TRUE(DeepseekModel::load(synthetic_memory_model(c, 1), o).is_ok());
}

}  // namespace
}  // namespace dsi
