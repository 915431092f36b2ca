#include "spec/drafter.h"

namespace dsi::spec {

const char* method_name(Method m) {
    switch (m) {
        case Method::kNone:
            return "none";
        case Method::kMtp:
            return "mtp";
        case Method::kNgram:
            return "ngram";
    }
    return "?";
}

Result<Method> parse_method(std::string_view name) {
    if (name.empty() || name == "none" || name == "off") return Method::kNone;
    if (name == "mtp") return Method::kMtp;
    if (name == "ngram") return Method::kNgram;
    return invalid_argument("speculative method '" + std::string(name) +
                            "' is not one of none, mtp, ngram");
}

Status Drafter::propose_batch(std::span<const DraftInput> in, std::span<const int> k,
                              std::span<std::vector<int32_t>> drafts,
                              std::span<std::vector<float>> probs) {
    for (size_t i = 0; i < in.size(); ++i) {
        DSI_RETURN_IF_ERROR(propose(in[i], k[i], drafts[i]));
        if (!probs.empty()) probs[i].clear();
    }
    return Status::ok();
}

Status validate(const SpecConfig& c, bool model_has_mtp) {
    if (c.num_tokens < 0 || c.num_tokens > kMaxSpeculativeTokens) {
        return invalid_argument("num_speculative_tokens must be in [0, " +
                                std::to_string(kMaxSpeculativeTokens) + "], got " +
                                std::to_string(c.num_tokens));
    }
    if (c.num_tokens > 0 && c.method == Method::kNone) {
        return invalid_argument("num_speculative_tokens " + std::to_string(c.num_tokens) +
                                " needs a speculative method (mtp or ngram)");
    }
    if (c.rejection && c.method == Method::kNone) {
        return invalid_argument("the rejection acceptance rule needs a speculative method (mtp or ngram)");
    }
    if (c.varlen && c.method == Method::kNone) {
        return invalid_argument("variable-length verification needs a speculative method (mtp or ngram)");
    }
    if (!c.draft_vocab_path.empty() && c.method != Method::kMtp) {
        return invalid_argument("a draft vocabulary (" + c.draft_vocab_path +
                                ") needs the mtp speculative method");
    }
    if (c.ngram_min < 1 || c.ngram_max < c.ngram_min) {
        return invalid_argument("ngram bounds must satisfy 1 <= min <= max, got min " +
                                std::to_string(c.ngram_min) + " max " +
                                std::to_string(c.ngram_max));
    }
    if (c.method == Method::kMtp && !model_has_mtp) {
        return failed_precondition(
            "speculative method mtp: the checkpoint has no MTP layer "
            "(num_nextn_predict_layers = 0 or its weights are missing); use ngram");
    }
    return Status::ok();
}

}  // namespace dsi::spec
