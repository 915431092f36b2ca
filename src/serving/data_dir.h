// Where the product finds its read-only data and keeps its cache.
//
// Data (the DeepSeek V3 tokenizer files, whose tokenizer_config.json carries the chat
// template) lives in `share/dsinfer/` next to the binary's `bin/`: `cmake --install`
// puts the binary in PREFIX/bin and the data in PREFIX/share/dsinfer; the build tree
// mirrors that with build/share/dsinfer beside build/apps/dsinfer/dsinfer. The binary
// finds the folder from its own location (/proc/self/exe), so it works from any working
// directory; nothing here reads the source tree or tests/.
//
// Thread model: pure functions over the file system.
#pragma once

#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"

namespace dsi::serving {

// Tokenizer files inside a data directory.
inline constexpr const char* kTokenizerSubdir = "tokenizer/deepseek_v3";

// Directory of the running executable (readlink /proc/self/exe), "" if unknown.
std::string executable_dir();

// Data directories tried in order when none is given: EXE_DIR/../share/dsinfer
// (installed) and EXE_DIR/../../share/dsinfer (build tree).
std::vector<std::string> data_dir_candidates(const std::string& exe_dir);

// `explicit_dir` when not empty (it must hold the tokenizer files), else the first
// candidate holding them. NOT_FOUND names every place looked at and how to fix it.
Result<std::string> find_data_dir(Env* env, const std::string& explicit_dir = "");

// find_data_dir(...) + "/" + kTokenizerSubdir.
Result<std::string> find_tokenizer_data_dir(Env* env, const std::string& explicit_data_dir = "");

// $XDG_CACHE_HOME/dsinfer, else $HOME/.cache/dsinfer, else ./.cache/dsinfer.
std::string default_cache_dir();

}  // namespace dsi::serving
