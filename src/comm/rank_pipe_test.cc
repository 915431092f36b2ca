// RankPipe: framed messages both ways without blocking, a message larger than the socket
// buffer arrives whole over several flushes, a peer's death is end of stream (a message it
// cut is dropped) or UNAVAILABLE on send, and a non-socket fd is refused.
#include "comm/rank_pipe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace dsi::comm {
namespace {

std::unique_ptr<RankPipe> adopt_child(RankPipe::Pair& p) {
    Result<std::unique_ptr<RankPipe>> c = RankPipe::adopt(p.child_fd);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    p.child_fd = -1;
    return std::move(c).value();
}

TEST(RankPipeTest, MessagesArriveWholeAndInOrderBothWays) {
    RankPipe::Pair p = RankPipe::create_pair().value();
    std::unique_ptr<RankPipe> child = adopt_child(p);
    ASSERT_TRUE(p.parent->send("one").is_ok());
    ASSERT_TRUE(p.parent->send("").is_ok());
    ASSERT_TRUE(p.parent->send("three").is_ok());
    ASSERT_TRUE(child->send("back").is_ok());
    std::vector<std::string> got;
    ASSERT_TRUE(child->receive(got).value());
    EXPECT_EQ(got, (std::vector<std::string>{"one", "", "three"}));
    got.clear();
    ASSERT_TRUE(p.parent->receive(got).value());
    EXPECT_EQ(got, std::vector<std::string>{"back"});
    got.clear();
    ASSERT_TRUE(p.parent->receive(got).value());  // nothing new: not an end of stream
    EXPECT_TRUE(got.empty());
}

TEST(RankPipeTest, ALargeMessageNeverBlocksTheSenderAndArrivesWhole) {
    RankPipe::Pair p = RankPipe::create_pair().value();
    std::unique_ptr<RankPipe> child = adopt_child(p);
    std::string big(8 << 20, 'x');
    for (size_t i = 0; i < big.size(); i += 4093) big[i] = static_cast<char>('a' + i % 26);
    ASSERT_TRUE(p.parent->send(big).is_ok());  // returns with most of it still queued
    EXPECT_TRUE(p.parent->has_pending_output());
    ASSERT_TRUE(p.parent->send("after").is_ok());
    std::vector<std::string> got;
    for (int i = 0; i < 100000 && got.size() < 2; ++i) {
        ASSERT_TRUE(child->receive(got).value());
        ASSERT_TRUE(p.parent->flush().is_ok());
    }
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(got[0] == big);
    EXPECT_EQ(got[1], "after");
    EXPECT_FALSE(p.parent->has_pending_output());
}

TEST(RankPipeTest, APeerThatClosesIsEndOfStreamAndItsCutMessageIsDropped) {
    RankPipe::Pair p = RankPipe::create_pair().value();
    // The child writes one whole message and half of another, then dies.
    const unsigned char whole[] = {2, 0, 0, 0, 'o', 'k', 9, 0, 0, 0, 'c', 'u'};
    ASSERT_EQ(::write(p.child_fd, whole, sizeof whole), static_cast<ssize_t>(sizeof whole));
    ::close(p.child_fd);
    std::vector<std::string> got;
    EXPECT_FALSE(p.parent->receive(got).value());
    EXPECT_EQ(got, std::vector<std::string>{"ok"});
    Status s = p.parent->send("anyone?");
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
}

TEST(RankPipeTest, AMalformedLengthIsAnError) {
    RankPipe::Pair p = RankPipe::create_pair().value();
    const unsigned char bad[] = {0xff, 0xff, 0xff, 0x7f};
    ASSERT_EQ(::write(p.child_fd, bad, sizeof bad), static_cast<ssize_t>(sizeof bad));
    std::vector<std::string> got;
    Result<bool> r = p.parent->receive(got);
    EXPECT_EQ(r.status().code(), StatusCode::kInternal);
    ::close(p.child_fd);
}

TEST(RankPipeTest, AdoptRefusesWhatIsNotASocket) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    Result<std::unique_ptr<RankPipe>> r = RankPipe::adopt(fds[0]);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("not an open stream socket"), std::string::npos);
    ::close(fds[0]);
    ::close(fds[1]);
    EXPECT_EQ(RankPipe::adopt(-1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsi::comm
