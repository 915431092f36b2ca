#include "sampling/stop.h"

#include <gtest/gtest.h>

namespace dsi {
namespace {

std::string run(StopMatcher& m, std::initializer_list<std::string_view> pieces, bool* stopped) {
    std::string out;
    *stopped = false;
    for (std::string_view p : pieces) {
        auto r = m.push(p);
        out += r.text;
        if (r.stopped) {
            *stopped = true;
            return out;
        }
    }
    return out + m.flush();
}

TEST(StopMatcherTest, MatchesAcrossPieces) {
    StopMatcher m({"</end>"});
    bool stopped;
    EXPECT_EQ(run(m, {"hello </", "en", "d> tail"}, &stopped), "hello ");
    EXPECT_TRUE(stopped);
}

TEST(StopMatcherTest, HoldsBackOnlyPossiblePrefixes) {
    StopMatcher m({"abc"});
    auto r = m.push("xxab");
    EXPECT_EQ(r.text, "xx");
    r = m.push("d");  // "abd" cannot start "abc"
    EXPECT_EQ(r.text, "abd");
    EXPECT_FALSE(r.stopped);
}

TEST(StopMatcherTest, EarliestOfSeveralWinsAndNoStopFlushes) {
    StopMatcher m({"world", "lo w"});
    bool stopped;
    EXPECT_EQ(run(m, {"hel", "lo world"}, &stopped), "hel");
    EXPECT_TRUE(stopped);
    StopMatcher n({"zz", ""});
    EXPECT_EQ(run(n, {"a", "z"}, &stopped), "az");
    EXPECT_FALSE(stopped);
}

}  // namespace
}  // namespace dsi
