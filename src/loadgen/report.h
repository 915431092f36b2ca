// Reports of `dsinfer bench serve`: a run's summary as JSON. The command writes one per
// concurrency or request rate into its report; tools/plots/plot.py draws a report's
// latency and throughput panels. Thread model: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "loadgen/load_runner.h"

namespace dsi::loadgen {

nlohmann::json summary_json(const LoadSummary& s);

// One JSON line per request of `r` (`bench serve --records-out`): {"run", "index" (the
// dataset's), "ok", "start_steady_ns" (steady clock, as base/clock.h: comparable with an
// engine's --step-log), "ttft_ns", "e2e_ns", "prompt_tokens", "output_tokens", "itl_ns"}.
std::string records_jsonl(const LoadResult& r, int run);

}  // namespace dsi::loadgen
