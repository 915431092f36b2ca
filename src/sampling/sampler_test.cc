#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace dsi {
namespace {

TEST(SamplerTest, GreedyPicksMaxLowestOnTie) {
    std::vector<float> l = {0.1f, 3.0f, -2.0f, 3.0f};
    EXPECT_EQ(argmax(l), 1);
    EXPECT_EQ(sample_token(l, SamplingParams{}, 0), 1);
}

TEST(SamplerTest, SameSeedAndPositionSameToken) {
    std::vector<float> l(100);
    for (int i = 0; i < 100; ++i) l[i] = static_cast<float>(i % 7) * 0.3f;
    SamplingParams p;
    p.temperature = 1.0;
    p.seed = 99;
    for (uint64_t pos = 0; pos < 50; ++pos) {
        EXPECT_EQ(sample_token(l, p, pos), sample_token(l, p, pos));
    }
    // Different positions give a spread of tokens.
    std::vector<int> seen(100);
    for (uint64_t pos = 0; pos < 2000; ++pos) seen[sample_token(l, p, pos)]++;
    int distinct = 0;
    for (int s : seen) distinct += s > 0;
    EXPECT_GT(distinct, 20);
}

// The rule of sampler.h written plainly: every finite candidate sorted (logit desc, id
// asc), top-k, top-p, min-p, then one walk of counter_uniform(seed, position) * sum.
int32_t full_sort_walk(const std::vector<float>& l, const SamplingParams& p, uint64_t position) {
    std::vector<int32_t> order;
    for (int32_t t = 0; t < static_cast<int32_t>(l.size()); ++t) {
        if (std::isfinite(l[t])) order.push_back(t);
    }
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    size_t n = order.size();
    if (p.top_k > 0) n = std::min(n, static_cast<size_t>(p.top_k));
    std::vector<double> pr(n);
    for (size_t i = 0; i < n; ++i) pr[i] = std::exp((l[order[i]] - l[order[0]]) / p.temperature);
    double sum = 0;
    if (n < order.size()) {
        sum = std::accumulate(pr.begin(), pr.end(), 0.0);
    } else {  // id order
        std::vector<double> by_id(l.size(), 0.0);
        for (size_t i = 0; i < n; ++i) by_id[order[i]] = pr[i];
        for (int32_t t = 0; t < static_cast<int32_t>(l.size()); ++t) {
            if (std::isfinite(l[t])) sum += by_id[t];
        }
    }
    const size_t all = n;
    double acc = 0;
    for (size_t i = 0; i < n && p.top_p < 1.0; ++i) {
        acc += pr[i] / sum;
        if (acc >= p.top_p) {
            n = i + 1;
            break;
        }
    }
    if (p.min_p > 0.0) {
        size_t keep = 1;
        while (keep < n && pr[keep] >= p.min_p) ++keep;
        n = keep;
    }
    if (n != all) sum = std::accumulate(pr.begin(), pr.begin() + static_cast<long>(n), 0.0);
    double u = counter_uniform(p.seed, position) * sum;
    int32_t token = -1;
    for (size_t i = 0; i < n; ++i) {
        token = order[i];
        u -= pr[i];
        if (u < 0) break;
    }
    return token;
}

// The sampler sorts only as far as the draw walks: the same tokens as the full sort, on
// rows with ties, -inf entries, peaked and flat logits, under every filter.
TEST(SamplerTest, LazyOrderGivesTheFullSortWalk) {
    std::mt19937 rng(11);
    Sampler s;
    for (int trial = 0; trial < 60; ++trial) {
        std::vector<float> l(3000);
        std::normal_distribution<float> nd(0.0f, 0.2f + static_cast<float>(trial % 6));
        for (auto& x : l) x = std::round(nd(rng) * 8.0f) / 8.0f;  // many ties
        if (trial % 3 == 0) {
            for (size_t i = 0; i < l.size(); i += 5) l[i] = -INFINITY;
        }
        SamplingParams p;
        p.temperature = 0.3 + 0.4 * (trial % 4);
        p.seed = static_cast<uint64_t>(trial);
        p.top_k = trial % 5 == 1 ? 50 : 0;
        p.top_p = trial % 5 == 2 || trial % 5 == 4 ? 0.85 : 1.0;
        p.min_p = trial % 5 == 3 ? 0.02 : 0.0;
        for (uint64_t pos = 0; pos < 40; ++pos) {
            ASSERT_EQ(s.sample(l, p, SampleContext{}, pos).token, full_sort_walk(l, p, pos))
                << "trial " << trial << " position " << pos;
        }
    }
}

TEST(SamplerTest, DistributionMatchesSoftmax) {
    std::vector<float> l = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
    SamplingParams p;
    p.temperature = 1.0;
    p.seed = 5;
    int ones = 0;
    const int n = 20000;
    for (int pos = 0; pos < n; ++pos) ones += sample_token(l, p, static_cast<uint64_t>(pos)) == 1;
    EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.015);
}

