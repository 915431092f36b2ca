// Typed field access for request JSON with errors naming the field path
// ("messages[2].content: expected a string"). Used by the adapters only.
//
// Thread model: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace dsi::protocol::internal {

using J = nlohmann::ordered_json;

inline Status field_error(std::string_view path, std::string_view what) {
    return invalid_argument(std::string(path) + ": " + std::string(what));
}
inline std::string join_path(std::string_view path, std::string_view key) {
    return path.empty() ? std::string(key) : std::string(path) + "." + std::string(key);
}
inline std::string index_path(std::string_view path, size_t i) {
    return std::string(path) + "[" + std::to_string(i) + "]";
}
// Member `key` of object `j`, or nullptr when absent or JSON null.
inline const J* member(const J& j, std::string_view key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
        return nullptr;
    }
    return &*it;
}

Result<std::optional<std::string>> opt_string(const J& j, std::string_view key,
                                              std::string_view path);
Result<std::string> req_string(const J& j, std::string_view key, std::string_view path);
Result<std::optional<double>> opt_number(const J& j, std::string_view key, std::string_view path,
                                         double lo, double hi);
Result<std::optional<int64_t>> opt_int(const J& j, std::string_view key, std::string_view path,
                                       int64_t lo, int64_t hi);
Result<std::optional<bool>> opt_bool(const J& j, std::string_view key, std::string_view path);
// REQUIRES nothing; INVALID_ARGUMENT "<path>: expected an object" etc.
Status expect_object(const J& j, std::string_view path);
Status expect_array(const J& j, std::string_view path);

}  // namespace dsi::protocol::internal
