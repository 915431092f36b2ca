// config.json reading and writing helpers shared by model/config.cc (V2/V3/V4) and
// model/v41_config.cc (V4.1, whose fields sit under text_config). Private to src/model/.
// Thread model: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "model/config.h"

namespace dsi::internal {

using nlohmann::json;

// Reads `key` into `out` if present; a present key of the wrong type is an error.
template <typename T>
Status read_opt(const json& j, const char* key, T& out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::ok();
    try {
        out = it->get<T>();
    } catch (const json::exception& e) {
        return invalid_argument(std::string("config.json: field '") + key +
                                "' has the wrong type: " + e.what());
    }
    return Status::ok();
}

template <typename T>
Status read_req(const json& j, const char* key, T& out) {
    if (!j.contains(key) || j[key].is_null()) {
        return invalid_argument(std::string("config.json: missing required field '") + key + "'");
    }
    return read_opt(j, key, out);
}

// INVALID_ARGUMENT "config: field 'name' ..." (validate()).
Status positive_field(const char* name, int64_t v);
Status field_error(const char* name, const std::string& why);

// The V4 fields of `j` (V4's top level, V4.1's text_config) into c.
Status parse_v4_fields(const json& j, ModelConfig& c);
// The V4 fields of c as V4-Flash's config.json lays them out.
json v4_config_json(const ModelConfig& c);

// v41_config.cc: the V4.1-only fields of a V4.1 config.json (`root`: the whole file) and
// the whole V4.1 config.json.
Status parse_v41_fields(const json& root, ModelConfig& c);
std::string to_v41_config_json(const ModelConfig& c);

}  // namespace dsi::internal
