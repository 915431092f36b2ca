// dsinfer bench serve: OpenAI-compatible load generator (issue 6; library: src/loadgen).
// Targets any server that speaks /v1/chat/completions or /v1/completions (dsinfer,
// llama-server, vLLM, SGLang). Sweeps concurrency x request rate over one dataset and
// writes a JSON report; tools/plots/plot.py draws its figure (latency and throughput
// against the swept concurrency or rate). Ctrl-C cancels the run in flight and reports
// what finished.
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "loadgen/dataset.h"
#include "loadgen/load_runner.h"
#include "loadgen/report.h"
#include "net/http_client.h"

namespace dsi {
namespace {

using nlohmann::json;

std::atomic<bool> g_cancel{false};
extern "C" void on_sigint(int) { g_cancel.store(true); }

struct BenchServeFlags {
    std::string base_url = "http://127.0.0.1:8000";
    std::string model;
    std::string api_key;
    std::string endpoint = "chat";
    std::string dataset = "random";
    int64_t num_prompts = 100;
    int64_t prompts_per_concurrency = 0;
    int32_t input_len = 256;
    int32_t output_len = 128;
    double range_ratio = 0;
    int32_t conversations = 16;
    int32_t turns = 4;
    int32_t system_prefix_len = 512;
    std::string trace;
    double trace_time_scale = 1;
    double trace_length_scale = 1;
    int32_t max_input_len = 1 << 20;
    int32_t max_output_len = 1 << 16;
    std::string request_rate = "inf";
    std::string concurrency = "1";
    double duration_s = 0;
    double timeout_s = 600;
    bool no_stream = false;
    bool no_ignore_eos = false;
    double temperature = 0;
    uint64_t seed = 1;
    std::string label;
    std::string out_json;
    std::string records_out;
    bool fail_on_error = false;
};

Result<std::vector<double>> parse_list(const std::string& text, const char* what) {
    std::vector<double> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item == "inf") {
            out.push_back(std::numeric_limits<double>::infinity());
            continue;
        }
        char* end = nullptr;
        const double v = std::strtod(item.c_str(), &end);
        if (item.empty() || end != item.c_str() + item.size() || !(v > 0)) {
            return invalid_argument(std::string("bad ") + what + " value '" + item + "'");
        }
        out.push_back(v);
    }
    if (out.empty()) return invalid_argument(std::string("empty ") + what + " list");
    return out;
}

bool write_file(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    return static_cast<bool>(f);
}

int run_bench_serve(const BenchServeFlags& f) {
    auto fail = [](const Status& st) {
        std::fprintf(stderr, "bench serve: %s\n", st.to_string().c_str());
        return 2;
    };
    auto target = net::parse_base_url(f.base_url);
    if (!target.is_ok()) return fail(target.status());
    auto rates = parse_list(f.request_rate, "--request-rate");
    if (!rates.is_ok()) return fail(rates.status());
    auto concs = parse_list(f.concurrency, "--concurrency");
    if (!concs.is_ok()) return fail(concs.status());

    loadgen::DatasetSettings ds;
    ds.kind = f.dataset == "random"       ? loadgen::DatasetKind::kRandom
              : f.dataset == "multi-turn" ? loadgen::DatasetKind::kMultiTurn
                                          : loadgen::DatasetKind::kTrace;
    ds.seed = f.seed;
    ds.input_tokens = f.input_len;
    ds.output_tokens = f.output_len;
    ds.range_ratio = f.range_ratio;
    ds.num_conversations = f.conversations;
    ds.num_turns = f.turns;
    ds.system_prefix_tokens = f.system_prefix_len;
    ds.trace_path = f.trace;
    ds.time_scale = f.trace_time_scale;
    ds.length_scale = f.trace_length_scale;
    ds.max_input_tokens = f.max_input_len;
    ds.max_output_tokens = f.max_output_len;

    loadgen::LoadSettings ls;
    ls.api = f.endpoint == "completions" ? loadgen::ApiKind::kCompletions : loadgen::ApiKind::kChat;
    ls.model = f.model;
    ls.api_key = f.api_key;
    ls.stream = !f.no_stream;
    ls.ignore_eos = !f.no_ignore_eos;
    ls.temperature = f.temperature;
    ls.timeout_ms = static_cast<int64_t>(f.timeout_s * 1000);
    ls.max_duration_s = f.duration_s;
    ls.seed = f.seed;

    std::signal(SIGINT, on_sigint);
    net::HttpClient client(*target);
    json runs = json::array();
    std::string records;
    int64_t total_errors = 0;
    std::printf("%-6s %-8s %6s %6s %9s %9s %9s %9s %9s %9s %9s\n", "conc", "rate", "ok", "err",
                "req/s", "out_tok/s", "ttft_p50", "ttft_p99", "tpot_p50", "itl_p50", "itl_p99");
    for (double rate : *rates) {
        for (double conc : *concs) {
            if (g_cancel.load()) break;
            ls.request_rate = rate;
            ls.max_concurrency = static_cast<int32_t>(conc);
            if (Status st = ls.validate(); !st.is_ok()) return fail(st);
            ds.num_requests = std::max<int64_t>(
                f.num_prompts, f.prompts_per_concurrency * static_cast<int64_t>(conc));
            auto dataset = loadgen::make_dataset(Env::default_env(), ds);
            if (!dataset.is_ok()) return fail(dataset.status());
            loadgen::LoadResult result = loadgen::run_load(client, ls, *dataset, &g_cancel);
            loadgen::LoadSummary s = loadgen::summarize(result);
            records += loadgen::records_jsonl(result, static_cast<int>(runs.size()));
            total_errors += s.num_errors;
            std::printf("%-6d %-8s %6lld %6lld %9.2f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n",
                        ls.max_concurrency, std::isinf(rate) ? "inf" : std::to_string(rate).c_str(),
                        static_cast<long long>(s.num_ok), static_cast<long long>(s.num_errors),
                        s.request_throughput, s.output_throughput, s.ttft.p50_ms, s.ttft.p99_ms,
                        s.tpot.p50_ms, s.itl.p50_ms, s.itl.p99_ms);
            for (const auto& [msg, count] : s.errors) {
                std::printf("    error x%lld: %s\n", static_cast<long long>(count), msg.c_str());
            }
            std::fflush(stdout);
            json run = loadgen::summary_json(s);
            run["concurrency"] = ls.max_concurrency;
            run["request_rate"] = std::isinf(rate) ? json("inf") : json(rate);
            run["cancelled"] = result.cancelled;
            runs.push_back(std::move(run));
        }
    }
    const std::string label =
        f.label.empty() ? "bench serve " + f.dataset + " @ " + f.base_url : f.label;
    json report = {{"label", label},
                   {"base_url", f.base_url},
                   {"model", f.model},
                   {"endpoint", f.endpoint},
                   {"dataset", f.dataset},
                   {"stream", ls.stream},
                   {"input_len", f.input_len},
                   {"output_len", f.output_len},
                   {"runs", std::move(runs)}};
    if (!f.out_json.empty() && !write_file(f.out_json, report.dump(2) + "\n")) {
        return fail(internal_error("cannot write " + f.out_json));
    }
    if (!f.records_out.empty() && !write_file(f.records_out, records)) {
        return fail(internal_error("cannot write " + f.records_out));
    }
    if (!f.out_json.empty()) {
        // The figure is drawn by matplotlib, outside the binary (docs/server.md).
        std::printf("report: %s (figure: tools/plots/plot.py %s OUT.svg)\n", f.out_json.c_str(),
                    f.out_json.c_str());
    }
    if (g_cancel.load()) return 130;
    return f.fail_on_error && total_errors > 0 ? 1 : 0;
}

}  // namespace

