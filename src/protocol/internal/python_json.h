// Python-compatible JSON text: `json.dumps(v, ensure_ascii=False)` with the
// default separators ", " and ": " -- the form the DeepSeek encoders print tool
// schemas, arguments and response formats in.
//
// Thread model: pure functions.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dsi::protocol::internal {

// json.dumps(v, ensure_ascii=False). Floats print as nlohmann's shortest
// round-trip form (equal to Python repr for the usual values).
std::string python_dumps(const nlohmann::ordered_json& v);
// Appends the body of a JSON string literal for `s` (no quotes) as
// json.dumps(s, ensure_ascii=False) escapes it: byte-local, so it can be applied
// piece by piece to a split string (S-REC-4).
void append_json_escaped(std::string_view s, std::string* out);

}  // namespace dsi::protocol::internal
