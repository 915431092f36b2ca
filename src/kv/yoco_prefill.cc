#include "kv/yoco_prefill.h"

#include <string>

namespace dsi::kv {

Result<YocoTruncationMode> parse_yoco_truncation_mode(std::string_view name) {
    if (name == "compact") return YocoTruncationMode::kCompact;
    if (name == "off") return YocoTruncationMode::kOff;
    return invalid_argument("YOCO prefill truncation mode must be compact or off, got '" +
                            std::string(name) + "'");
}

std::string_view yoco_truncation_mode_name(YocoTruncationMode mode) {
    return mode == YocoTruncationMode::kCompact ? "compact" : "off";
}

Status validate_yoco_prefill(const YocoPrefillSettings& s, int64_t max_rollback_tokens,
                             const SwaGeometry& g) {
    if (max_rollback_tokens < 0) {
        return invalid_argument("max rollback must be >= 0 tokens, got " +
                                std::to_string(max_rollback_tokens));
    }
    if (s.mode == YocoTruncationMode::kOff) return Status::ok();
    // S-SWA: the kept tail rebuilds the decoder's window after any rollback.
    const int64_t need = g.window_tokens + max_rollback_tokens;
    if (s.keep_tokens < need) {
        return invalid_argument("YOCO prefill keep tokens " + std::to_string(s.keep_tokens) +
                                " must cover the window " + std::to_string(g.window_tokens) +
                                " + max rollback " + std::to_string(max_rollback_tokens) + " = " +
                                std::to_string(need));
    }
    return Status::ok();
}

}  // namespace dsi::kv
