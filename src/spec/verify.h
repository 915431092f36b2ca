// Acceptance of drafted tokens (issue 24, S-ENG-7).
//
// Exact rule (greedy and seeded sampling): the target samples each position in turn
// exactly as it would without speculation — the same processed logits row (batch- and
// chunk-invariant kernels), the same context (prompt + output so far, which includes
// the drafts accepted before it: penalties and grammar masks see them), the same draw
// counter_uniform(seed, position) — and a draft is accepted iff it equals that token.
// The first mismatch is replaced by the target's token; when every draft is accepted
// the last row gives one more (the bonus token). The emitted tokens are therefore the
// output without speculation, token for token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <string_view>

#include "base/status.h"
#include "sampling/sampler.h"

namespace dsi::spec {

struct Verified {
    // Emitted in order: the accepted drafts, then the target's own token (a token of
    // -1 means the grammar mask allowed nothing; nothing follows it).
    std::vector<SampledToken> tokens;
    int accepted = 0;  // drafts accepted
};

// Exact: the output without speculation, token for token (above). Rejection: the
// lossless rejection rule of sampling/sampler.h (DraftCheck): a draft is accepted with
// its probability under the target, a rejected position is drawn from the target with
// the draft removed; the same distribution as without speculation and the same tokens on
// every run and in every batch with fixed-length speculation (S-ENG-7), but not the
// tokens of a run without speculation. With deterministic drafts (greedy MTP, n-gram)
// both accept a draft with the same probability; greedy rows are identical.
enum class Acceptance : uint8_t { kExact, kRejection };
const char* acceptance_name(Acceptance a);
// "exact" / "rejection"; else INVALID_ARGUMENT.
Result<Acceptance> parse_acceptance(std::string_view name);

struct VerifyInput {
    std::span<const float> rows;  // [drafts + 1, vocab]: row j predicts position first_position + j
    int64_t vocab = 0;
    std::span<const int32_t> drafts;
    uint64_t first_position = 0;
    std::span<const int32_t> prompt;
    int32_t eos_id = -1;
    TokenMaskProvider* mask = nullptr;
    Acceptance rule = Acceptance::kExact;
};

// Appends every emitted token >= 0 to `output` (the sequence's generated tokens).
// Stops after a token that ends the sequence (EOS unless ignore_eos, a stop id).
// REQUIRES: rows.size() == (drafts.size() + 1) * vocab; validate_sampling(params) OK.
// (Named for the default rule; in.rule chooses.)
void verify_exact(Sampler& sampler, const VerifyInput& in, const SamplingParams& params,
                  std::vector<int32_t>& output, Verified& out);

}  // namespace dsi::spec
