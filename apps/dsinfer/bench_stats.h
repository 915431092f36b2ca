// Repetition summaries for the benchmark commands (issue 20: every table shows the
// median of >= 3 alternating repetitions and their spread, never a best-of).
// Thread model: pure functions.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

namespace dsi::bench {

// Median (mean of the two middle values for an even count), min and max of `runs`, and
// the runs themselves in order. REQUIRES: !runs.empty().
inline nlohmann::json summarize_runs(std::vector<double> runs) {
    std::vector<double> sorted = runs;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    return {{"median", median}, {"min", sorted.front()}, {"max", sorted.back()}, {"runs", runs}};
}

}  // namespace dsi::bench
