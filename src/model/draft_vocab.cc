#include "model/draft_vocab.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace dsi {

Result<std::vector<int32_t>> parse_draft_vocab(std::string_view json, int64_t vocab_size) {
    const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("draft vocabulary: not a JSON object");
    if (auto f = j.find("format"); f == j.end() || *f != "dsinfer-draft-vocab-v1") {  // any type: no throw
        return invalid_argument("draft vocabulary: format is not dsinfer-draft-vocab-v1");
    }
    auto it = j.find("ids");
    if (it == j.end() || !it->is_array() || it->empty()) {
        return invalid_argument("draft vocabulary: ids must be a non-empty array");
    }
    std::vector<int32_t> ids;
    for (const nlohmann::json& v : *it) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size) {
            return invalid_argument("draft vocabulary: " + v.dump() +
                                    " is not a token id below " + std::to_string(vocab_size));
        }
        ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}

std::string draft_vocab_to_json(std::span<const int32_t> ids, std::string_view source) {
    nlohmann::ordered_json j;
    j["format"] = "dsinfer-draft-vocab-v1";
    j["source"] = source;
    j["ids"] = std::vector<int32_t>(ids.begin(), ids.end());
    return j.dump() + "\n";
}

}  // namespace dsi
