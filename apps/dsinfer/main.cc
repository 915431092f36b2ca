// dsinfer: one binary, subcommands. main() only parses flags (base/settings.h);
// each subcommand's callback calls into the libraries and throws
// CLI::RuntimeError(exit_code) to end the program with that code.
#include <cstdio>
#include <string>

#include "base/logging.h"
#include "base/settings.h"

namespace dsi {
void register_model_commands(CLI::App& app);
void register_sim_commands(CLI::App& app);  // apps/dsinfer/cmd_sim.cc
void register_bench_commands(CLI::App& app);  // apps/dsinfer/cmd_bench.cc
void register_serve_commands(CLI::App& app);  // apps/dsinfer/cmd_serve.cc
void register_kvstore_commands(CLI::App& app);  // apps/dsinfer/cmd_kvstore.cc
void register_calibrate_command(CLI::App& app);  // apps/dsinfer/cmd_calibrate.cc
void register_bench_offline_command(CLI::App& bench);  // apps/dsinfer/cmd_bench_offline.cc
void register_compile_server_command(CLI::App& app);  // apps/dsinfer/cmd_compile_server.cc
void register_cluster_commands(CLI::App& app);  // apps/dsinfer/cmd_cluster.cc
}  // namespace dsi

int main(int argc, char** argv) {
    CLI::App app{"dsinfer: DeepSeek-style MoE inference"};
    app.require_subcommand(1);
    std::string log_level = "info";
    dsi::add_setting(app, "--log-level", log_level, "debug|info|warning|error|off")
        ->check(CLI::IsMember({"debug", "info", "warning", "warn", "error", "off"}));
    // Runs after flags are parsed, before any subcommand's callback.
    app.parse_complete_callback([&log_level] { dsi::set_log_level(*dsi::parse_log_level(log_level)); });

    dsi::register_model_commands(app);
    dsi::register_sim_commands(app);
    dsi::register_bench_commands(app);
    dsi::register_bench_offline_command(*app.get_subcommand("bench"));
    dsi::register_serve_commands(app);
    dsi::register_kvstore_commands(app);
    dsi::register_calibrate_command(app);
    dsi::register_compile_server_command(app);
    dsi::register_cluster_commands(app);

    CLI11_PARSE(app, argc, argv);
    return 0;
}
