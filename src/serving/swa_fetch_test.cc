// The remote SWA-state pull over transfer/: a good fetch, a missing key, damaged frames
// either way (digest), a broken seal, a wrong size, a holder that is gone or silent.
#include "serving/swa_fetch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "kv/tiered_cache.h"
#include "transfer/fault_transport.h"

namespace dsi::serving {
namespace {

constexpr size_t kSlotBytes = 4000;

kv::SwaStateKey key(uint64_t k, int64_t position = 256) { return {kv::BlockKey{k, ~k}, position}; }

// A sealed state of kSlotBytes + the seal, as the engine stores it.
std::vector<uint8_t> sealed(int64_t position, uint8_t fill) {
    std::vector<uint8_t> b(kSlotBytes);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(fill + i * 7);
    kv::swa_seal(b, position);
    return b;
}

class SwaFetchTest : public ::testing::Test {
protected:
    SwaFetchServerOptions holder_options(transfer::Timeout io_timeout = transfer::Timeout(2'000),
                                         int max_connections = 4, int max_waiting = 16) {
        SwaFetchServerOptions o;
        o.host = "127.0.0.1";
        o.incarnation = 7;
        o.pool = &holder_pool_;
        o.io_timeout = io_timeout;
        o.max_connections = max_connections;
        o.max_waiting = max_waiting;
        return o;
    }
    void start_holder(std::unique_ptr<transfer::Transport> transport = nullptr) {
        start_holder(holder_options(), std::move(transport));
    }
    void start_holder(const SwaFetchServerOptions& o,
                      std::unique_ptr<transfer::Transport> transport = nullptr) {
        auto s = SwaFetchServer::start(o, std::move(transport));
        ASSERT_TRUE(s.is_ok()) << s.status().to_string();
        server_ = std::move(s).value();
    }
    SwaPullTarget target(const kv::SwaStateKey& k) const {
        return {"127.0.0.1:" + std::to_string(server_->port()), k};
    }
    SwaFetchOptions options() const {
        SwaFetchOptions o;
        o.incarnation = 9;
        o.state_bytes = kSlotBytes + kv::kSwaSealBytes;
        o.timeout = transfer::Timeout(2000);
        return o;
    }
    // The holder counts a connection after the puller has its answer: wait until it has
    // counted `total` of them (or 5 s) before reading its stats.
    SwaFetchServerStats settled_stats(int64_t total) const {
        return stats_when([&](const SwaFetchServerStats& s) {
            return s.num_served + s.num_not_found + s.num_failed + s.num_refused >= total;
        });
    }
    // The holder's stats once `pred` holds of them (or after 5 s).
    template <class Pred>
    SwaFetchServerStats stats_when(Pred pred) const {
        for (int i = 0; i < 500; ++i) {
            const SwaFetchServerStats s = server_->stats();
            if (pred(s)) return s;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return server_->stats();
    }
    // A puller that connects and sends nothing.
    std::unique_ptr<transfer::Connection> silent_puller() {
        auto c = tcp_->connect("127.0.0.1", server_->port(), transfer::Timeout(2000));
        EXPECT_TRUE(c.is_ok()) << c.status().to_string();
        return c.is_ok() ? std::move(c).value() : nullptr;
    }

    kv::SwaStatePool holder_pool_{int64_t{1} << 20};
    std::unique_ptr<transfer::Transport> tcp_ = transfer::make_tcp_transport();
    std::unique_ptr<SwaFetchServer> server_;
};

TEST_F(SwaFetchTest, APulledStateEqualsTheHoldersAndAMissingOneIsNotFound) {
    start_holder();
    ASSERT_TRUE(holder_pool_.put(key(1), kvstore::TrafficClass::kAgent, sealed(256, 3)).is_ok());
    Result<kv::SwaState> got = fetch_swa_state(*tcp_, target(key(1)), options());
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(got->key, key(1));
    EXPECT_EQ(got->traffic_class, kvstore::TrafficClass::kAgent);
    EXPECT_EQ(got->bytes, sealed(256, 3));
    // The same chain key at another position, and another key: not held.
    EXPECT_EQ(fetch_swa_state(*tcp_, target(key(1, 384)), options()).status().code(),
              StatusCode::kNotFound);
    EXPECT_EQ(fetch_swa_state(*tcp_, target(key(2)), options()).status().code(),
              StatusCode::kNotFound);
    // A puller of another model (state size) refuses the answer.
    SwaFetchOptions other = options();
    other.state_bytes += 128;
    EXPECT_EQ(fetch_swa_state(*tcp_, target(key(1)), other).status().code(),
              StatusCode::kInvalidArgument);
    const SwaFetchServerStats s = settled_stats(4);
    EXPECT_EQ(s.num_served, 2);
    EXPECT_EQ(s.num_not_found, 2);
    EXPECT_EQ(s.num_failed, 0);
}

TEST_F(SwaFetchTest, DamagedFramesAndABrokenSealAreRefused) {
    // The holder's answer has one byte flipped: the frame digest catches it.
    transfer::FaultPlan flip;
    flip.corrupt_rate = 1.0;
    auto base = transfer::make_tcp_transport();
    start_holder(std::make_unique<transfer::FaultInjectingTransport>(base.get(), flip));
    ASSERT_TRUE(holder_pool_.put(key(1), kvstore::TrafficClass::kChatbot, sealed(256, 5)).is_ok());
    EXPECT_EQ(fetch_swa_state(*tcp_, target(key(1)), options()).status().code(),
              StatusCode::kDataLoss);
    server_.reset();
    // The puller's request is damaged: the holder refuses it and answers nothing.
    start_holder();
    ASSERT_TRUE(holder_pool_.put(key(1), kvstore::TrafficClass::kChatbot, sealed(256, 5)).is_ok());
    transfer::FaultInjectingTransport damaged(tcp_.get(), flip);
    EXPECT_FALSE(fetch_swa_state(damaged, target(key(1)), options()).is_ok());
    // A state whose seal does not match (damaged in the holder's memory).
    std::vector<uint8_t> bad = sealed(256, 6);
    bad[10] ^= 1;
    ASSERT_TRUE(holder_pool_.put(key(3), kvstore::TrafficClass::kChatbot, bad).is_ok());
    EXPECT_EQ(fetch_swa_state(*tcp_, target(key(3)), options()).status().code(),
              StatusCode::kDataLoss);
    const SwaFetchServerStats s = settled_stats(2);
    EXPECT_EQ(s.num_failed, 1);
    EXPECT_EQ(s.num_served, 1);  // the unsealed one (the puller checks)
}

TEST_F(SwaFetchTest, AHolderThatIsGoneOrSilentFailsWithinTheTimeout) {
    start_holder();
    const SwaPullTarget gone = target(key(1));
    server_.reset();  // the holder died
    EXPECT_EQ(fetch_swa_state(*tcp_, gone, options()).status().code(), StatusCode::kUnavailable);
    // A holder that accepts and never answers.
    auto listener = tcp_->listen("127.0.0.1", 0);
    ASSERT_TRUE(listener.is_ok());
    SwaFetchOptions o = options();
    o.timeout = transfer::Timeout(200);
    const Status silent =
        fetch_swa_state(*tcp_, {"127.0.0.1:" + std::to_string((*listener)->port()), key(1)}, o)
            .status();
    EXPECT_FALSE(silent.is_ok());
    EXPECT_TRUE(silent.code() == StatusCode::kDeadlineExceeded ||
                silent.code() == StatusCode::kUnavailable)
        << silent.to_string();
    EXPECT_EQ(fetch_swa_state(*tcp_, {"no-port", key(1)}, o).status().code(),
              StatusCode::kInvalidArgument);
}

// A silent puller holds one worker, not the server: a good pull is answered while the
// silent connection is still open and uncounted (the holder would wait a minute for it).
TEST_F(SwaFetchTest, ASilentPullerDoesNotHoldUpAGoodOne) {
    start_holder(holder_options(transfer::Timeout(60'000)));
    ASSERT_TRUE(holder_pool_.put(key(1), kvstore::TrafficClass::kChatbot, sealed(256, 4)).is_ok());
    std::unique_ptr<transfer::Connection> silent = silent_puller();
    ASSERT_NE(silent, nullptr);
    ASSERT_EQ(stats_when([](const auto& s) { return s.num_active == 1; }).num_active, 1);
    SwaFetchOptions po = options();
    po.timeout = transfer::Timeout(30'000);
    Result<kv::SwaState> got = fetch_swa_state(*tcp_, target(key(1)), po);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(got->bytes, sealed(256, 4));
    SwaFetchServerStats s = settled_stats(1);
    EXPECT_EQ(s.num_served, 1);
    EXPECT_EQ(s.num_active, 1);  // the silent one, still waited for
    EXPECT_EQ(s.num_failed, 0);
    silent->close();  // its worker reads the end of the stream
    s = settled_stats(2);
    EXPECT_EQ(s.num_failed, 1);
    EXPECT_EQ(s.num_active, 0);
}

// max_connections answered + max_waiting waiting: the next puller is refused at once
// with RESOURCE_EXHAUSTED, counted; once the silent ones go, pulls are answered again.
TEST_F(SwaFetchTest, PullersOverTheBoundAreRefusedAndCounted) {
    SwaFetchServerOptions o = holder_options(transfer::Timeout(60'000), 1, 1);
    start_holder(o);
    ASSERT_TRUE(holder_pool_.put(key(1), kvstore::TrafficClass::kChatbot, sealed(256, 4)).is_ok());
    std::unique_ptr<transfer::Connection> answered = silent_puller();
    ASSERT_EQ(stats_when([](const auto& s) { return s.num_active == 1; }).num_active, 1);
    std::unique_ptr<transfer::Connection> waiting = silent_puller();
    ASSERT_EQ(stats_when([](const auto& s) { return s.num_waiting == 1; }).num_waiting, 1);
    SwaFetchOptions po = options();
    po.timeout = transfer::Timeout(30'000);
    EXPECT_EQ(fetch_swa_state(*tcp_, target(key(1)), po).status().code(),
              StatusCode::kResourceExhausted);
    EXPECT_EQ(server_->stats().num_refused, 1);
    answered->close();  // the waiting one gets the worker
    const auto one_answered = [](const auto& s) { return s.num_waiting == 0 && s.num_active == 1; };
    ASSERT_EQ(stats_when(one_answered).num_active, 1);
    waiting->close();
    ASSERT_EQ(stats_when([](const auto& s) { return s.num_active == 0; }).num_active, 0);
    EXPECT_TRUE(fetch_swa_state(*tcp_, target(key(1)), po).is_ok());
    const SwaFetchServerStats s = settled_stats(4);
    EXPECT_EQ(s.num_served, 1);
    EXPECT_EQ(s.num_failed, 2);
    EXPECT_EQ(s.num_refused, 1);
    EXPECT_EQ(s.num_not_found, 0);
    // Bounds that allow no worker are refused.
    o.max_connections = 0;
    EXPECT_EQ(SwaFetchServer::start(o).status().code(), StatusCode::kInvalidArgument);
}

// The destructor, with a connection being answered and two waiting (io_timeout far
// past the test's limit): it returns, and every puller reads the end of the stream.
TEST_F(SwaFetchTest, ShutdownWithConnectionsOpenClosesThem) {
    start_holder(holder_options(transfer::Timeout(3'600'000), 1, 2));
    std::vector<std::unique_ptr<transfer::Connection>> pullers;
    pullers.push_back(silent_puller());
    ASSERT_EQ(stats_when([](const auto& s) { return s.num_active == 1; }).num_active, 1);
    pullers.push_back(silent_puller());
    pullers.push_back(silent_puller());
    ASSERT_EQ(stats_when([](const auto& s) { return s.num_waiting == 2; }).num_waiting, 2);
    server_.reset();
    for (auto& p : pullers) {
        uint8_t b[16];
        Result<size_t> n = p->read_some(b, transfer::Timeout(5'000));
        EXPECT_TRUE((n.is_ok() && *n == 0) || n.status().code() == StatusCode::kUnavailable)
            << (n.is_ok() ? std::to_string(*n) : n.status().to_string());
    }
}

}  // namespace
}  // namespace dsi::serving