// The speculative rejection rule (issue 24): with a fixed draft, the sampled token is
// distributed as the target (temperature, top-k applied): the total-variation distance
// to the target shrinks with the sample count (10 -> 100,000), while the distances to
// wrong references (the draft alone, uniform, a hotter temperature) stay large; the
// draft is accepted with its target probability; each (seed, position) gives one token.
TEST(SamplerTest, RejectionRuleKeepsTheTargetDistribution) {
    const std::vector<float> l = {1.0f, 0.2f, -0.5f, 2.0f, 0.7f, -3.0f};
    SamplingParams p;
    p.temperature = 0.8;
    p.top_k = 5;  // id 5 is filtered out
    p.seed = 123;
    // The target, and a wrong one: the same logits at temperature 1.5.
    std::vector<double> target(6, 0.0), hotter(6, 0.0);
    double z = 0, zh = 0;
    for (int i = 0; i < 5; ++i) {
        target[static_cast<size_t>(i)] = std::exp(l[static_cast<size_t>(i)] / p.temperature);
        hotter[static_cast<size_t>(i)] = std::exp(l[static_cast<size_t>(i)] / 1.5);
        z += target[static_cast<size_t>(i)];
        zh += hotter[static_cast<size_t>(i)];
    }
    for (double& t : target) t /= z;
    for (double& t : hotter) t /= zh;
    const std::vector<double> draft_only = {0, 0, 0, 0, 1, 0};
    const std::vector<double> uniform(6, 1.0 / 6);
    auto tv = [](const std::vector<double>& a, const std::vector<double>& b) {
        double d = 0;
        for (size_t i = 0; i < a.size(); ++i) d += std::abs(a[i] - b[i]);
        return d / 2;
    };
    Sampler s;
    std::vector<double> counts(6, 0.0);
    int64_t accepted = 0;
    std::vector<double> tv_at;
    int64_t n = 0;
    for (int64_t target_n : {10, 100, 1000, 10000, 100000}) {
        for (; n < target_n; ++n) {
            DraftCheck d{4};
            const int32_t t = s.sample(l, p, SampleContext{}, static_cast<uint64_t>(n), &d).token;
            ASSERT_TRUE(t >= 0 && t < 5) << t;
            EXPECT_EQ(d.accepted, t == 4);
            counts[static_cast<size_t>(t)] += 1;
            accepted += d.accepted;
        }
        std::vector<double> emp(6);
        for (size_t i = 0; i < 6; ++i) emp[i] = counts[i] / static_cast<double>(n);
        tv_at.push_back(tv(emp, target));
        if (n >= 1000) {
            EXPECT_GT(tv(emp, draft_only), 0.5);
            EXPECT_GT(tv(emp, uniform), 0.15);
            EXPECT_GT(tv(emp, hotter), 0.1);
        }
    }
    EXPECT_LT(tv_at.back(), 0.01);
    EXPECT_LT(tv_at.back(), tv_at[0]);
    EXPECT_LT(tv_at[4], tv_at[2]);
    EXPECT_NEAR(static_cast<double>(accepted) / static_cast<double>(n), target[4], 0.01);
    // Deterministic per (seed, position); a draft the filters removed is never accepted.
    for (uint64_t pos = 0; pos < 100; ++pos) {
        DraftCheck a{4}, b{4}, gone{5};
        EXPECT_EQ(s.sample(l, p, SampleContext{}, pos, &a).token,
                  s.sample(l, p, SampleContext{}, pos, &b).token);
        EXPECT_NE(s.sample(l, p, SampleContext{}, pos, &gone).token, 5);
        EXPECT_FALSE(gone.accepted);
    }
    // Greedy: the argmax, whatever the draft.
    SamplingParams g;
    DraftCheck d{4};
    EXPECT_EQ(s.sample(l, g, SampleContext{}, 0, &d).token, 3);
}

