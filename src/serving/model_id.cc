#include "serving/model_id.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "serving/default_model.h"

namespace dsi::serving {
namespace {

constexpr size_t kSampleBytes = size_t{1} << 20;

bool is_checkpoint_file(const std::string& name) {
    return name == "config.json" || name.ends_with(".safetensors") || name.ends_with(".gguf");
}

Status hash_file(Env* env, const std::string& path, const std::string& name, XXH3_state_t* state) {
    DSI_ASSIGN_OR_RETURN(MappedFile file, env->map_file(path));
    const uint64_t size = file.size();
    XXH3_128bits_update(state, name.data(), name.size() + 1);  // with its NUL: a separator
    XXH3_128bits_update(state, &size, sizeof(size));
    const size_t head = std::min(file.size(), kSampleBytes);
    XXH3_128bits_update(state, file.data(), head);
    if (file.size() > head) {
        const size_t tail = std::min(file.size() - head, kSampleBytes);
        XXH3_128bits_update(state, file.data() + file.size() - tail, tail);
    }
    return Status();
}

}  // namespace

Result<std::string> checkpoint_fingerprint(Env* env, const std::string& model_path) {
    std::vector<std::pair<std::string, std::string>> files;  // (name, path)
    std::error_code ec;
    if (std::filesystem::is_directory(model_path, ec)) {
        for (const auto& entry : std::filesystem::directory_iterator(model_path, ec)) {
            const std::string name = entry.path().filename().string();
            if (entry.is_regular_file(ec) && is_checkpoint_file(name)) {
                files.emplace_back(name, entry.path().string());
            }
        }
        std::sort(files.begin(), files.end());
    } else if (env->file_exists(model_path)) {
        files.emplace_back(std::filesystem::path(model_path).filename().string(), model_path);
    }
    if (files.empty()) {
        return not_found("no checkpoint files (config.json, *.safetensors, *.gguf) at " +
                         model_path);
    }
    XXH3_state_t* state = XXH3_createState();
    XXH3_128bits_reset(state);
    Status s;
    for (const auto& [name, path] : files) {
        s = hash_file(env, path, name, state);
        if (!s.is_ok()) {
            break;
        }
    }
    const XXH128_hash_t h = XXH3_128bits_digest(state);
    XXH3_freeState(state);
    DSI_RETURN_IF_ERROR(s.with_context("fingerprint of " + model_path));
    char hex[33];
    std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                  static_cast<unsigned long long>(h.low64));
    return std::string(hex);
}

std::string cache_identity(const std::string& fingerprint, const std::string& weight_format) {
    return "ckpt-" + fingerprint + "/" + weight_format;
}

std::string served_model_name(const std::string& model_id, const std::string& model_path,
                              bool is_default_model) {
    if (!model_id.empty()) {
        return model_id;
    }
    if (is_default_model) {
        return kDefaultModelName;
    }
    std::filesystem::path p(model_path);
    std::string base = p.filename().string();
    while (base.empty() && p.has_parent_path() && p.parent_path() != p) {
        p = p.parent_path();  // "models/tiny/" -> "tiny"
        base = p.filename().string();
    }
    return base.empty() ? model_path : base;
}

}  // namespace dsi::serving
