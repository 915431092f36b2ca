// Test helper: JSON rewrites for grammar tests (issue 21, any property order).
// Thread model: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dsi::grammar::test_util {

// `v` with the members of every object (nested ones too) in reverse order. JSON
// Schema does not read member order, so the result validates exactly when `v` does.
inline nlohmann::ordered_json reversed_keys(const nlohmann::ordered_json& v) {
    if (v.is_array()) {
        auto out = nlohmann::ordered_json::array();
        for (const auto& x : v) out.push_back(reversed_keys(x));
        return out;
    }
    if (!v.is_object()) return v;
    std::vector<std::pair<std::string, nlohmann::ordered_json>> members;
    for (auto it = v.begin(); it != v.end(); ++it) {
        members.emplace_back(it.key(), reversed_keys(it.value()));
    }
    auto out = nlohmann::ordered_json::object();
    for (auto it = members.rbegin(); it != members.rend(); ++it) out[it->first] = it->second;
    return out;
}

}  // namespace dsi::grammar::test_util
