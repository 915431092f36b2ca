#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "model/synthetic.h"
#include "spec/drafter.h"
#include "spec/mtp.h"
#include "spec/ngram.h"
#include "spec/verify.h"

namespace dsi::spec {
namespace {

TEST(SpecConfigTest, ParsesMethodsAndRejectsUnknown) {
    EXPECT_EQ(parse_method("mtp").value(), Method::kMtp);
    EXPECT_EQ(parse_method("ngram").value(), Method::kNgram);
    EXPECT_EQ(parse_method("none").value(), Method::kNone);
    EXPECT_EQ(parse_method("").value(), Method::kNone);
    Result<Method> bad = parse_method("eagle");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("eagle"), std::string::npos);
}

TEST(SpecConfigTest, ValidatesBounds) {
    SpecConfig c;
    c.method = Method::kNgram;
    c.num_tokens = 5;
    EXPECT_TRUE(validate(c, false).is_ok());
    c.num_tokens = -1;
    EXPECT_EQ(validate(c, true).code(), StatusCode::kInvalidArgument);
    c.num_tokens = kMaxSpeculativeTokens + 1;
    EXPECT_EQ(validate(c, true).code(), StatusCode::kInvalidArgument);
    c.num_tokens = kMaxSpeculativeTokens;
    EXPECT_TRUE(validate(c, true).is_ok());
    c.method = Method::kMtp;
    Status no_mtp = validate(c, false);
    EXPECT_EQ(no_mtp.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(no_mtp.message().find("MTP"), std::string::npos);
    c.method = Method::kNone;
    EXPECT_EQ(validate(c, true).code(), StatusCode::kInvalidArgument);  // k without a method
    c.num_tokens = 0;
    EXPECT_TRUE(validate(c, false).is_ok());
    c.method = Method::kNgram;
    c.ngram_min = 3;
    c.ngram_max = 2;
    EXPECT_EQ(validate(c, true).code(), StatusCode::kInvalidArgument);
}

TEST(NgramDrafterTest, ProposesWhatFollowedTheMostRecentMatch) {
    NgramDrafter d(3, 1);
    std::vector<int32_t> out;
    // "7 8 9" occurred twice; the most recent is followed by 4 5.
    d.propose_tokens(std::vector<int32_t>{7, 8, 9, 1, 2, 7, 8, 9, 4, 5, 6, 7, 8, 9}, 2, out);
    EXPECT_EQ(out, (std::vector<int32_t>{4, 5}));
    // k larger than what follows: stops at the end of the known tokens.
    d.propose_tokens(std::vector<int32_t>{1, 2, 3, 1, 2}, 8, out);
    EXPECT_EQ(out, (std::vector<int32_t>{3, 1, 2}));
    // The longest suffix wins over a more recent shorter one.
    d.propose_tokens(std::vector<int32_t>{5, 6, 10, 9, 6, 11, 5, 6}, 1, out);
    EXPECT_EQ(out, (std::vector<int32_t>{10}));
}

TEST(NgramDrafterTest, NothingWithoutAMatchOrBudget) {
    NgramDrafter d(4, 2);
    std::vector<int32_t> out = {99};
    d.propose_tokens(std::vector<int32_t>{1, 2, 3, 4, 5}, 4, out);
    EXPECT_TRUE(out.empty());
    d.propose_tokens(std::vector<int32_t>{1, 2, 1, 2}, 0, out);
    EXPECT_TRUE(out.empty());
    d.propose_tokens(std::vector<int32_t>{1}, 3, out);
    EXPECT_TRUE(out.empty());
    // Through the Drafter interface: prompt ++ output.
    std::vector<int32_t> prompt = {4, 5, 6, 7}, output = {4, 5};
    DraftInput in;
    in.prompt = prompt;
    in.output = output;
    ASSERT_TRUE(d.propose(in, 3, out).is_ok());
    EXPECT_EQ(out, (std::vector<int32_t>{6, 7, 4}));
}

std::vector<float> random_rows(int rows, int vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 2.0f);
    std::vector<float> v(static_cast<size_t>(rows * vocab));
    for (float& x : v) x = n(rng);
    return v;
}

// The tokens sampling would give one position at a time without speculation.
std::vector<int32_t> sequential(const std::vector<float>& rows, int vocab, int n,
                                const SamplingParams& p, std::vector<int32_t> output, uint64_t pos,
                                TokenMaskProvider* mask = nullptr) {
    Sampler s;
    std::vector<int32_t> got;
    for (int j = 0; j < n; ++j) {
        SampleContext ctx{{}, output, -1, mask};
        const int32_t t = s.sample(std::span<const float>(rows).subspan(
                                       static_cast<size_t>(j * vocab), static_cast<size_t>(vocab)),
                                   p, ctx, pos + j)
                              .token;
        got.push_back(t);
        output.push_back(t);
    }
    return got;
}

TEST(VerifyExactTest, OracleDraftsAllAcceptedPlusBonusGreedyAndSeeded) {
    const int V = 50, k = 4;
    const std::vector<float> rows = random_rows(k + 1, V, 3);
    for (double temp : {0.0, 0.9}) {
        SamplingParams p;
        p.temperature = temp;
        p.seed = 77;
        p.repetition_penalty = 1.3;  // context-dependent: drafts must enter the context
        const std::vector<int32_t> want = sequential(rows, V, k + 1, p, {1, 2}, 10);
        std::vector<int32_t> drafts(want.begin(), want.begin() + k);
        Sampler s;
        std::vector<int32_t> output = {1, 2};
        Verified v;
        verify_exact(s, {rows, V, drafts, 10, {}, -1, nullptr}, p, output, v);
        EXPECT_EQ(v.accepted, k);
        ASSERT_EQ(v.tokens.size(), static_cast<size_t>(k + 1));
        for (int j = 0; j <= k; ++j) EXPECT_EQ(v.tokens[j].token, want[j]);
        EXPECT_EQ(output,
                  (std::vector<int32_t>{1, 2, want[0], want[1], want[2], want[3], want[4]}));
    }
}

TEST(VerifyExactTest, FirstMismatchIsReplacedByTheTargetsToken) {
    const int V = 50, k = 4;
    const std::vector<float> rows = random_rows(k + 1, V, 4);
    SamplingParams p;
    p.temperature = 1.0;
    p.seed = 5;
    const std::vector<int32_t> want = sequential(rows, V, k + 1, p, {}, 0);
    for (int bad = 0; bad < k; ++bad) {
        std::vector<int32_t> drafts(want.begin(), want.begin() + k);
        drafts[bad] = (drafts[bad] + 1) % V;
        Sampler s;
        std::vector<int32_t> output;
        Verified v;
        verify_exact(s, {rows, V, drafts, 0, {}, -1, nullptr}, p, output, v);
        EXPECT_EQ(v.accepted, bad);
        ASSERT_EQ(v.tokens.size(), static_cast<size_t>(bad + 1));
        EXPECT_EQ(v.tokens.back().token, want[bad]);
        EXPECT_EQ(output, std::vector<int32_t>(want.begin(), want.begin() + bad + 1));
    }
}

TEST(VerifyExactTest, StopsAtEosAndAtAMaskThatAllowsNothing) {
    const int V = 20;
    std::vector<float> rows(static_cast<size_t>(3 * V), 0.0f);
    rows[0 * V + 3] = 5.0f;
    rows[1 * V + 1] = 5.0f;  // EOS (id 1) at the second position
    rows[2 * V + 7] = 5.0f;
    const std::vector<int32_t> drafts = {3, 1};
    Sampler s;
    std::vector<int32_t> output;
    Verified v;
    verify_exact(s, {rows, V, drafts, 0, {}, 1, nullptr}, SamplingParams{}, output, v);
    ASSERT_EQ(v.tokens.size(), 2u);
    EXPECT_EQ(v.accepted, 2);
    EXPECT_EQ(output, (std::vector<int32_t>{3, 1}));

    struct Nothing : TokenMaskProvider {
        int calls = 0;
        std::vector<size_t> lengths;
        void fill(std::span<const int32_t> out, TokenMask& m) override {
            lengths.push_back(out.size());
            if (++calls == 2) m.reset(m.size(), false);
        }
    } mask;
    output.clear();
    verify_exact(s, {rows, V, drafts, 0, {}, -1, &mask}, SamplingParams{}, output, v);
    ASSERT_EQ(v.tokens.size(), 2u);
    EXPECT_EQ(v.tokens[1].token, -1);
    EXPECT_EQ(v.accepted, 1);
    EXPECT_EQ(output, (std::vector<int32_t>{3}));
    // The mask saw the accepted draft in the output of the second position.
    EXPECT_EQ(mask.lengths, (std::vector<size_t>{0, 1}));
}

class MtpDrafterTest : public ::testing::Test {
protected:
    void SetUp() override {
        ModelConfig c = synthetic_preset("tiny-v3").value();
        c.vocab_size = 512;
        model_ = DeepseekModel::load(synthetic_memory_model(c, 99), {1}).value();
    }
    std::unique_ptr<DeepseekModel> model_;
};

TEST_F(MtpDrafterTest, FirstDraftIsTheMtpHeadAndRecursionFollowsItsOwnHidden) {
    const int64_t V = model_->config().vocab_size, H = model_->config().hidden_size;
    const std::vector<int32_t> prompt = {5, 17, 300, 42, 9, 77};
    const int64_t P = static_cast<int64_t>(prompt.size());
    // Engine-style: prefill, sample the first token, draft 3.
    auto cache = model_->new_kv_cache(64);
    ForwardOutput out;
    ASSERT_TRUE(model_->forward(prompt, 0, *cache, false, out).is_ok());
    const std::vector<int32_t> output = {argmax(out.logits)};
    MtpDrafter d(model_.get());
    DraftInput in;
    in.prompt = prompt;
    in.output = output;
    in.hidden = out.hidden;
    in.hidden_pos = 0;
    in.cache = cache.get();
    std::vector<int32_t> drafts;
    ASSERT_TRUE(d.propose(in, 3, drafts).is_ok());
    ASSERT_EQ(drafts.size(), 3u);

    // By hand on a fresh cache: the same catch-up, then the recursion.
    auto ref = model_->new_kv_cache(64);
    ForwardOutput o2;
    ASSERT_TRUE(model_->forward(prompt, 0, *ref, false, o2).is_ok());
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(output[0]);
    std::vector<float> logits, h;
    ASSERT_TRUE(model_->mtp_forward(next, o2.hidden, 0, *ref, logits, &h).is_ok());
    int32_t t = argmax(std::span<const float>(logits).subspan((P - 1) * V, V));
    EXPECT_EQ(drafts[0], t);
    for (int j = 1; j < 3; ++j) {
        std::vector<float> last(h.end() - H, h.end());
        ASSERT_TRUE(
            model_->mtp_forward(std::span<const int32_t>(&t, 1), last, P - 1 + j, *ref, logits, &h)
                .is_ok());
        t = argmax(logits);
        EXPECT_EQ(drafts[j], t) << j;
    }
    // logit_rows: the last rows of the full logits, bitwise; 0 gives none.
    auto again = model_->new_kv_cache(64);
    ASSERT_TRUE(model_->forward(prompt, 0, *again, false, o2).is_ok());
    std::vector<float> full, last_only;
    ASSERT_TRUE(model_->mtp_forward(next, o2.hidden, 0, *again, full).is_ok());
    ASSERT_TRUE(model_->mtp_forward(next, o2.hidden, 0, *again, last_only, nullptr, 2).is_ok());
    ASSERT_EQ(last_only.size(), static_cast<size_t>(2 * V));
    EXPECT_TRUE(std::equal(last_only.begin(), last_only.end(), full.end() - 2 * V));
    ASSERT_TRUE(model_->mtp_forward(next, o2.hidden, 0, *again, last_only, nullptr, 0).is_ok());
    EXPECT_TRUE(last_only.empty());
    // output_rows: the rows before the last write their KV rows only — bitwise the rows
    // of a full pass — and the last row's output and logits are bitwise the full pass's.
    {
        auto a = model_->new_kv_cache(64);
        auto b = model_->new_kv_cache(64);
        const MtpStep all{next, o2.hidden, 0, a.get(), 1};
        const MtpStep last_row{next, o2.hidden, 0, b.get(), 1, 1};
        MtpBatchOutput ra, rb;
        ASSERT_TRUE(model_->mtp_forward_batch(std::span<const MtpStep>(&all, 1), ra).is_ok());
        ASSERT_TRUE(model_->mtp_forward_batch(std::span<const MtpStep>(&last_row, 1), rb).is_ok());
        EXPECT_EQ(ra.logits, rb.logits);
        EXPECT_TRUE(std::equal(ra.hidden.end() - H, ra.hidden.end(), rb.hidden.end() - H));
        const int64_t mtp_layer = model_->config().num_hidden_layers;
        const int64_t W = model_->kv_row_floats();
        for (int64_t pos = 0; pos < P; ++pos) {
            EXPECT_TRUE(std::equal(a->row(mtp_layer, pos), a->row(mtp_layer, pos) + W,
                                   b->row(mtp_layer, pos)))
                << pos;
        }
        // None: KV rows only, no logits; the rows are the same.
        auto c = model_->new_kv_cache(64);
        const MtpStep none{next, o2.hidden, 0, c.get(), 0, 0};
        MtpBatchOutput rc;
        ASSERT_TRUE(model_->mtp_forward_batch(std::span<const MtpStep>(&none, 1), rc).is_ok());
        EXPECT_TRUE(rc.logits.empty());
        for (int64_t pos = 0; pos < P; ++pos) {
            EXPECT_TRUE(std::equal(a->row(mtp_layer, pos), a->row(mtp_layer, pos) + W,
                                   c->row(mtp_layer, pos)))
                << pos;
        }
    }
    // k = 0 writes the KV rows only; an unknown next token is an error, not a crash.
    ASSERT_TRUE(d.propose(in, 0, drafts).is_ok());
    EXPECT_TRUE(drafts.empty());
    in.output = {};
    EXPECT_FALSE(d.propose(in, 2, drafts).is_ok());
}

// A draft vocabulary (FR-Spec): the restricted head scores exactly the full head's
// logits of its ids; over every id it drafts what the full head drafts; over a subset
// only ids of the subset; the probabilities are the softmax at the drafted token.
TEST_F(MtpDrafterTest, DraftHeadScoresItsIdsAsTheFullHeadAndGivesProbabilities) {
    const int64_t V = model_->config().vocab_size;
    const std::vector<int32_t> prompt = {5, 17, 300, 42, 9, 77};
    auto run = [&](std::shared_ptr<const MtpDraftHead> head, std::vector<int32_t>& drafts,
                   std::vector<float>& probs) {
        auto cache = model_->new_kv_cache(64);
        ForwardOutput out;
        ASSERT_TRUE(model_->forward(prompt, 0, *cache, false, out).is_ok());
        const std::vector<int32_t> output = {argmax(out.logits)};
        MtpDrafter d(model_.get(), std::move(head));
        DraftInput in{prompt, output, out.hidden, 0, cache.get()};
        std::vector<std::vector<int32_t>> dr(1);
        std::vector<std::vector<float>> pr(1);
        const int k = 4;
        ASSERT_TRUE(d.propose_batch(std::span<const DraftInput>(&in, 1),
                                    std::span<const int>(&k, 1), dr, pr)
                        .is_ok());
        drafts = dr[0];
        probs = pr[0];
    };
    std::vector<int32_t> all_ids(static_cast<size_t>(V)), odd;
    std::iota(all_ids.begin(), all_ids.end(), 0);
    for (int32_t t = 1; t < V; t += 2) odd.push_back(t);
    std::vector<int32_t> full, everything, sub;
    std::vector<float> pf, pe, ps;
    run(nullptr, full, pf);
    run(std::shared_ptr<const MtpDraftHead>(model_->make_mtp_draft_head(all_ids).value()),
        everything, pe);
    auto odd_head = std::shared_ptr<const MtpDraftHead>(model_->make_mtp_draft_head(odd).value());
    run(odd_head, sub, ps);
    ASSERT_EQ(full.size(), 4u);
    EXPECT_EQ(everything, full);
    EXPECT_EQ(pe, pf);
    ASSERT_EQ(sub.size(), 4u);
    for (int32_t t : sub) EXPECT_EQ(t % 2, 1) << t;
    for (float p : ps) EXPECT_TRUE(p > 0.0f && p <= 1.0f) << p;

    // Logits of the restricted head = the full head's columns of its ids.
    auto cache = model_->new_kv_cache(64);
    ForwardOutput out;
    ASSERT_TRUE(model_->forward(prompt, 0, *cache, false, out).is_ok());
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(argmax(out.logits));
    MtpStep step{next, out.hidden, 0, cache.get(), 1};
    MtpBatchOutput a, b;
    ASSERT_TRUE(model_->mtp_forward_batch(std::span<const MtpStep>(&step, 1), a).is_ok());
    ASSERT_TRUE(
        model_->mtp_forward_batch(std::span<const MtpStep>(&step, 1), b, odd_head.get()).is_ok());
    ASSERT_EQ(b.logits.size(), odd.size());
    for (size_t c = 0; c < odd.size(); ++c) EXPECT_EQ(b.logits[c], a.logits[static_cast<size_t>(odd[c])]);
    // The first draft's probability is the softmax of the full row at the draft.
    double sum = 0;
    const float top = a.logits[static_cast<size_t>(full[0])];
    for (float v : a.logits) sum += std::exp(static_cast<double>(v - top));
    EXPECT_NEAR(pf[0], 1.0 / sum, 1e-6);

    // Bad vocabularies.
    EXPECT_FALSE(model_->make_mtp_draft_head(std::vector<int32_t>{}).is_ok());
    EXPECT_FALSE(model_->make_mtp_draft_head(std::vector<int32_t>{3, 3}).is_ok());
    EXPECT_FALSE(model_->make_mtp_draft_head(std::vector<int32_t>{5, 2}).is_ok());
    EXPECT_FALSE(model_->make_mtp_draft_head(std::vector<int32_t>{-1}).is_ok());
    EXPECT_FALSE(model_->make_mtp_draft_head(std::vector<int32_t>{static_cast<int32_t>(V)}).is_ok());
}

// Batched drafting (one MTP pass per depth for all sequences) gives each sequence the
// drafts it gets alone.
TEST_F(MtpDrafterTest, BatchedDraftsEqualDraftsAlone) {
    const std::vector<std::vector<int32_t>> prompts = {
        {5, 17, 300, 42, 9, 77}, {8, 8, 1, 400, 3}, {100, 200, 300, 400, 500, 11, 12, 13}};
    const std::vector<int> ks = {3, 0, 5};
    auto prefill = [&](const std::vector<int32_t>& p, std::unique_ptr<KvCache>& cache,
                       ForwardOutput& out, std::vector<int32_t>& output) {
        cache = model_->new_kv_cache(64);
        ASSERT_TRUE(model_->forward(p, 0, *cache, false, out).is_ok());
        output = {argmax(out.logits)};
    };
    std::vector<std::unique_ptr<KvCache>> caches(3), alone_caches(3);
    std::vector<ForwardOutput> outs(3);
    std::vector<std::vector<int32_t>> outputs(3), alone(3), batched(3);
    std::vector<DraftInput> in(3);
    MtpDrafter d(model_.get());
    for (size_t i = 0; i < 3; ++i) {
        prefill(prompts[i], alone_caches[i], outs[i], outputs[i]);
        DraftInput one{prompts[i], outputs[i], outs[i].hidden, 0, alone_caches[i].get()};
        ASSERT_TRUE(d.propose(one, ks[i], alone[i]).is_ok());
        EXPECT_EQ(alone[i].size(), static_cast<size_t>(ks[i]));
        prefill(prompts[i], caches[i], outs[i], outputs[i]);
        in[i] = {prompts[i], outputs[i], outs[i].hidden, 0, caches[i].get()};
    }
    ASSERT_TRUE(d.propose_batch(in, ks, batched, {}).is_ok());
    EXPECT_EQ(batched, alone);
}

}  // namespace
}  // namespace dsi::spec
