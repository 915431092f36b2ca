#include "spec/verify.h"

#include <algorithm>

#include "base/check.h"

namespace dsi::spec {

void verify_exact(Sampler& sampler, const VerifyInput& in, const SamplingParams& params,
                  std::vector<int32_t>& output, Verified& out) {
    const size_t V = static_cast<size_t>(in.vocab);
    DSI_CHECK_EQ(in.rows.size(), (in.drafts.size() + 1) * V);
    out.tokens.clear();
    out.accepted = 0;
    for (size_t j = 0; j <= in.drafts.size(); ++j) {
        const SampleContext ctx{in.prompt, output, in.eos_id, in.mask};
        SampledToken t =
            sampler.sample(in.rows.subspan(j * V, V), params, ctx, in.first_position + j);
        const int32_t tok = t.token;
        out.tokens.push_back(std::move(t));
        if (tok < 0) return;
        output.push_back(tok);
        const bool ends = (tok == in.eos_id && !params.ignore_eos) ||
                          std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                                    tok) != params.stop_token_ids.end();
        const bool match = j < in.drafts.size() && tok == in.drafts[j];
        if (match) ++out.accepted;
        if (ends || !match) return;
    }
}

}  // namespace dsi::spec
