#include "spec/verify.h"

#include <algorithm>
#include <string>

#include "base/check.h"

namespace dsi::spec {

const char* acceptance_name(Acceptance a) { return a == Acceptance::kExact ? "exact" : "rejection"; }

Result<Acceptance> parse_acceptance(std::string_view name) {
    if (name == "exact") return Acceptance::kExact;
    if (name == "rejection") return Acceptance::kRejection;
    return invalid_argument("speculative acceptance rule '" + std::string(name) +
                            "' is not one of exact, rejection");
}

void verify_exact(Sampler& sampler, const VerifyInput& in, const SamplingParams& params,
                  std::vector<int32_t>& output, Verified& out) {
    const size_t V = static_cast<size_t>(in.vocab);
    DSI_CHECK_EQ(in.rows.size(), (in.drafts.size() + 1) * V);
    out.tokens.clear();
    out.accepted = 0;
    for (size_t j = 0; j <= in.drafts.size(); ++j) {
        const SampleContext ctx{in.prompt, output, in.eos_id, in.mask};
        DraftCheck check{j < in.drafts.size() ? in.drafts[j] : -1};
        SampledToken t = sampler.sample(
            in.rows.subspan(j * V, V), params, ctx, in.first_position + j,
            in.rule == Acceptance::kRejection && j < in.drafts.size() ? &check : nullptr);
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
