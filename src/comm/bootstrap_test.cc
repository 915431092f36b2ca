// The UCX group's bootstrap messages (internal/bootstrap.h), without sockets: a join
// frame and the answers round-trip; a frame of another version still names it; short,
// long and foreign frames are refused; an error answer keeps its code, and a code that
// is no StatusCode (256 would wrap to OK) is refused; frames put together from bytes as
// they come. The formation over sockets with strays at the coordinator (threads, no UCX);
// with UCX and ranks as processes it is in ucx_group_test.
#include "comm/internal/bootstrap.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "base/clock.h"

namespace dsi::comm::internal {
namespace {

MoeShape shape() {
    return {
        .num_ranks = 2, .hidden = 64, .top_k = 2, .max_tokens_per_rank = 16, .slots_per_rank = 8};
}

TEST(Bootstrap, AJoinFrameRoundTrips) {
    const std::vector<uint8_t> address = {1, 2, 3, 0, 255};
    const std::vector<uint8_t> frame = encode_join(1, shape(), address);
    Result<JoinMessage> m = decode_join(frame);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(m->version, 1u);
    EXPECT_EQ(m->rank, 1u);
    EXPECT_EQ(m->shape, (std::vector<int64_t>{2, 64, 2, 16, 8, shape().recv_capacity()}));
    EXPECT_EQ(m->address, address);

    std::vector<uint8_t> longer = frame;
    longer.push_back(0);
    EXPECT_FALSE(decode_join(longer).is_ok());
    for (size_t n : {size_t{0}, size_t{3}, size_t{12}, frame.size() - 1}) {
        EXPECT_FALSE(
            decode_join({frame.begin(), frame.begin() + static_cast<ptrdiff_t>(n)}).is_ok())
            << n;
    }
    std::vector<uint8_t> foreign = frame;
    foreign[0] ^= 1;  // the magic
    EXPECT_FALSE(decode_join(foreign).is_ok());
    // Version 2, whatever follows: its version and rank, for the coordinator's error.
    std::vector<uint8_t> v2(frame.begin(), frame.begin() + 12);
    v2[4] = 2;
    v2.push_back(7);
    m = decode_join(v2);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(m->version, 2u);
    EXPECT_EQ(m->rank, 1u);
}

TEST(Bootstrap, AnswersRoundTripAndBadOnesAreInternal) {
    const std::vector<std::vector<uint8_t>> table = {{1, 2}, {}, {3}};
    Result<std::vector<std::vector<uint8_t>>> got = decode_answer(encode_table(table), 3, "h:1");
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(*got, table);
    // A table of another size than the group's.
    EXPECT_EQ(decode_answer(encode_table(table), 4, "h:1").status().code(), StatusCode::kInternal);
    EXPECT_EQ(decode_answer(encode_table(table), 2, "h:1").status().code(), StatusCode::kInternal);

    const Status error = failed_precondition("ucx group: layout differs");
    got = decode_answer(encode_error(error), 3, "h:1");
    EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(got.status().message(), error.message());

    for (uint32_t code : {256u, 15u, 0xffffffffu}) {
        std::vector<uint8_t> bad = encode_error(error);
        for (size_t i = 0; i < 4; ++i) {
            bad[i] = static_cast<uint8_t>(code >> (8 * i));
        }
        got = decode_answer(bad, 3, "h:1");
        EXPECT_EQ(got.status().code(), StatusCode::kInternal) << code;
        EXPECT_NE(got.status().message().find("h:1"), std::string::npos);
    }
    EXPECT_EQ(decode_answer({}, 3, "h:1").status().code(), StatusCode::kInternal);
    // A table whose (OK) status carries a message (fuzz_bootstrap's first finding).
    std::vector<uint8_t> with_message = {0, 0, 0, 0, 2, 0, 0, 0, ';', 0};
    EXPECT_EQ(decode_answer(with_message, 0, "h:1").status().code(), StatusCode::kInternal);
    with_message.resize(8);
    with_message[4] = 0;
    EXPECT_TRUE(decode_answer(with_message, 0, "h:1").is_ok());
}

TEST(Bootstrap, CoordinatorAddresses) {
    EXPECT_EQ(parse_host_port("10.0.0.1:29500")->port, 29500);
    EXPECT_EQ(parse_host_port("[::1]:7")->host, "::1");
    EXPECT_TRUE(parse_host_port("h:0", /*allow_zero=*/true).is_ok());
    for (const char* bad :
         {"", "h", ":1", "h:", "h:0", "h:65536", "h:1x", "[::1]", "[::1]7", "[]:1"}) {
        EXPECT_FALSE(parse_host_port(bad).is_ok()) << bad;
    }
}

TEST(Bootstrap, FramesAssembleByteByByteAndBadHeadersAreRefused) {
    const std::vector<uint8_t> body = {9, 8, 7, 6, 5};
    std::vector<uint8_t> wire = {5, 0, 0, 0};
    wire.insert(wire.end(), body.begin(), body.end());
    wire.insert(wire.end(), {0, 0, 0, 0});  // a second, empty frame
    FrameAssembler a(16);
    std::vector<std::vector<uint8_t>> frames;
    for (uint8_t b : wire) {
        ASSERT_FALSE(a.space().empty());
        a.space()[0] = b;
        ASSERT_TRUE(a.received(1).is_ok());
        if (a.done()) frames.push_back(a.take());
    }
    EXPECT_EQ(frames, (std::vector<std::vector<uint8_t>>{body, {}}));
    EXPECT_FALSE(a.done());

    FrameAssembler small(4);
    const std::vector<uint8_t> header = {5, 0, 0, 0};
    std::copy(header.begin(), header.end(), small.space().begin());
    EXPECT_EQ(small.received(4).code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(small.done());
    EXPECT_FALSE(small.space().empty());
}

// A client connected to rank 0's coordinator port; `say` is written, then it stays
// connected until destroyed.
struct Stray {
    int fd = -1;
    Stray(const HostPort& at, const std::vector<uint8_t>& say) {
        Result<int> c = connect_with_retry(at, steady_clock_ns() + 5'000'000'000);
        EXPECT_TRUE(c.is_ok()) << c.status().to_string();
        fd = c.is_ok() ? *c : -1;
        if (fd >= 0 && !say.empty()) {
            EXPECT_EQ(::send(fd, say.data(), say.size(), MSG_NOSIGNAL),
                      static_cast<ssize_t>(say.size()));
        }
    }
    ~Stray() {
        if (fd >= 0) ::close(fd);
    }
};

// Strays at the coordinator -- one silent, one that sends half a header, one that
// announces a 4 GiB frame, one that sends a frame that is no join -- connect before the
// ranks; the group still forms (read one by one, the silent one held rank 0 until the
// attach deadline, and the group failed DEADLINE_EXCEEDED).
TEST(Bootstrap, StraysAtTheCoordinatorHoldNobodyUp) {
    const HostPort at{"127.0.0.1", pick_free_port("127.0.0.1").value()};
    UcxGroupOptions o;
    o.coordinator = at.host + ":" + std::to_string(at.port);
    o.shape = {
        .num_ranks = 3, .hidden = 64, .top_k = 2, .max_tokens_per_rank = 16, .slots_per_rank = 8};
    o.attach_timeout_ms = 20'000;  // what a silent stray cost before: the whole of it
    const int64_t deadline = steady_clock_ns() + o.attach_timeout_ms * 1'000'000;
    Result<std::vector<std::vector<uint8_t>>> table0 = internal_error("not run");
    std::thread rank0([&] { table0 = exchange_worker_addresses(o, at, {0, 0}, deadline); });
    std::vector<std::unique_ptr<Stray>> strays;
    strays.push_back(std::make_unique<Stray>(at, std::vector<uint8_t>{}));
    strays.push_back(std::make_unique<Stray>(at, std::vector<uint8_t>{7, 0}));
    strays.push_back(std::make_unique<Stray>(at, std::vector<uint8_t>{255, 255, 255, 255}));
    strays.push_back(std::make_unique<Stray>(at, std::vector<uint8_t>{3, 0, 0, 0, 1, 2, 3}));
    std::vector<Result<std::vector<std::vector<uint8_t>>>> tables(2, internal_error("not run"));
    std::vector<std::thread> ranks;
    for (int r = 1; r <= 2; ++r) {
        ranks.emplace_back([&, r] {
            UcxGroupOptions mine = o;
            mine.rank = r;
            tables[static_cast<size_t>(r - 1)] = exchange_worker_addresses(
                mine, at, {static_cast<uint8_t>(r), static_cast<uint8_t>(r)}, deadline);
        });
    }
    for (std::thread& t : ranks) t.join();
    rank0.join();
    const std::vector<std::vector<uint8_t>> want = {{0, 0}, {1, 1}, {2, 2}};
    ASSERT_TRUE(table0.is_ok()) << table0.status().to_string();
    EXPECT_EQ(*table0, want);
    for (const auto& t : tables) {
        ASSERT_TRUE(t.is_ok()) << t.status().to_string();
        EXPECT_EQ(*t, want);
    }
}

// The launcher's word that the group is abandoned ends rank 0's wait for joins and a
// rank's wait for the coordinator with UNAVAILABLE (the attach deadline is far off).
TEST(Bootstrap, AnAbandonedGroupEndsTheWaitsAtOnce) {
    const HostPort at{"127.0.0.1", pick_free_port("127.0.0.1").value()};
    std::atomic<bool> abandoned{false};
    UcxGroupOptions o;
    o.coordinator = at.host + ":" + std::to_string(at.port);
    o.shape = {
        .num_ranks = 3, .hidden = 64, .top_k = 2, .max_tokens_per_rank = 16, .slots_per_rank = 8};
    o.attach_timeout_ms = 600'000;
    o.abandoned = [&] { return abandoned.load(); };
    const int64_t deadline = steady_clock_ns() + o.attach_timeout_ms * 1'000'000;
    Result<std::vector<std::vector<uint8_t>>> table0 = internal_error("not run");
    std::thread rank0([&] { table0 = exchange_worker_addresses(o, at, {0}, deadline); });
    UcxGroupOptions one = o;
    one.rank = 1;
    Result<std::vector<std::vector<uint8_t>>> table1 = internal_error("not run");
    std::thread rank1([&] { table1 = exchange_worker_addresses(one, at, {1}, deadline); });
    abandoned = true;  // rank 2 never comes
    rank0.join();
    rank1.join();
    EXPECT_EQ(table0.status().code(), StatusCode::kUnavailable) << table0.status().to_string();
    // Rank 1 hears rank 0's error, or stops waiting for rank 0 to listen.
    EXPECT_EQ(table1.status().code(), StatusCode::kUnavailable) << table1.status().to_string();
    EXPECT_EQ(connect_with_retry(at, deadline, o.abandoned).status().code(),
              StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dsi::comm::internal
