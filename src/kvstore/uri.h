// Store URIs: "scheme://authority/path?k=v&k=v". A tiny parser, no percent-decoding.
// Thread model: pure functions.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dsi::kvstore {

struct StoreUri {
    std::string scheme;                        // "file", "redis", "shm"
    std::string rest;                          // between "://" and "?"
    std::map<std::string, std::string> query;  // later keys win
};

// kInvalidArgument unless the text has a scheme and "://".
Result<StoreUri> parse_store_uri(std::string_view text);

// query[name] parsed as a non-negative integer, or `fallback` when absent.
Result<int64_t> uri_int(const StoreUri& uri, const std::string& name, int64_t fallback);

}  // namespace dsi::kvstore
