#include "kvstore/internal/resp_reader.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace dsi::kvstore::internal {
namespace {

// A connected socket pair: the test writes replies on one end, the reader reads the
// other (with a receive timeout, so a short input fails instead of hanging).
class RespReaderTest : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
        struct timeval tv = {0, 200'000};
        ASSERT_EQ(::setsockopt(fds_[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    }
    void TearDown() override {
        ::close(fds_[0]);
        if (fds_[1] >= 0) ::close(fds_[1]);
    }
    void send_bytes(const std::string& s) {
        ASSERT_EQ(::write(fds_[1], s.data(), s.size()), static_cast<ssize_t>(s.size()));
    }
    void close_writer() {
        ::close(fds_[1]);
        fds_[1] = -1;
    }
    // Reads one reply for a 5-byte target from `bytes`; the result of the reader.
    bool one(const std::string& bytes, size_t max_bulk = 1 << 20) {
        send_bytes(bytes);
        close_writer();
        std::vector<uint8_t> dst(5);
        RespTarget t;
        t.dst = dst;
        return read_resp_replies(fds_[0], std::span(&t, 1), max_bulk);
    }
    int fds_[2] = {-1, -1};
};

std::string bulk(const std::string& payload) {
    return "$" + std::to_string(payload.size()) + "\r\n" + payload + "\r\n";
}

TEST_F(RespReaderTest, DeliversBulksAndSkipsEverythingElse) {
    const std::string prefix("\x01\x02\x03\x04\x05\x06\x07\x08", 8);
    send_bytes(bulk(prefix + "hello") + ":1\r\n" + "$-1\r\n" + "+OK\r\n" + "-ERR no\r\n" +
               bulk("abc") + bulk(prefix + "world"));
    std::vector<uint8_t> a(5), b(5), c(5), d(5);
    std::vector<RespTarget> t(7);
    t[0].dst = a;
    t[2].dst = b;  // nil
    t[5].dst = c;  // a bulk of another size
    t[6].dst = d;
    ASSERT_TRUE(read_resp_replies(fds_[0], t, 1 << 20));
    EXPECT_EQ(t[0].got, RespTarget::Got::kFilled);
    EXPECT_EQ(std::string(a.begin(), a.end()), "hello");
    uint64_t want = 0;
    std::memcpy(&want, prefix.data(), 8);
    EXPECT_EQ(t[0].prefix, want);
    EXPECT_EQ(t[1].got, RespTarget::Got::kNothing);
    EXPECT_EQ(t[2].got, RespTarget::Got::kNothing);
    EXPECT_EQ(t[3].got, RespTarget::Got::kNothing);
    EXPECT_EQ(t[4].got, RespTarget::Got::kNothing);
    EXPECT_EQ(t[5].got, RespTarget::Got::kOtherBulk);
    EXPECT_EQ(t[6].got, RespTarget::Got::kFilled);
    EXPECT_EQ(std::string(d.begin(), d.end()), "world");
}

// Bulks far larger than the reader's stage, written in odd pieces by another thread.
TEST_F(RespReaderTest, LargeBulksArriveInPieces) {
    std::vector<std::string> payloads;
    std::string all;
    for (int i = 0; i < 3; ++i) {
        std::string p(8 + 300'000 + i, '\0');
        for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<char>(j * 31 + i);
        payloads.push_back(p);
        all += bulk(p) + ":0\r\n";
    }
    std::thread writer([&] {
        for (size_t off = 0; off < all.size();) {
            size_t n = std::min<size_t>(7777, all.size() - off);
            if (::write(fds_[1], all.data() + off, n) != static_cast<ssize_t>(n)) return;
            off += n;
        }
    });
    std::vector<std::vector<uint8_t>> dst(3);
    std::vector<RespTarget> t(6);
    for (int i = 0; i < 3; ++i) {
        dst[i].resize(payloads[i].size() - 8);
        t[2 * i].dst = dst[i];
    }
    EXPECT_TRUE(read_resp_replies(fds_[0], t, 1 << 20));
    writer.join();
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(t[2 * i].got, RespTarget::Got::kFilled);
        EXPECT_EQ(0, std::memcmp(dst[i].data(), payloads[i].data() + 8, dst[i].size())) << i;
    }
}

TEST_F(RespReaderTest, UnknownType) { EXPECT_FALSE(one("!x\r\n")); }
TEST_F(RespReaderTest, ArraysAreNotExpected) { EXPECT_FALSE(one("*1\r\n$1\r\na\r\n")); }
TEST_F(RespReaderTest, BadLength) { EXPECT_FALSE(one("$abc\r\nxyz\r\n")); }
TEST_F(RespReaderTest, NegativeLength) { EXPECT_FALSE(one("$-2\r\n")); }
TEST_F(RespReaderTest, EmptyLine) { EXPECT_FALSE(one("\r\n")); }
TEST_F(RespReaderTest, MissingCrlfAfterBulk) { EXPECT_FALSE(one("$13\r\n0123456789abcXY")); }
TEST_F(RespReaderTest, BulkOverTheLimit) { EXPECT_FALSE(one("$2000000\r\n", 1 << 20)); }
TEST_F(RespReaderTest, EofMidBulk) { EXPECT_FALSE(one("$13\r\n01234")); }
TEST_F(RespReaderTest, EofBeforeAnyReply) { EXPECT_FALSE(one("")); }
TEST_F(RespReaderTest, BytesAfterTheLastReply) { EXPECT_FALSE(one(":1\r\n:2\r\n")); }
TEST_F(RespReaderTest, EndlessLine) { EXPECT_FALSE(one(std::string(10'000, '+'))); }

TEST_F(RespReaderTest, SilentPeerTimesOut) {
    std::vector<uint8_t> dst(5);
    RespTarget t;
    t.dst = dst;
    EXPECT_FALSE(read_resp_replies(fds_[0], std::span(&t, 1), 1 << 20));  // SO_RCVTIMEO 0.2 s
}

}  // namespace
}  // namespace dsi::kvstore::internal
