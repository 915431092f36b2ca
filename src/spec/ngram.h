// Prompt-lookup n-gram drafting (no weights): find the most recent earlier occurrence
// of the sequence's last n tokens (n from ngram_max down to ngram_min) and propose the
// tokens that followed it. Strong where the output copies its input (code edits,
// retrieval, quoting). Pure: the drafts depend on the known tokens only.
#pragma once

#include "spec/drafter.h"

namespace dsi::spec {

class NgramDrafter : public Drafter {
public:
    // REQUIRES: 1 <= min_n <= max_n.
    NgramDrafter(int max_n, int min_n);
    Status propose(const DraftInput& in, int k, std::vector<int32_t>& drafts) override;

    // The same on a plain token list (prompt ++ output).
    void propose_tokens(std::span<const int32_t> tokens, int k, std::vector<int32_t>& drafts) const;

private:
    int max_n_;
    int min_n_;
    std::vector<int32_t> context_;
};

}  // namespace dsi::spec