TEST(SamplerTest, TopKAndTopPRestrict) {
    std::vector<float> l = {5.0f, 4.9f, 0.0f, -1.0f};
    SamplingParams p;
    p.temperature = 10.0;
    p.top_k = 2;
    for (uint64_t pos = 0; pos < 500; ++pos) EXPECT_LT(sample_token(l, p, pos), 2);
    p.top_k = 0;
    p.top_p = 0.01;
    for (uint64_t pos = 0; pos < 100; ++pos) EXPECT_EQ(sample_token(l, p, pos), 0);
}

TEST(SamplerTest, ValidatesParams) {
    SamplingParams p;
    p.temperature = -1;
    EXPECT_EQ(validate_sampling(p).code(), StatusCode::kInvalidArgument);
    p = {};
    p.top_p = 0;
    EXPECT_FALSE(validate_sampling(p).is_ok());
    p = {};
    p.top_k = -3;
    EXPECT_FALSE(validate_sampling(p).is_ok());
    EXPECT_TRUE(validate_sampling(SamplingParams{}).is_ok());
}

TEST(SamplerTest, ValidatesExtendedParams) {
    auto bad = [](auto mutate) {
        SamplingParams p;
        mutate(p);
        return validate_sampling(p, 100).code() == StatusCode::kInvalidArgument;
    };
    EXPECT_TRUE(bad([](SamplingParams& p) { p.min_p = 1.5; }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.repetition_penalty = 0; }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.frequency_penalty = 3; }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.presence_penalty = std::nan(""); }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.max_tokens = 0; }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.min_tokens = 20; }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.logprobs = 21; }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.n = 0; }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.logit_bias = {{1, 101.0f}}; }));
    EXPECT_TRUE(bad([](SamplingParams& p) { p.stop_token_ids = {-1}; }));
}

TEST(SamplerTest, LogitBiasAndPenaltiesChangeGreedyChoice) {
    std::vector<float> l = {1.0f, 2.0f, 1.5f};
    Sampler s;
    SamplingParams p;
    EXPECT_EQ(s.sample(l, p, {}, 0).token, 1);
    p.logit_bias = {{0, 5.0f}};
    EXPECT_EQ(s.sample(l, p, {}, 0).token, 0);
    p = {};
    std::vector<int32_t> out = {1, 1};
    p.frequency_penalty = 0.3;  // 2.0 - 0.6 = 1.4 < 1.5
    EXPECT_EQ(s.sample(l, p, {{}, out}, 0).token, 2);
    p = {};
    p.presence_penalty = 0.6;  // once: 2.0 - 0.6 = 1.4
    EXPECT_EQ(s.sample(l, p, {{}, std::span<const int32_t>(out).first(1)}, 0).token, 2);
    p = {};
    p.repetition_penalty = 2.0;  // prompt holds 1: 2.0 / 2 = 1.0 < 1.5
    std::vector<int32_t> prompt = {1};
    EXPECT_EQ(s.sample(l, p, {prompt, {}}, 0).token, 2);
}

