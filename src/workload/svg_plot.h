// SvgPlot: a small dependency-free SVG chart writer for the simulator's figures
// (line charts with optional log-x, and grouped bar charts). Output is deterministic
// text. Thread model: value type.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dsi::workload {

struct SvgSeries {
    std::string name;
    std::vector<std::pair<double, double>> points;  // (x, y); bars use the index of x
};

struct SvgPlot {
    std::string title;
    std::string x_label;
    std::string y_label;
    bool log_x = false;
    bool bars = false;                    // grouped bars: one group per category
    std::vector<std::string> categories;  // bar groups (bars only)
    std::vector<SvgSeries> series;
    double y_min = 0;
    double y_max = 0;  // 0: from the data
    std::vector<std::pair<std::string, double>> h_lines;  // labelled reference lines

    std::string render(int width_px = 720, int height_px = 420) const;
};

}  // namespace dsi::workload
