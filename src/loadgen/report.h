// Reports of `dsinfer bench serve`: a summary as JSON and a sweep (one summary per
// concurrency or request rate) as an SVG figure (latency and throughput panels, drawn
// with workload/svg_plot.h). Thread model: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loadgen/load_runner.h"

namespace dsi::loadgen {

nlohmann::json summary_json(const LoadSummary& s);

struct SweepPoint {
    double x = 0;  // concurrency or request rate
    LoadSummary summary;
};

// Two panels stacked: TTFT / TPOT / ITL p50 and p99 (ms) and output tokens/s against x.
std::string sweep_svg(const std::string& title, const std::string& x_label,
                      const std::vector<SweepPoint>& points);

}  // namespace dsi::loadgen
