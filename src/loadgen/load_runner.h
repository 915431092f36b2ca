// run_load: sends a Dataset to an OpenAI-compatible server (dsinfer, llama-server, vLLM,
// SGLang) through HttpClient and times every request: TTFT (first text chunk), inter-token
// latency (gaps between text chunks), TPOT ((e2e - TTFT) / (output tokens - 1)), e2e.
//
// Scheduling: request i may start at its arrival time (trace replay) or at the i-th
// arrival of a Poisson process of `request_rate` per second (inf: all at once), and only
// while fewer than `max_concurrency` requests are in flight; a multi-turn request also
// waits for its conversation's previous turn, whose reply text it carries as history.
// Errors (HTTP status != 200, malformed SSE, server error objects, stream cut before
// [DONE], timeouts, refused connections) are counted per request, never thrown.
//
// Thread model: run_load blocks its caller; HttpClient's I/O thread does the timing.
// `cancel` (optional) stops a run from another thread: no new requests, in-flight ones
// end CANCELLED, and run_load returns what it has.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "loadgen/dataset.h"
#include "net/http_client.h"

namespace dsi::loadgen {

// The load generator talks through net/'s client (shared with membership/'s etcd calls).
using net::HttpClient;
using net::HttpHandlers;
using net::HttpRequest;
using net::HttpTarget;
using net::parse_base_url;

enum class ApiKind { kChat, kCompletions };

struct LoadSettings {
    ApiKind api = ApiKind::kChat;
    std::string model;
    std::string api_key;  // sent as Authorization: Bearer
    double request_rate = std::numeric_limits<double>::infinity();  // per second
    int32_t max_concurrency = 1;
    bool stream = true;
    bool ignore_eos = true;  // vLLM/llama.cpp/dsinfer extension: exact output lengths
    double temperature = 0.0;
    int64_t timeout_ms = 600000;  // per request
    double max_duration_s = 0;    // 0: until the dataset is sent; else stop issuing after
    uint64_t seed = 1;            // Poisson arrivals

    Status validate() const;
};

struct RequestRecord {
    int64_t index = -1;  // the request's position in the dataset
    bool ok = false;
    std::string error;
    int32_t conversation = -1;
    int32_t turn = 0;
    int64_t start_ns = 0;  // from the run's start
    int64_t ttft_ns = 0;
    int64_t e2e_ns = 0;
    int64_t prompt_tokens = 0;  // from usage (0 when the server gives none)
    int64_t output_tokens = 0;  // usage, else the number of text chunks
    int64_t cached_tokens = 0;
    std::vector<int64_t> itl_ns;
};

struct LoadResult {
    std::vector<RequestRecord> records;  // requests that were started, in finishing order
    double duration_s = 0;
    // The run's start on the steady clock (std::chrono::steady_clock, as
    // base/clock.h's steady_clock_ns): lines records up with other processes' logs.
    int64_t start_steady_ns = 0;
    bool cancelled = false;
};

LoadResult run_load(HttpClient& client, const LoadSettings& settings, const Dataset& dataset,
                    const std::atomic<bool>* cancel = nullptr);

struct LatencyStats {
    double mean_ms = 0, p50_ms = 0, p90_ms = 0, p99_ms = 0;
};
// Nearest-rank percentiles of `values_ns`, in ms.
LatencyStats latency_stats(std::vector<int64_t> values_ns);

struct LoadSummary {
    int64_t num_requests = 0;
    int64_t num_ok = 0;
    int64_t num_errors = 0;
    std::map<std::string, int64_t> errors;  // message -> count
    double duration_s = 0;
    double request_throughput = 0;  // ok requests / s
    double output_throughput = 0;   // output tokens / s
    double total_throughput = 0;    // (prompt + output) tokens / s
    int64_t prompt_tokens = 0;
    int64_t output_tokens = 0;
    int64_t cached_tokens = 0;
    LatencyStats ttft, tpot, itl, e2e;
    // Multi-turn: TTFT of the first turns and of the later (prefix-sharing) turns.
    LatencyStats ttft_first_turn, ttft_later_turns;
};
LoadSummary summarize(const LoadResult& result);

}  // namespace dsi::loadgen
