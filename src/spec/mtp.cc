#include "spec/mtp.h"

#include <cmath>

#include "base/check.h"
#include "sampling/sampler.h"

namespace dsi::spec {

MtpDrafter::MtpDrafter(DeepseekModel* model, std::shared_ptr<const MtpDraftHead> head)
    : model_(model), head_(std::move(head)), hidden_size_(model->config().hidden_size) {}

Status MtpDrafter::propose(const DraftInput& in, int k, std::vector<int32_t>& drafts) {
    return propose_batch(std::span<const DraftInput>(&in, 1), std::span<const int>(&k, 1),
                         std::span<std::vector<int32_t>>(&drafts, 1), {});
}

int32_t MtpDrafter::pick(std::span<const float> row, float* prob) const {
    const int32_t best = argmax(row);
    if (prob != nullptr) {
        const float top = row[static_cast<size_t>(best)];
        double sum = 0;
        for (float v : row) sum += std::exp(static_cast<double>(v - top));
        *prob = static_cast<float>(1.0 / sum);
    }
    return head_ != nullptr ? head_->ids()[static_cast<size_t>(best)] : best;
}

Status MtpDrafter::propose_batch(std::span<const DraftInput> in, std::span<const int> k,
                                 std::span<std::vector<int32_t>> drafts,
                                 std::span<std::vector<float>> probs) {
    const int64_t H = hidden_size_;
    const int64_t V = head_ != nullptr ? static_cast<int64_t>(head_->ids().size())
                                       : model_->config().vocab_size;
    const MtpDraftHead* head = head_.get();
    const bool want_probs = !probs.empty();
    // Catch-up: the MTP layer's KV rows for every sequence's new positions; the last
    // row's logits draft the first token (none after a plain prefill chunk, k = 0).
    steps_.clear();
    seq_of_step_.clear();
    last_hidden_.clear();
    size_t num_next = 0;
    for (size_t i = 0; i < in.size(); ++i) {
        num_next += in[i].hidden.size() / static_cast<size_t>(H);
    }
    next_.resize(num_next);  // reserved up front: steps_ hold spans into it
    size_t at = 0;
    for (size_t i = 0; i < in.size(); ++i) {
        drafts[i].clear();
        if (want_probs) probs[i].clear();
        const DraftInput& d = in[i];
        const int64_t rows = static_cast<int64_t>(d.hidden.size()) / H;
        if (rows == 0 || d.cache == nullptr) continue;
        if (d.hidden_pos + rows >= d.num_tokens()) {
            return internal_error("mtp drafter: the token after position " +
                                  std::to_string(d.hidden_pos + rows - 1) + " is not known");
        }
        for (int64_t r = 0; r < rows; ++r) next_[at + r] = d.token_at(d.hidden_pos + 1 + r);
        // Only the last row drafts: the rows before it need their KV rows alone.
        const int64_t out_rows = k[i] > 0 ? 1 : 0;
        steps_.push_back({std::span<const int32_t>(next_).subspan(at, rows), d.hidden, d.hidden_pos,
                          d.cache, out_rows, out_rows});
        seq_of_step_.push_back(i);
        at += static_cast<size_t>(rows);
    }
    if (steps_.empty()) return Status::ok();
    DSI_RETURN_IF_ERROR(model_->mtp_forward_batch(steps_, out_, head));
    // Per drafting sequence: its position, the hidden row and token that feed the next
    // depth.
    struct Live {
        size_t seq;
        int64_t pos;
        int32_t draft;
    };
    std::vector<Live> live;
    int64_t hidden_row = 0;
    for (size_t s = 0; s < steps_.size(); ++s) {
        const size_t i = seq_of_step_[s];
        hidden_row += static_cast<int64_t>(steps_[s].next_tokens.size());
        if (k[i] <= 0) continue;
        const std::span<const float> row =
            std::span<const float>(out_.logits)
                .subspan(static_cast<size_t>(out_.logit_row[s] * V), static_cast<size_t>(V));
        float p = 0;
        const int32_t draft = pick(row, want_probs ? &p : nullptr);
        drafts[i].push_back(draft);
        if (want_probs) probs[i].push_back(p);
        live.push_back(
            {i, in[i].hidden_pos + static_cast<int64_t>(steps_[s].next_tokens.size()) - 1, draft});
        last_hidden_.insert(last_hidden_.end(), out_.hidden.begin() + (hidden_row - 1) * H,
                            out_.hidden.begin() + hidden_row * H);
    }
    // Recursion: depth j applies the layer to each sequence's own last MTP hidden state
    // and its previous draft, one row per sequence, all sequences in one pass.
    std::vector<float> hidden_in;
    for (int j = 1; !live.empty(); ++j) {
        hidden_in.swap(last_hidden_);
        last_hidden_.clear();
        steps_.clear();
        std::vector<Live> next_live;
        for (size_t l = 0; l < live.size(); ++l) {
            Live& v = live[l];
            ++v.pos;
            if (j >= k[v.seq] || v.pos >= in[v.seq].cache->capacity()) continue;
            steps_.push_back({std::span<const int32_t>(&v.draft, 1),
                              std::span<const float>(hidden_in).subspan(l * static_cast<size_t>(H),
                                                                        static_cast<size_t>(H)),
                              v.pos, in[v.seq].cache, 1});
            next_live.push_back(v);
        }
        if (steps_.empty()) break;
        DSI_RETURN_IF_ERROR(model_->mtp_forward_batch(steps_, out_, head));
        for (size_t s = 0; s < next_live.size(); ++s) {
            Live& v = next_live[s];
            float p = 0;
            v.draft = pick(std::span<const float>(out_.logits)
                               .subspan(static_cast<size_t>(out_.logit_row[s] * V),
                                        static_cast<size_t>(V)),
                           want_probs ? &p : nullptr);
            drafts[v.seq].push_back(v.draft);
            if (want_probs) probs[v.seq].push_back(p);
            last_hidden_.insert(last_hidden_.end(), out_.hidden.begin() + s * H,
                                out_.hidden.begin() + (s + 1) * H);
        }
        live = std::move(next_live);
    }
    last_hidden_.clear();
    return Status::ok();
}

}  // namespace dsi::spec
