// Base64 (RFC 4648, standard alphabet, padded): etcd's JSON gateway carries keys and
// values as base64 strings. Thread model: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace dsi::net {

std::string base64_encode(std::string_view bytes);
// INVALID_ARGUMENT for a length that is not a multiple of 4, a character outside the
// alphabet, or padding anywhere but at the end.
Result<std::string> base64_decode(std::string_view text);

}  // namespace dsi::net
