#include "spec/ngram.h"

#include <algorithm>

#include "base/check.h"

namespace dsi::spec {

NgramDrafter::NgramDrafter(int max_n, int min_n) : max_n_(max_n), min_n_(min_n) {
    DSI_CHECK(min_n_ >= 1 && max_n_ >= min_n_);
}

Status NgramDrafter::propose(const DraftInput& in, int k, std::vector<int32_t>& drafts) {
    context_.assign(in.prompt.begin(), in.prompt.end());
    context_.insert(context_.end(), in.output.begin(), in.output.end());
    propose_tokens(context_, k, drafts);
    return Status::ok();
}

void NgramDrafter::propose_tokens(std::span<const int32_t> tokens, int k,
                                  std::vector<int32_t>& drafts) const {
    drafts.clear();
    const int64_t len = static_cast<int64_t>(tokens.size());
    if (k <= 0) return;
    for (int64_t n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
        const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(len - n));
        // Most recent earlier occurrence with at least one token after it.
        for (int64_t i = len - n - 1; i >= 0; --i) {
            if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
            const int64_t from = i + n;
            const int64_t to = std::min<int64_t>(from + k, len);
            drafts.assign(tokens.begin() + from, tokens.begin() + to);
            return;
        }
    }
}

}  // namespace dsi::spec
