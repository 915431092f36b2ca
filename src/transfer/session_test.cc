// Transfers over real loopback connections, on every transport built (TCP, and UCX where
// present), plain and through the fault-injecting transport.
// No timed assertions: timeouts only bound how long a failing case waits.
#include "transfer/session.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "transfer/fault_transport.h"
#include "transfer/internal/test_sequence.h"

namespace dsi::transfer {
namespace {

using namespace std::chrono_literals;
using testing::counting_factory;
using testing::holds;
using testing::live_destinations;
using testing::TestSequence;

const TransferId kId{0xabc, 0xdef};
const HelloMessage kPrefill{"prefill-0", PeerRole::kPrefill, 11};
const HelloMessage kDecode{"decode-0", PeerRole::kDecode, 21};

// The decode side on its own thread: accepts one connection and receives one sequence.
class ReceiverThread {
public:
    ReceiverThread(Listener* listener, ReceiveOptions options, PeerTable* peers,
                   DestinationFactory factory = counting_factory()) {
        thread_ = std::thread(
            [this, listener, options = std::move(options), peers, factory = std::move(factory)] {
                auto conn = listener->accept(10s);
                if (!conn.is_ok()) {
                    result_.emplace(conn.status());
                    return;
                }
                result_.emplace(receive_sequence(**conn, options, *peers, factory));
            });
    }
    ~ReceiverThread() {
        if (thread_.joinable()) {
            thread_.join();
        }
    }
    Result<ReceivedSequence> join() {
        thread_.join();
        return std::move(*result_);
    }

private:
    std::thread thread_;
    std::optional<Result<ReceivedSequence>> result_;
};

class TransferTest : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        ASSERT_EQ(live_destinations().load(), 0);
        auto loopback = testing::open_loopback(GetParam());
        ASSERT_TRUE(loopback.is_ok()) << loopback.status().to_string();
        transport_ = std::move(loopback->transport);
        listener_ = std::move(loopback->listener);
        ASSERT_GT(listener_->port(), 0);
        send_.transfer_id = kId;
        send_.self = kPrefill;
        send_.chunk_bytes = 64 << 10;
        send_.io_timeout = 5s;
        receive_.transfer_id = kId;
        receive_.self = kDecode;
        receive_.io_timeout = 5s;
    }
    void TearDown() override { EXPECT_EQ(live_destinations().load(), 0) << "a destination leaked"; }

    // Sends `seq` through `transport` (the plain one unless a test wraps it) while a
    // receiver thread takes it; returns both sides' results.
    std::pair<Result<SendReport>, Result<ReceivedSequence>> run(const TestSequence& seq,
                                                                Transport* transport = nullptr) {
        ReceiverThread receiver(listener_.get(), receive_, &peers_, factory_);
        auto source = seq.source();
        Result<SendReport> sent = unavailable("not connected");
        auto conn =
            (transport ? transport : transport_.get())->connect("127.0.0.1", listener_->port(), 5s);
        if (conn.is_ok()) {
            sent = send_sequence(**conn, send_, seq.begin, source);
        } else {
            sent = conn.status();
        }
        return {std::move(sent), receiver.join()};
    }

    // Both sides failed: the receiver with `receiver_code` and `words` in its message,
    // the sender with `sender_code`.
    static void expect_both_failed(const Result<SendReport>& sent,
                                   const Result<ReceivedSequence>& got, StatusCode receiver_code,
                                   const std::string& words, StatusCode sender_code) {
        ASSERT_FALSE(got.is_ok());
        EXPECT_EQ(got.status().code(), receiver_code) << got.status().to_string();
        EXPECT_NE(got.status().message().find(words), std::string::npos)
            << got.status().to_string();
        ASSERT_FALSE(sent.is_ok());
        EXPECT_EQ(sent.status().code(), sender_code) << sent.status().to_string();
    }

    // One write in ten dropped, Hello and Begin spared.
    static FaultPlan drop_one_in_ten() {
        FaultPlan plan;
        plan.seed = 5;
        plan.drop_rate = 0.1;
        plan.spare_first_writes = 2;
        return plan;
    }

    std::unique_ptr<Transport> transport_;
    DestinationFactory factory_ = counting_factory();
    std::unique_ptr<Listener> listener_;
    PeerTable peers_;
    SendOptions send_;
    ReceiveOptions receive_;
};

