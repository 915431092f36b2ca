#include "base/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace dsi {
namespace {

std::string temp_dir() {
    const char* t = std::getenv("TMPDIR");
    std::string dir = std::string(t ? t : "/tmp") + "/dsi_env_test_" + std::to_string(::getpid());
    EXPECT_TRUE(Env::default_env()->create_dirs(dir).is_ok());
    return dir;
}

TEST(EnvTest, WriteReadMap) {
    Env* env = Env::default_env();
    std::string path = temp_dir() + "/f.bin";
    ASSERT_TRUE(env->write_file(path, std::string("hello\0world", 11)).is_ok());
    EXPECT_TRUE(env->file_exists(path));
    EXPECT_EQ(env->file_size(path).value(), 11u);
    EXPECT_EQ(env->read_file(path).value(), std::string("hello\0world", 11));
    Result<MappedFile> m = env->map_file(path);
    ASSERT_TRUE(m.is_ok());
    EXPECT_EQ(m->size(), 11u);
    EXPECT_EQ(m->data()[6], 'w');
    MappedFile moved = std::move(m).value();
    EXPECT_EQ(moved.bytes().size(), 11u);
}

TEST(EnvTest, MissingFileIsNotFound) {
    Env* env = Env::default_env();
    EXPECT_EQ(env->read_file("/nonexistent/dsi/x").status().code(), StatusCode::kNotFound);
    EXPECT_EQ(env->map_file("/nonexistent/dsi/x").status().code(), StatusCode::kNotFound);
    EXPECT_FALSE(env->file_exists("/nonexistent/dsi/x"));
}

TEST(EnvTest, ClockIsMonotonic) {
    Env* env = Env::default_env();
    int64_t a = env->now_ns();
    int64_t b = env->now_ns();
    EXPECT_LE(a, b);
    EXPECT_GE(env->num_cpus(), 1);
}

TEST(EnvTest, FakeClockAdvancesOnlyByHand) {
    FakeClockEnv env(100);
    EXPECT_EQ(env.now_ns(), 100);
    env.advance_ns(50);
    EXPECT_EQ(env.now_ns(), 150);
    env.sleep_ns(10);
    EXPECT_EQ(env.now_ns(), 160);
}

TEST(SplitMixTest, DeterministicAndSpread) {
    SplitMix64 a(1), b(1), c(2);
    uint64_t x = a.next();
    EXPECT_EQ(x, b.next());
    EXPECT_NE(x, c.next());
    double sum = 0, sum2 = 0;
    SplitMix64 g(7);
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
        double v = g.next_normal();
        sum += v;
        sum2 += v * v;
    }
    EXPECT_NEAR(sum / n, 0.0, 0.05);
    EXPECT_NEAR(sum2 / n, 1.0, 0.05);
}

}  // namespace
}  // namespace dsi
