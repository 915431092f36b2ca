// dsinfer: one binary, subcommands. main() only parses flags (base/settings.h)
// and calls into the libraries.
#include <cstdio>
#include <string>

#include "base/logging.h"
#include "base/settings.h"

int main(int argc, char** argv) {
    CLI::App app{"dsinfer: DeepSeek-style MoE inference"};
    app.require_subcommand(1);
    std::string log_level = "info";
    dsi::add_setting(app, "--log-level", log_level, "debug|info|warning|error|off");

    CLI11_PARSE(app, argc, argv);
    auto level = dsi::parse_log_level(log_level);
    if (!level.is_ok()) {
        std::fprintf(stderr, "%s\n", level.status().to_string().c_str());
        return 2;
    }
    dsi::set_log_level(*level);
    return 0;
}
