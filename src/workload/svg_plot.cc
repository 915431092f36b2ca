#include "workload/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dsi::workload {
namespace {

const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.4g", v);
    return buf;
}

std::string esc(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '<') {
            o += "&lt;";
        } else if (c == '>') {
            o += "&gt;";
        } else if (c == '&') {
            o += "&amp;";
        } else {
            o += c;
        }
    }
    return o;
}

}  // namespace

std::string SvgPlot::render(int width_px, int height_px) const {
    const double left = 70, right = 170, top = 40, bottom = 60;
    const double pw = width_px - left - right;
    const double ph = height_px - top - bottom;
    double x_lo = 1e300, x_hi = -1e300, y_lo = y_min, y_hi = y_max;
    bool auto_y = y_max <= y_min;
    if (auto_y) {
        y_lo = 0;
        y_hi = -1e300;
    }
    for (const auto& s : series) {
        for (const auto& [x, y] : s.points) {
            const double xv = log_x ? std::log10(std::max(x, 1e-300)) : x;
            x_lo = std::min(x_lo, xv);
            x_hi = std::max(x_hi, xv);
            if (auto_y) {
                y_hi = std::max(y_hi, y);
                y_lo = std::min(y_lo, y);
            }
        }
    }
    for (const auto& [name, y] : h_lines) {
        if (auto_y) {
            y_hi = std::max(y_hi, y);
        }
    }
    if (y_hi <= y_lo) {
        y_hi = y_lo + 1;
    }
    if (auto_y) {
        y_hi *= 1.08;
    }
    if (bars) {
        x_lo = -0.5;
        x_hi = static_cast<double>(categories.size()) - 0.5;
    }
    if (x_hi <= x_lo) {
        x_hi = x_lo + 1;
    }
    auto X = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * pw; };
    auto Y = [&](double y) { return top + ph - (y - y_lo) / (y_hi - y_lo) * ph; };
    std::string o;
    o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width_px) +
         "\" height=\"" + std::to_string(height_px) +
         "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    o += "<text x=\"" + fmt(left + pw / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" +
         esc(title) + "</text>\n";
    o += "<rect x=\"" + fmt(left) + "\" y=\"" + fmt(top) + "\" width=\"" + fmt(pw) +
         "\" height=\"" + fmt(ph) + "\" fill=\"none\" stroke=\"#333\"/>\n";
    for (int i = 0; i <= 5; ++i) {  // y grid
        const double y = y_lo + (y_hi - y_lo) * i / 5;
        o += "<line x1=\"" + fmt(left) + "\" x2=\"" + fmt(left + pw) + "\" y1=\"" + fmt(Y(y)) +
             "\" y2=\"" + fmt(Y(y)) + "\" stroke=\"#ddd\"/>\n";
        o += "<text x=\"" + fmt(left - 6) + "\" y=\"" + fmt(Y(y) + 4) +
             "\" text-anchor=\"end\">" + fmt(y) + "</text>\n";
    }
    if (bars) {
        for (size_t c = 0; c < categories.size(); ++c) {
            o += "<text x=\"" + fmt(X(static_cast<double>(c))) + "\" y=\"" + fmt(top + ph + 18) +
                 "\" text-anchor=\"middle\">" + esc(categories[c]) + "</text>\n";
        }
    } else {
        for (int i = 0; i <= 5; ++i) {
            const double xv = x_lo + (x_hi - x_lo) * i / 5;
            o += "<text x=\"" + fmt(X(xv)) + "\" y=\"" + fmt(top + ph + 18) +
                 "\" text-anchor=\"middle\">" + fmt(log_x ? std::pow(10.0, xv) : xv) + "</text>\n";
        }
    }
    o += "<text x=\"" + fmt(left + pw / 2) + "\" y=\"" + fmt(height_px - 18.0) +
         "\" text-anchor=\"middle\">" + esc(x_label) + "</text>\n";
    o += "<text transform=\"translate(18," + fmt(top + ph / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + esc(y_label) + "</text>\n";
    const size_t ns = std::max<size_t>(1, series.size());
    // Data outside a fixed y range is clipped to the plot area.
    o += "<clipPath id=\"plot\"><rect x=\"" + fmt(left) + "\" y=\"" + fmt(top) + "\" width=\"" +
         fmt(pw) + "\" height=\"" + fmt(ph) + "\"/></clipPath>\n";
    for (size_t s = 0; s < series.size(); ++s) {
        const char* col = kColours[s % 6];
        o += "<g clip-path=\"url(#plot)\">\n";
        if (bars) {
            const double group_w = pw / std::max<size_t>(1, categories.size()) * 0.8;
            const double bw = group_w / ns;
            for (const auto& [x, y] : series[s].points) {
                const double x0 = X(x) - group_w / 2 + bw * s;
                o += "<rect x=\"" + fmt(x0) + "\" y=\"" + fmt(Y(y)) + "\" width=\"" + fmt(bw * 0.95) +
                     "\" height=\"" + fmt(std::max(0.0, Y(y_lo) - Y(y))) + "\" fill=\"" + col +
                     "\"><title>" + fmt(y) + "</title></rect>\n";
            }
        } else {
            std::string pts;
            for (const auto& [x, y] : series[s].points) {
                const double xv = log_x ? std::log10(std::max(x, 1e-300)) : x;
                pts += fmt(X(xv)) + "," + fmt(Y(y)) + " ";
                o += "<circle cx=\"" + fmt(X(xv)) + "\" cy=\"" + fmt(Y(y)) + "\" r=\"3\" fill=\"" +
                     col + "\"/>\n";
            }
            o += "<polyline fill=\"none\" stroke=\"" + std::string(col) +
                 "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
        }
        o += "</g>\n";
        o += "<rect x=\"" + fmt(left + pw + 12) + "\" y=\"" + fmt(top + 18.0 * s) +
             "\" width=\"12\" height=\"12\" fill=\"" + col + "\"/>\n";
        o += "<text x=\"" + fmt(left + pw + 30) + "\" y=\"" + fmt(top + 18.0 * s + 10) + "\">" +
             esc(series[s].name) + "</text>\n";
    }
    for (const auto& [name, y] : h_lines) {
        o += "<line x1=\"" + fmt(left) + "\" x2=\"" + fmt(left + pw) + "\" y1=\"" + fmt(Y(y)) +
             "\" y2=\"" + fmt(Y(y)) + "\" stroke=\"#555\" stroke-dasharray=\"6,4\"/>\n";
        o += "<text x=\"" + fmt(left + 4) + "\" y=\"" + fmt(Y(y) - 4) + "\" fill=\"#555\">" +
             esc(name) + "</text>\n";
    }
    o += "</svg>\n";
    return o;
}

}  // namespace dsi::workload
