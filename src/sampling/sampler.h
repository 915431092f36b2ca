// Token sampling from logits (SPEC S-ENG-7, ARCHITECTURE sampling/).
//
// Order of operations on one row of logits (a copy; the input is never changed):
//   1. logit_bias (added), 2. repetition penalty over prompt + output (HF/vLLM rule:
//   divide positive logits, multiply negative ones), frequency and presence penalties
//   over the output (OpenAI rule), 3. min_tokens: end-of-sequence and stop ids are
//   disallowed while output < min_tokens, 4. the structured-output mask (TokenMask,
//   filled by a TokenMaskProvider), 5. logprobs = log_softmax of this processed row,
//   6. greedy (temperature 0: argmax, ties to the lowest id), or temperature, then
//   top-k, top-p, min-p over candidates in a fixed order (logit desc, id asc), and
//   one draw from counter_uniform(seed, position) times the candidates' total (summed
//   in that order after a filter, in id order without one), walked in that order.
//   The order is built only as far as the walk goes (bench/sampler_bench).
// Randomness depends only on (seed, position), so a sequence's tokens never depend
// on what else ran. Stop strings are matched on text by StopMatcher (stop.h); stop
// ids, max_tokens and n are carried here and applied by the engine.
// Thread model: free functions are pure; a Sampler holds scratch buffers and is used
// by one thread at a time; a TokenMaskProvider is called on the thread that samples.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dsi {

inline constexpr int32_t kMaxTopLogprobs = 20;

struct SamplingParams {
    double temperature = 0.0;                           // 0: greedy
    int64_t top_k = 0;                                  // 0: off
    double top_p = 1.0;                                 // 1: off
    double min_p = 0.0;                                 // 0: off
    double repetition_penalty = 1.0;                    // 1: off; > 0
    double frequency_penalty = 0.0;                     // [-2, 2]
    double presence_penalty = 0.0;                      // [-2, 2]
    std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100])
    std::vector<int32_t> stop_token_ids;  // finish when sampled (the id is kept in output)
    std::vector<std::string> stop;        // finish when the text contains one (cut before it)
    bool ignore_eos = false;
    int64_t max_tokens = 16;  // >= 1
    int64_t min_tokens = 0;   // <= max_tokens
    int32_t logprobs = -1;    // -1: off; k >= 0: the sampled token's plus the top k
    int32_t n = 1;            // completions per request, each with seed derived from seed
    uint64_t seed = 0;
};

// INVALID_ARGUMENT naming the first bad field. With vocab_size > 0, token ids in
// logit_bias and stop_token_ids must be inside the vocabulary.
Status validate_sampling(const SamplingParams& params, int64_t vocab_size = 0);

// Index of the largest logit; ties go to the lowest index.
int32_t argmax(std::span<const float> logits);

// A uniform double in [0, 1) that depends only on (seed, position).
double counter_uniform(uint64_t seed, uint64_t position);

// The seed of completion `index` of a request with n > 1 (index 0 keeps `seed`).
uint64_t derive_seed(uint64_t seed, int32_t index);

// Which tokens may be sampled: one bit per vocabulary entry.
class TokenMask {
public:
    explicit TokenMask(int64_t vocab_size = 0) { reset(vocab_size, true); }
    void reset(int64_t vocab_size, bool allowed);
    int64_t size() const { return size_; }
    bool allowed(int32_t id) const {
        return (words_[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
    }
    void set(int32_t id, bool allowed);
    std::span<uint64_t> words() { return words_; }

private:
    int64_t size_ = 0;
    std::vector<uint64_t> words_;
};

// The structured-output hook (grammar/ implements it). fill() is called before each
// token is sampled, with the tokens generated so far, and narrows `allowed` (which
// arrives all-allowed). After a preemption `output` may be shorter than at the last
// call: the provider must answer for the output it is given.
class TokenMaskProvider {
public:
    virtual ~TokenMaskProvider() = default;
    virtual void fill(std::span<const int32_t> output, TokenMask& allowed) = 0;
    // The provider in a form another process rebuilds an equal one from (an --ep rank
    // that samples the request: engine/dp_front.h); "" when it cannot travel.
    virtual std::string portable_form() const { return {}; }
};

struct SampleContext {
    std::span<const int32_t> prompt;
    std::span<const int32_t> output;  // tokens generated so far
    int32_t eos_id = -1;              // disallowed before min_tokens (unless ignore_eos)
    TokenMaskProvider* mask = nullptr;
};

struct SampledToken {
    int32_t token = -1;  // -1: the mask allowed nothing
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top_logprobs;  // best first, ties by id
};

// Speculative decoding's lossless rejection rule for one deterministic draft (issue 24,
// spec/verify.h): the draft x is accepted with probability p(x) (draw
// counter_uniform(seed ^ kRejectionSalt, position)); when rejected, the token is drawn
// from p with x removed, renormalised (draw counter_uniform(seed, position)). The token
// is distributed exactly as p; the draws depend only on (seed, position).
inline constexpr uint64_t kRejectionSalt = 0x9e3779b97f4a7c15ULL;
struct DraftCheck {
    int32_t token = -1;     // the draft
    bool accepted = false;  // out: the draft was accepted
};

class Sampler {
public:
    // Samples the token at `position` (its index in the sequence). REQUIRES:
    // validate_sampling(params) is OK. With `draft` (temperature > 0), by the rejection
    // rule above instead of one plain draw; greedy rows take the argmax either way.
    SampledToken sample(std::span<const float> logits, const SamplingParams& params,
                        const SampleContext& context, uint64_t position,
                        DraftCheck* draft = nullptr);

private:
    std::vector<float> work_;
    std::vector<int32_t> order_;
    std::vector<double> probs_;
    std::vector<int32_t> counts_;
    TokenMask mask_;
};

// Plain sampling without context (no penalties, no mask). REQUIRES: valid params.
int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                     uint64_t position);

}  // namespace dsi
