// Reports of `dsinfer bench serve`: a run's summary as JSON. The command writes one per
// concurrency or request rate into its report; tools/plots/plot.py draws a report's
// latency and throughput panels. Thread model: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "loadgen/load_runner.h"

namespace dsi::loadgen {

nlohmann::json summary_json(const LoadSummary& s);

}  // namespace dsi::loadgen