TEST(SamplerTest, MinTokensBlocksEosAndStopIds) {
    std::vector<float> l = {0.0f, 9.0f, 8.0f, 1.0f};  // eos = 1 is best, stop id 2 next
    Sampler s;
    SamplingParams p;
    p.max_tokens = 10;
    p.min_tokens = 2;
    p.stop_token_ids = {2};
    std::vector<int32_t> out = {3};
    SampleContext ctx{{}, out, /*eos_id=*/1, nullptr};
    EXPECT_EQ(s.sample(l, p, ctx, 0).token, 3);
    out = {3, 3};
    ctx.output = out;
    EXPECT_EQ(s.sample(l, p, ctx, 0).token, 1);
}

class EvenOnly : public TokenMaskProvider {
public:
    void fill(std::span<const int32_t> output, TokenMask& allowed) override {
        seen = output.size();
        for (int32_t i = 1; i < allowed.size(); i += 2) allowed.set(i, false);
    }
    size_t seen = 0;
};

TEST(SamplerTest, MaskHookRestrictsEveryMode) {
    std::vector<float> l(130);
    for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(i % 2 ? 10 : 0) + 0.01f * i;
    EvenOnly mask;
    Sampler s;
    std::vector<int32_t> out = {4, 6};
    SamplingParams p;
    SampleContext ctx{{}, out, -1, &mask};
    EXPECT_EQ(s.sample(l, p, ctx, 0).token, 128);
    EXPECT_EQ(mask.seen, 2u);
    p.temperature = 5.0;
    for (uint64_t pos = 0; pos < 200; ++pos) EXPECT_EQ(s.sample(l, p, ctx, pos).token % 2, 0);
    TokenMask m(130);
    m.set(129, false);
    EXPECT_FALSE(m.allowed(129));
    EXPECT_TRUE(m.allowed(128));
}

TEST(SamplerTest, NothingAllowedGivesMinusOne) {
    class None : public TokenMaskProvider {
        void fill(std::span<const int32_t>, TokenMask& a) override { a.reset(a.size(), false); }
    } none;
    std::vector<float> l = {1, 2, 3};
    Sampler s;
    EXPECT_EQ(s.sample(l, SamplingParams{}, {{}, {}, -1, &none}, 0).token, -1);
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
    std::vector<float> l = {5.0f, 4.8f, 0.0f, 0.0f};
    SamplingParams p;
    p.temperature = 1.0;
    p.min_p = 0.5;  // exp(-0.2) = 0.82 stays; exp(-5) does not
    for (uint64_t pos = 0; pos < 500; ++pos) EXPECT_LT(sample_token(l, p, pos), 2);
}

TEST(SamplerTest, LogprobsAreLogSoftmaxOfProcessedRow) {
    std::vector<float> l = {0.0f, std::log(3.0f), -100.0f};
    Sampler s;
    SamplingParams p;
    p.logprobs = 2;
    SampledToken t = s.sample(l, p, {}, 0);
    EXPECT_EQ(t.token, 1);
    EXPECT_NEAR(t.logprob, std::log(0.75), 1e-5);
    ASSERT_EQ(t.top_logprobs.size(), 2u);
    EXPECT_EQ(t.top_logprobs[0].first, 1);
    EXPECT_EQ(t.top_logprobs[1].first, 0);
    EXPECT_NEAR(t.top_logprobs[1].second, std::log(0.25), 1e-5);
}

TEST(SamplerTest, DerivedSeedsDiffer) {
    EXPECT_EQ(derive_seed(7, 0), 7u);
    EXPECT_NE(derive_seed(7, 1), derive_seed(7, 2));
    EXPECT_NE(derive_seed(7, 1), 7u);
}

}  // namespace
}  // namespace dsi
