// Settings: every setting is a command-line flag with a DSINFER_* environment
// fallback (SPEC S-ENG-10), parsed once at start-up by the app's main() into plain
// structs that are then passed down. Precedence: flag > environment > default.
//
//   --batch-invariant        <->  DSINFER_BATCH_INVARIANT
//   --use-nextn-decode 5     <->  DSINFER_USE_NEXTN_DECODE=5
//
// Only apps/ include this header (it pulls in CLI11); libraries take settings
// structs, never parse flags themselves.
#pragma once

#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

namespace dsi {

// "--max-tokens" -> "DSINFER_MAX_TOKENS".
std::string setting_env_name(std::string_view flag);

// Adds `--name` (bound to `var`, whose current value is the default) with its
// DSINFER_* environment fallback.
template <typename T>
CLI::Option* add_setting(CLI::App& app, const std::string& flag, T& var, const std::string& help) {
    CLI::Option* opt = app.add_option(flag, var, help)->capture_default_str();
    opt->envname(setting_env_name(flag));
    return opt;
}

// A boolean switch: `--name`, `--name=false`, or DSINFER_NAME=1/0/true/false.
inline CLI::Option* add_switch(CLI::App& app, const std::string& flag, bool& var,
                               const std::string& help) {
    CLI::Option* opt = app.add_flag(flag, var, help)->capture_default_str();
    opt->envname(setting_env_name(flag));
    return opt;
}

}  // namespace dsi
