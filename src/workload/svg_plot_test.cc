#include "workload/svg_plot.h"

#include <gtest/gtest.h>

namespace dsi::workload {
namespace {

TEST(SvgPlotTest, RendersLinesAndBars) {
    SvgPlot p;
    p.title = "a < b";
    p.series = {{"s1", {{1, 2}, {10, 3}}}, {"s2", {{1, 1}, {10, 4}}}};
    p.log_x = true;
    p.h_lines = {{"goal", 3.5}};
    const std::string svg = p.render();
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_NE(svg.find("a &lt; b"), std::string::npos);
    EXPECT_NE(svg.find("polyline"), std::string::npos);
    SvgPlot b;
    b.bars = true;
    b.categories = {"x", "y"};
    b.series = {{"s", {{0, 1}, {1, 2}}}};
    EXPECT_NE(b.render().find("<rect"), std::string::npos);
}

}  // namespace
}  // namespace dsi::workload
