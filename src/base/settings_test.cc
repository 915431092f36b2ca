#include "base/settings.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace dsi {
namespace {

TEST(SettingsTest, EnvName) {
    EXPECT_EQ(setting_env_name("--batch-invariant"), "DSINFER_BATCH_INVARIANT");
    EXPECT_EQ(setting_env_name("--use-nextn-decode"), "DSINFER_USE_NEXTN_DECODE");
}

TEST(SettingsTest, FlagBeatsEnvBeatsDefault) {
    ::setenv("DSINFER_MAX_TOKENS", "17", 1);
    {
        CLI::App app;
        int max_tokens = 5;
        add_setting(app, "--max-tokens", max_tokens, "limit");
        const char* argv[] = {"prog"};
        app.parse(1, const_cast<char**>(argv));
        EXPECT_EQ(max_tokens, 17);
    }
    {
        CLI::App app;
        int max_tokens = 5;
        add_setting(app, "--max-tokens", max_tokens, "limit");
        const char* argv[] = {"prog", "--max-tokens", "3"};
        app.parse(3, const_cast<char**>(argv));
        EXPECT_EQ(max_tokens, 3);
    }
    ::unsetenv("DSINFER_MAX_TOKENS");
    {
        CLI::App app;
        int max_tokens = 5;
        add_setting(app, "--max-tokens", max_tokens, "limit");
        const char* argv[] = {"prog"};
        app.parse(1, const_cast<char**>(argv));
        EXPECT_EQ(max_tokens, 5);
    }
}

TEST(SettingsTest, SwitchFromEnv) {
    ::setenv("DSINFER_BATCH_INVARIANT", "1", 1);
    CLI::App app;
    bool inv = false;
    add_switch(app, "--batch-invariant", inv, "invariant kernels");
    const char* argv[] = {"prog"};
    app.parse(1, const_cast<char**>(argv));
    EXPECT_TRUE(inv);
    ::unsetenv("DSINFER_BATCH_INVARIANT");
}

TEST(SettingsTest, BadValueIsAnError) {
    CLI::App app;
    int n = 0;
    add_setting(app, "--num", n, "a number");
    const char* argv[] = {"prog", "--num", "abc"};
    EXPECT_THROW(app.parse(3, const_cast<char**>(argv)), CLI::ParseError);
}

}  // namespace
}  // namespace dsi
