// Speculative decoding (SPEC S-ENG-3, issue 24): draft sources behind one interface,
// and the settings that choose one.
//
// A Drafter proposes up to k tokens to follow a sequence's known tokens; the engine
// verifies them in one forward pass of the target (spec/verify.h decides which are
// accepted) and asks for new drafts after every step. Two sources:
//   - MtpDrafter (spec/mtp.h): the checkpoint's MTP layer applied recursively;
//   - NgramDrafter (spec/ngram.h): prompt lookup, no weights.
// Drafts only change speed: the acceptance rule makes the output the target's own.
//
// Thread model: a drafter is called by one thread at a time (the engine's worker).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kernels/kv_cache.h"

namespace dsi::spec {

inline constexpr int kMaxSpeculativeTokens = 16;

enum class Method : uint8_t { kNone, kMtp, kNgram };
const char* method_name(Method m);
// "none" / "off" / "" -> kNone, "mtp", "ngram"; else INVALID_ARGUMENT listing them.
Result<Method> parse_method(std::string_view name);

struct SpecConfig {
    Method method = Method::kNone;
    // Drafts per step (k). 0 with a method: the default (5, S-ENG-3).
    int num_tokens = 0;
    // Prompt lookup: the longest and shortest suffix matched (tokens).
    int ngram_max = 4;
    int ngram_min = 2;
    // DSpark variable-length verification (S-SPEC, spec/varlen.h; --spec-varlen,
    // DSINFER_ENABLE_MTP_VARLEN=1): each step verifies the prefix subset of the drafts
    // that maximises expected tokens per unit of step time.
    bool varlen = false;
    // Acceptance rule for temperature > 0 (spec/verify.h; --spec-acceptance):
    // exact (the output without speculation) or rejection (the same distribution).
    bool rejection = false;
    // MTP draft vocabulary (FR-Spec): a JSON file of token ids the MTP head drafts from
    // (spec/mtp.h parse_draft_vocab); "" = the whole vocabulary.
    std::string draft_vocab_path;

    bool enabled() const { return method != Method::kNone; }
    int k() const { return num_tokens > 0 ? num_tokens : 5; }
};

// INVALID_ARGUMENT for k < 0, k > kMaxSpeculativeTokens, bad n-gram bounds, k, varlen or
// a draft vocabulary set without a method (a draft vocabulary: without mtp); FAILED_PRECONDITION for MTP on a checkpoint without an MTP layer.
Status validate(const SpecConfig& config, bool model_has_mtp);

// What a drafter sees of one sequence after a step.
struct DraftInput {
    std::span<const int32_t> prompt;
    // Every token generated so far, the one sampled last (the next step's input)
    // included. prompt ++ output are the sequence's known tokens.
    std::span<const int32_t> output;
    // Drafters with uses_hidden(): the target's final-normed hidden states [rows,
    // hidden] of positions [hidden_pos, hidden_pos + rows) computed by the step, whose
    // next tokens are all known, and the sequence's KV (the MTP layer's rows).
    std::span<const float> hidden;
    int64_t hidden_pos = 0;
    KvCache* cache = nullptr;

    int64_t num_tokens() const { return static_cast<int64_t>(prompt.size() + output.size()); }
    int32_t token_at(int64_t pos) const {
        const int64_t p = static_cast<int64_t>(prompt.size());
        return pos < p ? prompt[static_cast<size_t>(pos)] : output[static_cast<size_t>(pos - p)];
    }
};

class Drafter {
public:
    virtual ~Drafter() = default;
    // Replaces `drafts` with at most k proposals for the positions after the last
    // known token. With uses_hidden() it is called for every step a sequence runs
    // (k = 0 after a prefill chunk that samples nothing: only its KV rows are written).
    virtual Status propose(const DraftInput& in, int k, std::vector<int32_t>& drafts) = 0;
    // The same for several sequences of one step (drafts[i] for in[i] with k[i]); a
    // drafter may batch them (MTP does). Each sequence's drafts are those propose()
    // gives it alone. `probs`, when not empty, receives for each sequence the
    // drafter's own probability of each draft (the MTP head's softmax at the drafted
    // token; empty when the drafter has none, as n-gram) — what variable-length
    // verification estimates acceptance from (spec/varlen.h). REQUIRES: the spans
    // have the same size (probs: or 0).
    virtual Status propose_batch(std::span<const DraftInput> in, std::span<const int> k,
                                 std::span<std::vector<int32_t>> drafts,
                                 std::span<std::vector<float>> probs);
    // True: needs the step's hidden states and KV (called after every step).
    virtual bool uses_hidden() const { return false; }
};

}  // namespace dsi::spec
