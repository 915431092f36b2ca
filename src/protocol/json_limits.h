// Bounded JSON for request bodies (issue 22 D1). nlohmann's parser is iterative, but
// copying, dumping and walking a parsed value recurse once per nesting level, so a
// 40 KB body of nested `[` overflows the stack wherever the value is used. Every JSON
// text the server reads from a client -- the body, and the strings it parses again
// (tool-call arguments) -- goes through check_json_depth() before nlohmann sees it;
// every value in memory is then at most `max_depth` levels deep, and copies and dumps
// of it are bounded too.
//
// Thread model: pure functions.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace dsi::protocol {

// Levels of nested objects / arrays a request may hold (the body itself is level 1).
// A setting (ServerLimits::max_json_depth, `dsinfer serve --max-json-depth`).
inline constexpr int kDefaultMaxJsonDepth = 128;

// INVALID_ARGUMENT "<path>: JSON nested deeper than <max_depth> levels" when `text`
// opens more than `max_depth` containers at once; <path> is `field` followed by the
// members and indices down to the over-deep value (its first 8 steps). One linear pass
// over the text with memory bounded by max_depth; text that is not JSON passes (the
// parser that follows rejects it).
Status check_json_depth(std::string_view text, int max_depth, std::string_view field);

// check_json_depth() then nlohmann's parse (member order kept). INVALID_ARGUMENT
// "<field>: invalid JSON: ..." for text that does not parse.
Result<nlohmann::ordered_json> parse_json(std::string_view text, int max_depth,
                                          std::string_view field);

}  // namespace dsi::protocol