// Called by register_serve_commands (cmd_serve.cc) with the `bench` subcommand.
void register_bench_serve_command(CLI::App& bench) {
    auto f = std::make_shared<BenchServeFlags>();
    CLI::App* s = bench.add_subcommand(
        "serve", "OpenAI-compatible load generator (dsinfer, llama-server, vLLM, SGLang)");
    add_setting(*s, "--base-url", f->base_url, "server, http://host:port[/prefix]");
    add_setting(*s, "--model", f->model, "model id sent in requests")->required();
    add_setting(*s, "--api-key", f->api_key, "sent as Authorization: Bearer");
    add_setting(*s, "--endpoint", f->endpoint, "chat | completions")
        ->check(CLI::IsMember({"chat", "completions"}));
    add_setting(*s, "--dataset", f->dataset, "random | multi-turn | trace")
        ->check(CLI::IsMember({"random", "multi-turn", "trace"}));
    add_setting(*s, "--num-prompts", f->num_prompts, "requests per run (trace: first N, 0 all)");
    add_setting(*s, "--prompts-per-concurrency", f->prompts_per_concurrency,
                "at least this many requests per unit of concurrency");
    add_setting(*s, "--input-len", f->input_len, "prompt words (multi-turn: per user turn)");
    add_setting(*s, "--output-len", f->output_len, "max_tokens");
    add_setting(*s, "--range-ratio", f->range_ratio, "lengths uniform in len*(1 +- r)");
    add_setting(*s, "--conversations", f->conversations, "multi-turn conversations");
    add_setting(*s, "--turns", f->turns, "turns per conversation");
    add_setting(*s, "--system-prefix-len", f->system_prefix_len,
                "multi-turn shared system prompt (words)");
    add_setting(*s, "--trace", f->trace, "Mooncake .jsonl or Azure .csv trace");
    add_setting(*s, "--trace-time-scale", f->trace_time_scale, "arrival times x this");
    add_setting(*s, "--trace-length-scale", f->trace_length_scale, "lengths x this");
    add_setting(*s, "--max-input-len", f->max_input_len, "trace: clamp prompt words");
    add_setting(*s, "--max-output-len", f->max_output_len, "trace: clamp output tokens");
    add_setting(*s, "--request-rate", f->request_rate, "Poisson rate(s) per s, list; inf");
    add_setting(*s, "--concurrency", f->concurrency, "max in flight, list: 1,16,64,256");
    add_setting(*s, "--duration-s", f->duration_s, "stop issuing after (0: whole dataset)");
    add_setting(*s, "--timeout-s", f->timeout_s, "per request (0: none)");
    add_switch(*s, "--no-stream", f->no_stream, "non-streaming requests (TTFT = e2e)");
    add_switch(*s, "--no-ignore-eos", f->no_ignore_eos, "do not send ignore_eos");
    add_setting(*s, "--temperature", f->temperature, "sampling temperature");
    add_setting(*s, "--seed", f->seed, "dataset and arrival seed");
    add_setting(*s, "--label", f->label, "report title");
    add_setting(*s, "--out-json", f->out_json,
                "write the JSON report here (tools/plots/plot.py draws it)");
    add_setting(*s, "--records-out", f->records_out,
                "write one JSON line per request here (run, dataset index, steady-clock start, "
                "TTFT, e2e, tokens, inter-token gaps)");
    add_switch(*s, "--fail-on-error", f->fail_on_error, "exit 1 when a request failed");
    s->callback([f] {
        if (int rc = run_bench_serve(*f); rc != 0) throw CLI::RuntimeError(rc);
    });
}

}  // namespace dsi
