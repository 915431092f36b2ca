// main() of every dsi_test binary. GoogleTest's own main returns 0 when a test calls
// GTEST_SKIP, so ctest would count the skip as a pass. Here a run in which nothing failed
// but something skipped exits with kSkippedExitCode; dsi_test sets ctest's
// SKIP_RETURN_CODE to it, so ctest prints the test as "Skipped" (and scripts/test.sh,
// the CI entry point, fails when any test skipped).
#include <gtest/gtest.h>

namespace {

// Must equal DSI_TEST_SKIP_RETURN_CODE in cmake/dsinfer.cmake (the Automake convention).
constexpr int kSkippedExitCode = 77;

}  // namespace

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    const int rc = RUN_ALL_TESTS();
    if (rc == 0 && ::testing::UnitTest::GetInstance()->skipped_test_count() > 0) {
        return kSkippedExitCode;
    }
    return rc;
}
