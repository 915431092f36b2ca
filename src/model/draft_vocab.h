// MTP draft vocabulary files (FR-Spec style, issue 24): the token ids a restricted MTP
// head drafts from (DeepseekModel::make_mtp_draft_head). Kept beside a checkpoint as
// draft_vocab.json; the embedded default model's expansion writes its trained ids.
//
//   {"format": "dsinfer-draft-vocab-v1", "source": "...", "ids": [0, 1, 17, ...]}
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsi {

inline constexpr const char* kDraftVocabFile = "draft_vocab.json";

// The ids sorted and unique (any order and duplicates are accepted). INVALID_ARGUMENT
// naming the problem: not JSON, wrong format, no ids, an id that is not a
// non-negative integer below `vocab_size`.
Result<std::vector<int32_t>> parse_draft_vocab(std::string_view json, int64_t vocab_size);
std::string draft_vocab_to_json(std::span<const int32_t> ids, std::string_view source);

}  // namespace dsi