TEST_P(TransferTest, ThirtyLayersAndV4StateArriveBitExact) {
    const auto seq = TestSequence::make(30, 300 << 10, /*v4=*/true, 100);
    std::vector<uint32_t> ready;
    receive_.on_layers_ready = [&ready](uint32_t n) { ready.push_back(n); };
    auto [sent, got] = run(seq);
    ASSERT_TRUE(sent.is_ok()) << sent.status().to_string();
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(sent->data_bytes, seq.begin.total_bytes());
    EXPECT_EQ(sent->receiver, kDecode);
    EXPECT_EQ(got->sender, kPrefill);
    EXPECT_EQ(got->transfer_id, kId);
    EXPECT_EQ(got->begin, seq.begin);
    EXPECT_TRUE(holds(*got->destination, seq));
    EXPECT_EQ(got->counters.num_duplicates + got->counters.num_late + got->counters.num_stale, 0u);
    // 30 layers of 300 KiB (+7 bytes a layer) in 64 KiB chunks, all read straight into
    // place (no read runs past a chunk's prefix).
    EXPECT_EQ(got->counters.num_placed, 30u * 5u);
    // Layers became ready one after another, as their last chunk arrived.
    ASSERT_FALSE(ready.empty());
    EXPECT_EQ(ready.back(), 30u);
    EXPECT_TRUE(std::is_sorted(ready.begin(), ready.end()));
    EXPECT_GE(ready.size(), 30u);
    got->destination.reset();
}

TEST_P(TransferTest, ReceiverWithoutAnIdTakesTheSendersAndLayersOfZeroBytesAreFine) {
    auto seq = TestSequence::make(4, 1000, false, 101);
    seq.layers[2].clear();
    seq.begin.layer_bytes[2] = 0;
    receive_.transfer_id.reset();
    auto [sent, got] = run(seq);
    ASSERT_TRUE(sent.is_ok()) << sent.status().to_string();
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(got->transfer_id, kId);
    EXPECT_TRUE(holds(*got->destination, seq));
    got->destination.reset();
}

// A destination that takes writes only (e.g. paged memory): every chunk is copied.
class WriteOnlyDestination : public testing::CountingDestination {
public:
    using CountingDestination::CountingDestination;
    std::span<uint8_t> layer_memory(uint32_t, uint64_t, uint64_t) override { return {}; }
};

TEST_P(TransferTest, ADestinationWithoutMemoryTakesEveryChunkAsAWrite) {
    const auto seq = TestSequence::make(5, 200 << 10, true, 110);
    factory_ = [](const TransferId&,
                  const BeginMessage& b) -> Result<std::unique_ptr<Destination>> {
        return std::unique_ptr<Destination>(std::make_unique<WriteOnlyDestination>(b));
    };
    auto [sent, got] = run(seq);
    ASSERT_TRUE(sent.is_ok()) << sent.status().to_string();
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(got->counters.num_placed, 0u);
    EXPECT_TRUE(holds(*got->destination, seq));
    got->destination.reset();
}

TEST_P(TransferTest, ACorruptedByteIsADigestFailureOnBothSides) {
    const auto seq = TestSequence::make(8, 200 << 10, true, 102);
    FaultPlan plan;
    plan.seed = 3;
    plan.corrupt_rate = 1.0;
    plan.spare_first_writes = 5;  // Hello, Begin and three state chunks go through
    FaultInjectingTransport faulty(transport_.get(), plan);
    auto [sent, got] = run(seq, &faulty);
    EXPECT_GE(faulty.counts().num_corrupted, 1u);
    expect_both_failed(sent, got, StatusCode::kDataLoss, "digest mismatch", StatusCode::kDataLoss);
    // The receiver's Failure reached the sender (its linger keeps the connection open).
    EXPECT_NE(sent.status().message().find("receiver failed"), std::string::npos);
}

TEST_P(TransferTest, ACutConnectionFailsBothSidesAndReleasesTheBuffers) {
    const auto seq = TestSequence::make(10, 200 << 10, true, 103);
    FaultPlan plan;
    plan.cut_after_bytes = 700'000;
    FaultInjectingTransport faulty(transport_.get(), plan);
    auto [sent, got] = run(seq, &faulty);
    EXPECT_EQ(faulty.counts().num_cuts, 1u);
    ASSERT_FALSE(sent.is_ok());
    EXPECT_EQ(sent.status().code(), StatusCode::kUnavailable) << sent.status().to_string();
    ASSERT_FALSE(got.is_ok());
    // Truncated mid-frame (or reset, when the cut side still held unread bytes).
    const StatusCode c = got.status().code();
    EXPECT_TRUE(c == StatusCode::kDataLoss || c == StatusCode::kUnavailable)
        << got.status().to_string();
}

