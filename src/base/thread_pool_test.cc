#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace dsi {
namespace {

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
    for (int threads : {1, 2, 3, 5}) {
        ThreadPool pool(threads);
        for (int64_t n : {1, 7, 64, 1000}) {
            std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
            pool.parallel_for(n, 4, [&](int64_t b, int64_t e) {
                EXPECT_EQ(b % 4, 0);
                for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
            });
            for (auto& h : hits) EXPECT_EQ(h.load(), 1);
        }
    }
}

TEST(ThreadPoolTest, ManyRoundsNoDeadlock) {
    ThreadPool pool(2);
    std::atomic<int64_t> sum{0};
    for (int r = 0; r < 2000; ++r) {
        pool.parallel_for(10, 1, [&](int64_t b, int64_t e) { sum += e - b; });
    }
    EXPECT_EQ(sum.load(), 20000);
}

}  // namespace
}  // namespace dsi
