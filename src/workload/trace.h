// Request traces for the cluster simulator: readers for the formats in
// tests/data/traces, a writer, and a synthetic generator (incl. >= 256K contexts).
//
//  - Mooncake JSONL: one object per line, {"timestamp": ms, "input_length": n,
//    "output_length": n, "hash_ids": [...]}; hash_ids are prefix-chained ids of
//    512-token blocks (equal id = equal prefix block).
//  - Azure LLM inference CSV: header "TIMESTAMP,ContextTokens,GeneratedTokens", then
//    "YYYY-MM-DD HH:MM:SS.fffffff,<int>,<int>"; no prefix information.
// A malformed line is an INVALID_ARGUMENT naming the line number. Requests are returned
// sorted by arrival (stable), arrival times relative to the first request.
// Thread model: value types and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/env.h"
#include "base/status.h"

namespace dsi::workload {

struct TraceRequest {
    int64_t arrival_ns = 0;
    int32_t input_tokens = 0;
    int32_t output_tokens = 0;
    uint32_t first_block = 0;  // index into Trace::blocks
    uint32_t num_blocks = 0;
};

struct Trace {
    std::vector<TraceRequest> requests;
    std::vector<uint64_t> blocks;  // block ids of all requests, back to back
    int32_t block_tokens = 512;    // tokens per block id
    std::string source;

    std::span<const uint64_t> blocks_of(const TraceRequest& r) const {
        return {blocks.data() + r.first_block, r.num_blocks};
    }
};

Result<Trace> parse_mooncake_jsonl(std::string_view text);
Result<Trace> parse_azure_csv(std::string_view text);
// By extension: .jsonl -> Mooncake, .csv -> Azure.
Result<Trace> load_trace(Env* env, const std::string& path);
// Mooncake JSONL (timestamps in ms, rounded down).
std::string to_mooncake_jsonl(const Trace& trace);

struct SyntheticTraceSettings {
    int64_t num_requests = 10000;
    double rate_per_s = 100;
    uint64_t seed = 1;
    double input_median_tokens = 4000;
    double input_sigma = 1.2;  // lognormal
    int32_t max_input_tokens = 1 << 20;
    double long_context_fraction = 0.01;  // share of requests with 256K..1M tokens
    double output_median_tokens = 300;
    double output_sigma = 1.0;
    int32_t max_output_tokens = 16384;
    int64_t num_prefix_groups = 2000;  // shared prefixes (system prompts, sessions)
    double prefix_zipf_s = 1.1;
    double shared_prefix_fraction = 0.6;  // of the input covered by the group prefix
    int32_t block_tokens = 512;
    Status validate() const;
};
// Deterministic for settings.seed.
Result<Trace> generate_synthetic_trace(const SyntheticTraceSettings& settings);

}  // namespace dsi::workload