TEST_P(TransferTest, ADroppedFrameIsALossOnBothSides) {
    const auto seq = TestSequence::make(12, 100 << 10, false, 104);
    FaultInjectingTransport faulty(transport_.get(), drop_one_in_ten());
    auto [sent, got] = run(seq, &faulty);
    EXPECT_GE(faulty.counts().num_dropped, 1u);
    expect_both_failed(sent, got, StatusCode::kDataLoss, "lost", StatusCode::kDataLoss);
}

TEST_P(TransferTest, DroppingEverythingAfterBeginIsATimeout) {
    const auto seq = TestSequence::make(4, 10 << 10, false, 105);
    FaultPlan plan;
    plan.drop_rate = 1.0;
    plan.spare_first_writes = 2;
    FaultInjectingTransport faulty(transport_.get(), plan);
    receive_.io_timeout = 300ms;
    send_.io_timeout = 3s;
    auto [sent, got] = run(seq, &faulty);
    // The sender: the receiver's Failure (its timeout) or its own wait for the Ack.
    expect_both_failed(sent, got, StatusCode::kDeadlineExceeded, "timed out",
                       StatusCode::kDeadlineExceeded);
}

TEST_P(TransferTest, DelayedWritesStillArriveBitExact) {
    const auto seq = TestSequence::make(6, 50 << 10, true, 106);
    FaultPlan plan;
    plan.seed = 9;
    plan.max_delay = 3ms;
    FaultInjectingTransport faulty(transport_.get(), plan);
    auto [sent, got] = run(seq, &faulty);
    EXPECT_GT(faulty.counts().num_delayed, 0u);
    ASSERT_TRUE(sent.is_ok()) << sent.status().to_string();
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_TRUE(holds(*got->destination, seq));
    got->destination.reset();
}

TEST_P(TransferTest, FaultsFromOneSeedAreTheSameEveryRun) {
    const auto seq = TestSequence::make(12, 100 << 10, false, 107);
    std::vector<std::string> outcomes;
    for (int run_no = 0; run_no < 2; ++run_no) {
        FaultInjectingTransport faulty(transport_.get(), drop_one_in_ten());
        auto [sent, got] = run(seq, &faulty);
        outcomes.push_back(got.status().to_string());
    }
    EXPECT_EQ(outcomes[0], outcomes[1]);
}

TEST_P(TransferTest, AStaleSenderIsRefusedAndTold) {
    ASSERT_TRUE(peers_.observe("prefill-0", 12).is_ok());  // it restarted since
    const auto seq = TestSequence::make(3, 10 << 10, false, 108);
    auto [sent, got] = run(seq);
    expect_both_failed(sent, got, StatusCode::kFailedPrecondition, "stale incarnation",
                       StatusCode::kFailedPrecondition);
    EXPECT_NE(sent.status().message().find("stale incarnation 11"), std::string::npos);
}

TEST_P(TransferTest, AbortFromEitherSideEndsBothAndReleasesTheBuffers) {
    const auto seq = TestSequence::make(10, 100 << 10, false, 109);
    {
        std::atomic<int> frames{0};
        send_.should_abort = [&frames] { return ++frames > 6; };
        auto [sent, got] = run(seq);
        EXPECT_EQ(sent.status().code(), StatusCode::kCancelled) << sent.status().to_string();
        EXPECT_EQ(got.status().code(), StatusCode::kCancelled) << got.status().to_string();
        send_.should_abort = nullptr;
    }
    {
        std::atomic<int> frames{0};
        receive_.should_abort = [&frames] { return ++frames > 6; };
        auto [sent, got] = run(seq);
        EXPECT_EQ(got.status().code(), StatusCode::kCancelled) << got.status().to_string();
        ASSERT_FALSE(sent.is_ok());
        // The receiver's Abort, or a closed connection if the sender was mid-write.
        const StatusCode c = sent.status().code();
        EXPECT_TRUE(c == StatusCode::kCancelled || c == StatusCode::kUnavailable)
            << sent.status().to_string();
    }
}

