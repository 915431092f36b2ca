// Helpers for the protocol tests that run node scripts from tests/protocol/ on case
// files from tests/cases/protocol/.
// Thread model: test-only, single thread.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>
#include "support/build_paths.h"

namespace dsi::protocol::node_test {

// `s` as one single-quoted POSIX shell word.
inline std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) {
        if (c == '\'') {
            out += "'\\''";
        } else {
            out.push_back(c);
        }
    }
    return out + "'";
}

// "node SCRIPT ARGS..." with every word quoted; SCRIPT is relative to tests/protocol/.
inline std::string node_command(const std::string& script, const std::vector<std::string>& args) {
    std::string cmd = "node " + shell_quote(std::string(DSINFER_SOURCE_DIR) + "/tests/protocol/" +
                                            script);
    for (const std::string& a : args) {
        cmd += " " + shell_quote(a);
    }
    return cmd;
}

// The *.json case files of `dir`, sorted by name.
inline std::vector<std::filesystem::path> json_case_files(const std::string& dir) {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() == ".json") {
            files.push_back(entry.path());
        }
    }
    std::sort(files.begin(), files.end());
    return files;
}

}  // namespace dsi::protocol::node_test
