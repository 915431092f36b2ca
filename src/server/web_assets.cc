#include "server/web_assets.h"

namespace dsi::server {

const WebAsset* find_web_asset(std::string_view path) {
    for (size_t i = 0; i < kNumWebAssets; ++i) {
        if (kWebAssets[i].path == path) return &kWebAssets[i];
    }
    return nullptr;
}

}  // namespace dsi::server