// ReceiveOptions::commit runs before the Ack: its OK is the sender's OK, its error
// is the sender's error, and a refused destination is released.
TEST_P(TransferTest, TheAckComesOnlyAfterTheCommitAndARefusedCommitFailsBothSides) {
    const auto seq = TestSequence::make(5, 40 << 10, /*v4=*/true, 110);
    int commits = 0;
    receive_.commit = [&commits, &seq](const TransferId& id, const BeginMessage& begin,
                                       const HelloMessage& sender, Destination& d) {
        ++commits;
        EXPECT_EQ(id, kId);
        EXPECT_EQ(begin, seq.begin);
        EXPECT_EQ(sender, kPrefill);
        EXPECT_TRUE(holds(d, seq));  // whole and verified before the Ack
        return Status();
    };
    {
        auto [sent, got] = run(seq);
        ASSERT_TRUE(sent.is_ok()) << sent.status().to_string();
        ASSERT_TRUE(got.is_ok()) << got.status().to_string();
        EXPECT_EQ(commits, 1);
        got->destination.reset();
    }
    receive_.commit = [&commits](const TransferId&, const BeginMessage&, const HelloMessage&,
                                 Destination&) {
        ++commits;
        return resource_exhausted("the inbox is full");
    };
    auto [sent, got] = run(seq);
    expect_both_failed(sent, got, StatusCode::kResourceExhausted, "the inbox is full",
                       StatusCode::kResourceExhausted);
    EXPECT_NE(sent.status().message().find("the inbox is full"), std::string::npos);
    EXPECT_EQ(commits, 2);
    EXPECT_EQ(live_destinations().load(), 0);
}

TEST_P(TransferTest, BytesThatAreNotFramesAreRefused) {
    ReceiverThread receiver(listener_.get(), receive_, &peers_);
    auto conn = transport_->connect("127.0.0.1", listener_->port(), 5s);
    ASSERT_TRUE(conn.is_ok()) << conn.status().to_string();
    const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(http.data()),
                                         http.size());
    ASSERT_TRUE((*conn)->write(std::span(&bytes, 1), 5s).is_ok());
    auto got = receiver.join();
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << got.status().to_string();
    EXPECT_NE(got.status().message().find("bad magic"), std::string::npos);
}

// A sender that trickles its frames (a byte every 20 ms: each read well within io_timeout)
// holds the receiver no longer than max_duration. The trickled Hello's last byte is wrong,
// so a receiver without the limit reads all of it and fails on the digest instead.
TEST_P(TransferTest, ASenderThatTricklesIsCutAtTheTransfersTimeLimit) {
    receive_.max_duration = 300ms;
    ReceiverThread receiver(listener_.get(), receive_, &peers_);
    auto conn = transport_->connect("127.0.0.1", listener_->port(), 5s);
    ASSERT_TRUE(conn.is_ok()) << conn.status().to_string();
    FrameStamper stamper(kId, kPrefill.incarnation);
    const std::vector<uint8_t> payload = encode_payload(kPrefill);
    std::vector<uint8_t> bytes = stamper.stamp(MessageType::kHello, payload).flatten();
    bytes.back() ^= 1;
    std::thread trickle([&] {
        for (const uint8_t& b : bytes) {
            const std::span<const uint8_t> one(&b, 1);
            if (!(*conn)->write(std::span(&one, 1), 5s).is_ok()) return;
            std::this_thread::sleep_for(20ms);
        }
    });
    auto got = receiver.join();
    trickle.join();
    EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded) << got.status().to_string();
    EXPECT_GT(bytes.size(), size_t{30});  // > 0.6 s of trickle: past the limit by far
}

TEST_P(TransferTest, ConnectAndAcceptFailCleanly) {
    const uint16_t port = listener_->port();
    listener_->close();
    auto refused = transport_->connect("127.0.0.1", port, 2s);
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().to_string();

    auto l = transport_->listen("127.0.0.1", 0);
    ASSERT_TRUE(l.is_ok());
    auto none = (*l)->accept(50ms);
    EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded);
    EXPECT_EQ(transport_->listen("not an address", 0).status().code(),
              StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransferTest, ::testing::ValuesIn(testing::transport_names()),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace dsi::transfer
