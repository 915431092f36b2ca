#include "serving/data_dir.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace dsi::serving {
namespace {

bool has_tokenizer(Env* env, const std::string& data_dir) {
    return env->file_exists(data_dir + "/" + kTokenizerSubdir + "/tokenizer.json");
}

}  // namespace

std::string executable_dir() {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) {
        return "";
    }
    return exe.parent_path().string();
}

std::vector<std::string> data_dir_candidates(const std::string& exe_dir) {
    if (exe_dir.empty()) {
        return {};
    }
    const std::filesystem::path exe(exe_dir);
    return {(exe / ".." / "share" / "dsinfer").lexically_normal().string(),
            (exe / ".." / ".." / "share" / "dsinfer").lexically_normal().string()};
}

Result<std::string> find_data_dir(Env* env, const std::string& explicit_dir) {
    if (!explicit_dir.empty()) {
        if (!has_tokenizer(env, explicit_dir)) {
            return not_found("--data-dir " + explicit_dir + " has no " + kTokenizerSubdir +
                             "/tokenizer.json");
        }
        return explicit_dir;
    }
    const std::vector<std::string> candidates = data_dir_candidates(executable_dir());
    std::string looked;
    for (const std::string& dir : candidates) {
        if (has_tokenizer(env, dir)) {
            return dir;
        }
        looked += (looked.empty() ? "" : ", ") + dir;
    }
    return not_found("dsinfer data (" + std::string(kTokenizerSubdir) +
                     "/tokenizer.json) not found in " + (looked.empty() ? "?" : looked) +
                     ": install with `cmake --install`, or build after scripts/setup.sh, or "
                     "pass --data-dir");
}

Result<std::string> find_tokenizer_data_dir(Env* env, const std::string& explicit_data_dir) {
    DSI_ASSIGN_OR_RETURN(std::string dir, find_data_dir(env, explicit_data_dir));
    return dir + "/" + kTokenizerSubdir;
}

std::string default_cache_dir() {
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
        return std::string(x) + "/dsinfer";
    }
    if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
        return std::string(h) + "/.cache/dsinfer";
    }
    return ".cache/dsinfer";
}

}  // namespace dsi::serving
