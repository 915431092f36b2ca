// PrefillCostModel: the fitted quadratic cost of one prefill chunk, and the solver for
// the largest chunk that fits a time budget (SPEC S-LB).
//
//   cost_ns(q, c) = base_ns + per_q_ns*q + per_c_ns*c + per_qc_ns*q*c + per_qq_ns*q*q
//
// q = new tokens of the sequence in this step, c = tokens already computed (cache hit
// plus earlier chunks). The linear terms are the dense layers, q*c and q*q the attention
// against the prefix and within the chunk. The default coefficients describe one
// H800-class device (a setting, fitted per machine); the engine scheduler and the
// simulator share this header. Thread model: a value type, no state.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace dsi::engine {

// S-LB: a prefill step never takes more than this many new tokens of one sequence.
inline constexpr int64_t kMaxPrefillChunkTokens = 32768;

struct PrefillCostModel {
    // A step's fixed part: the engine's scheduler charges it once a step; the prefill LB
    // (router and simulator) prices each request with it, and the simulator also sizes
    // chunks with it per chunk (more conservative than the engine).
    double base_ns = 50'000.0;
    double per_q_ns = 150'000.0;   // dense + MoE per new token (~6.7K tokens/s)
    double per_c_ns = 1.0;         // reading one prefix token's KV
    double per_qc_ns = 1.2;        // attention: one new token against one prefix token
    double per_qq_ns = 0.6;        // attention inside the chunk (causal: half of q*q)

    // All coefficients finite and >= 0, so cost is monotone in q.
    Status validate() const;

    // REQUIRES: q >= 0, c >= 0. cost_ns(0, c) == 0: an empty chunk costs nothing.
    double cost_ns(int64_t q, int64_t c) const;

    // The largest q in [0, min(max_q, kMaxPrefillChunkTokens)] with cost_ns(q, c) <=
    // budget_ns; 0 when not even one token fits. REQUIRES: validate() is OK.
    int64_t max_chunk_tokens(double budget_ns, int64_t c, int64_t max_q) const;
};

}  // namespace dsi::engine
