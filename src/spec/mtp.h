// MTP drafting (DeepSeek V3 multi-token prediction, num_nextn_predict_layers = 1):
// after each step, the MTP layer runs over the positions the step computed (its KV
// rows for them; row i combines the target's hidden state at i with the embedding of
// the token at i + 1), and its last row drafts the token after the sequence's last
// known one. Further drafts apply the same layer recursively to its own output hidden
// state and the previous draft (as vLLM / SGLang do with one MTP layer). Drafts are
// greedy (argmax of the MTP head). Recursive rows it writes past the known tokens are
// rewritten by the next step's catch-up, which starts at the first position that
// step computes. Drafts stop early where the KV table ends (the next step grows it).
// Catch-up rows other than a drafting sequence's last write their KV rows only
// (MtpStep::output_rows): no attention, FFN or head for rows nothing drafts from.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "model/deepseek.h"
#include "spec/drafter.h"

namespace dsi::spec {

class MtpDrafter : public Drafter {
public:
    // REQUIRES: the model has an MTP layer and outlives the drafter. With `head`, drafts
    // come from the restricted draft vocabulary (argmax over head->ids(); the
    // probability is the softmax over those ids).
    explicit MtpDrafter(DeepseekModel* model, std::shared_ptr<const MtpDraftHead> head = nullptr);
    Status propose(const DraftInput& in, int k, std::vector<int32_t>& drafts) override;
    // One batched MTP pass per draft depth for all sequences (mtp_forward_batch).
    Status propose_batch(std::span<const DraftInput> in, std::span<const int> k,
                         std::span<std::vector<int32_t>> drafts,
                         std::span<std::vector<float>> probs) override;
    bool uses_hidden() const override { return true; }

private:
    // The drafted token of one logits row and its softmax probability.
    int32_t pick(std::span<const float> row, float* prob) const;

    DeepseekModel* model_;
    std::shared_ptr<const MtpDraftHead> head_;
    int64_t hidden_size_;
    std::vector<int32_t> next_;
    std::vector<MtpStep> steps_;
    std::vector<size_t> seq_of_step_;
    MtpBatchOutput out_;
    std::vector<float> last_hidden_;
};

}  // namespace dsi::spec
