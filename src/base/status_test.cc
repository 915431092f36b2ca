#include "base/status.h"

#include <gtest/gtest.h>

#include <memory>

#include "base/logging.h"

namespace dsi {
namespace {

Result<int> parse_positive(int x) {
    if (x <= 0) return invalid_argument("not positive: " + std::to_string(x));
    return x;
}

Result<int> doubled(int x) {
    DSI_ASSIGN_OR_RETURN(int v, parse_positive(x));
    return 2 * v;
}

Status check_all(int a, int b) {
    DSI_RETURN_IF_ERROR(parse_positive(a).status());
    DSI_RETURN_IF_ERROR(parse_positive(b).status().with_context("second"));
    return Status::ok();
}

TEST(StatusTest, CodesMapToHttp) {
    EXPECT_EQ(http_status(StatusCode::kInvalidArgument), 400);
    EXPECT_EQ(http_status(StatusCode::kNotFound), 404);
    EXPECT_EQ(http_status(StatusCode::kResourceExhausted), 429);
    EXPECT_EQ(http_status(StatusCode::kUnavailable), 503);
    EXPECT_EQ(http_status(StatusCode::kDeadlineExceeded), 504);
    EXPECT_EQ(http_status(StatusCode::kCancelled), 499);
}

TEST(StatusTest, ToStringAndContext) {
    Status s = data_loss("truncated");
    EXPECT_FALSE(s.is_ok());
    EXPECT_EQ(s.to_string(), "DATA_LOSS: truncated");
    EXPECT_EQ(s.with_context("file.bin").message(), "file.bin: truncated");
    EXPECT_EQ(Status::ok().to_string(), "OK");
}

TEST(StatusTest, ResultPropagates) {
    EXPECT_EQ(doubled(4).value(), 8);
    Result<int> r = doubled(-1);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("-1"), std::string::npos);
    EXPECT_TRUE(check_all(1, 2).is_ok());
    Status s = check_all(1, 0);
    EXPECT_EQ(s.message(), "second: not positive: 0");
}

TEST(StatusTest, ResultHoldsMoveOnly) {
    Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
    ASSERT_TRUE(r.is_ok());
    std::unique_ptr<int> p = std::move(r).value();
    EXPECT_EQ(*p, 7);
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
    Result<int> r = not_found("x");
    EXPECT_DEATH((void)r.value(), "Result::value on error");
}

TEST(StatusDeathTest, CheckAbortsWithMessage) {
    int n = 3;
    EXPECT_DEATH(DSI_CHECK(n == 4, "n was ", n), "n == 4 n was 3");
}

TEST(LoggingTest, ParseLevel) {
    EXPECT_EQ(parse_log_level("debug").value(), LogLevel::kDebug);
    EXPECT_EQ(parse_log_level("error").value(), LogLevel::kError);
    EXPECT_FALSE(parse_log_level("loud").is_ok());
}

}  // namespace
}  // namespace dsi
