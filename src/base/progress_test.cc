#include "base/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace dsi {
namespace {

std::string contents(std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[256];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
    return s;
}

TEST(Progress, FormatsAmountsRateAndTimeLeft) {
    EXPECT_EQ(Progress::format_line("gc", 0, 0, Progress::Unit::kItems, 0), "gc  0");
    EXPECT_EQ(Progress::format_line("gc", 50, 200, Progress::Unit::kItems, 5'000'000'000),
              "gc  50 / 200   25%  10.0/s  0:15 left");
    EXPECT_EQ(Progress::format_line("make-model", 3ll << 29, 3ll << 30, Progress::Unit::kBytes,
                                    2'000'000'000),
              "make-model  1.50 GiB / 3.00 GiB   50%  768.00 MiB/s  0:02 left");
    EXPECT_EQ(Progress::format_line("x", 10, 10, Progress::Unit::kItems, 61'000'000'000),
              "x  10 / 10  100%  0.2/s  done in 1:01");
}

TEST(Progress, HiddenProgressWritesNothing) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    FakeClockEnv env(1'000'000'000);
    {
        Progress p("quiet", 10, Progress::Unit::kItems, {.show = false, .env = &env, .out = f});
        for (int i = 0; i < 10; ++i) {
            env.advance_ns(1'000'000'000);
            p.advance(1);
        }
        EXPECT_EQ(p.done(), 10);
    }
    EXPECT_EQ(contents(f), "");
    std::fclose(f);
}

TEST(Progress, RedrawsAtMostOncePerIntervalAndEndsWithANewline) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    FakeClockEnv env(1'000'000'000);
    {
        Progress p("items", 100, Progress::Unit::kItems,
                   {.show = true, .redraw_interval_ns = 1'000'000'000, .env = &env, .out = f});
        for (int i = 0; i < 100; ++i) {
            env.advance_ns(100'000'000);  // 10 advances per redraw interval
            p.advance(1);
        }
        p.finish();
        p.finish();  // once only
    }
    const std::string out = contents(f);
    size_t redraws = 0;
    for (char c : out) redraws += c == '\r';
    EXPECT_GE(redraws, 9u);
    EXPECT_LE(redraws, 11u);
    EXPECT_EQ(out.back(), '\n');
    EXPECT_EQ(out.find('\n'), out.size() - 1);
    EXPECT_NE(out.find("items  100 / 100  100%"), std::string::npos);
    std::fclose(f);
}

}  // namespace
}  // namespace dsi
