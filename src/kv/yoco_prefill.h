// YocoPrefillSettings: the decoder side of bounded replay (S-SWA) as settings (SPEC
// S-ENG-10 names): a V4.1 (CED) prefill runs only the encoder layers over the prompt
// and replays the prompt's last `keep_tokens` tokens through the decoder layers to
// rebuild their SWA; the result serves decode only and never enters the prefix cache.
//
//   --yoco-prefill-truncation-mode  <->  DSINFER_YOCO_PREFILL_TRUNCATION_MODE
//       compact (default): decoder layers see only the kept tail (bounded replay)
//       off: decoder layers run over the whole prompt (exact; about twice the FLOPs)
//   --yoco-prefill-keep-tokens      <->  DSINFER_YOCO_PREFILL_KEEP_TOKENS (default 140)
//       must cover the window (128) plus the most tokens a step can roll back
//       (rejected drafts); a smaller value is an error at start.
//
// The apps register the flags (apps/dsinfer/replica_flags.cc); this header only checks
// and names values. Thread model: pure functions and value types.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"
#include "kv/swa_rules.h"

namespace dsi::kv {

enum class YocoTruncationMode : uint8_t { kCompact, kOff };

inline constexpr int64_t kDefaultYocoKeepTokens = 140;

struct YocoPrefillSettings {
    YocoTruncationMode mode = YocoTruncationMode::kCompact;
    int64_t keep_tokens = kDefaultYocoKeepTokens;
};

// "compact" | "off"; INVALID_ARGUMENT naming both otherwise.
Result<YocoTruncationMode> parse_yoco_truncation_mode(std::string_view name);
std::string_view yoco_truncation_mode_name(YocoTruncationMode mode);

// INVALID_ARGUMENT when keep_tokens < window + max_rollback_tokens (in compact mode;
// off keeps every token) or max_rollback_tokens < 0.
Status validate_yoco_prefill(const YocoPrefillSettings& s, int64_t max_rollback_tokens,
                             const SwaGeometry& g = {});

}  // namespace dsi::kv
