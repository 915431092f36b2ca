// Token sampling from logits: greedy, or temperature with top-k / top-p, driven by a
// counter-based random stream keyed by (seed, position) so a sequence's tokens never
// depend on what else ran (SPEC S-ENG-7). The engine issue extends this module
// (penalties, min-p, grammar masks). Thread model: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"

namespace dsi {

struct SamplingParams {
    double temperature = 0.0;  // 0: greedy
    int64_t top_k = 0;         // 0: off
    double top_p = 1.0;        // 1: off
    uint64_t seed = 0;
};

Status validate_sampling(const SamplingParams& params);

// Index of the largest logit; ties go to the lowest index.
int32_t argmax(std::span<const float> logits);

// A uniform double in [0, 1) that depends only on (seed, position).
double counter_uniform(uint64_t seed, uint64_t position);

// Samples one token for `position`. REQUIRES: validate_sampling(params) is OK.
int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                     uint64_t position);

}  // namespace dsi
