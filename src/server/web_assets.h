// The built-in chat page (src/server/web/: index.html, app.js, style.css), embedded in
// the binary at build time by cmake/embed_files.cmake, so `dsinfer serve` serves it from
// any working directory with no data files and no network. index.html is served at
// `/` and every file at `/static/<name>`. The views point into static storage and live
// as long as the program.
#pragma once

#include <cstddef>
#include <string_view>

namespace dsi::server {

struct WebAsset {
    std::string_view path;          // "/", "/static/app.js"
    std::string_view content_type;  // with charset
    std::string_view body;
};

// The asset served at `path` (no query string), or nullptr.
const WebAsset* find_web_asset(std::string_view path);

// Defined in the generated web_assets_data.cc.
extern const WebAsset kWebAssets[];
extern const size_t kNumWebAssets;

}  // namespace dsi::server
