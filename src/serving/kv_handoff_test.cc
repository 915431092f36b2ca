// The KV hand-over (serving/kv_handoff.h) over real loopback TCP into a real store
// tier (an shm segment): blocks arrive bit-exact with the store's identities before the
// sender's OK; every transfer of another shape is refused before memory is taken; a
// store that refuses a block, a cancelled sender and malformed targets fail cleanly.
// No timed assertions.
#include "serving/kv_handoff.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <random>
#include <thread>

#include "kvstore/shm_store.h"

namespace dsi::serving {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint64_t kLayerBlockBytes = 3000;

kv::KvExport make_export(size_t blocks, uint64_t seed) {
    kv::KvExport e;
    e.model_id = "tiny";
    e.dtype = 1;
    e.traffic_class = kvstore::TrafficClass::kAgent;
    e.block_tokens = 128;
    e.layer_block_bytes = kLayerBlockBytes;
    std::mt19937_64 rng(seed);
    for (size_t b = 0; b < blocks; ++b) {
        e.keys.push_back({rng(), rng()});
        e.token_hashes.push_back(rng());
    }
    e.layers.resize(kLayers);
    for (auto& l : e.layers) {
        l.resize(blocks * kLayerBlockBytes);
        for (auto& byte : l) byte = static_cast<uint8_t>(rng());
    }
    return e;
}

class KvHandoffTest : public ::testing::Test {
protected:
    void SetUp() override { open_store(64, 1 << 20); }
    void TearDown() override { inbox_.reset(); }

    void open_store(int64_t slots, int64_t slot_bytes) {
        inbox_.reset();
        store_.reset();
        const std::string name = "dsi_kv_handoff_test_" + std::to_string(::getpid());
        (void)kvstore::ShmBlockStore::unlink(name);
        kvstore::ShmStoreOptions so;
        so.name = name;
        so.num_slots = slots;
        so.slot_bytes = slot_bytes;
        so.unlink_on_close = true;
        store_ = kvstore::ShmBlockStore::open(so).value();
    }

    KvInboxOptions inbox_options() const {
        KvInboxOptions o;
        o.host = "127.0.0.1";
        o.self = {"decode-0", transfer::PeerRole::kDecode, 7};
        o.model_id = "tiny";
        o.dtype = 1;
        o.num_layers = kLayers;
        o.layer_block_bytes = kLayerBlockBytes;
        o.io_timeout = std::chrono::seconds(5);
        return o;
    }

    void start_inbox(KvInboxOptions o) {
        auto inbox = KvInbox::start(std::move(o), store_.get());
        ASSERT_TRUE(inbox.is_ok()) << inbox.status().to_string();
        inbox_ = std::move(inbox).value();
    }

    Result<transfer::SendReport> send(const kv::KvExport& e, uint64_t id,
                                      std::function<bool()> should_abort = nullptr) {
        HandoffTarget t{"127.0.0.1:" + std::to_string(inbox_->port()), {1, id}};
        HandoffSendOptions so;
        so.self = {"prefill-0", transfer::PeerRole::kPrefill, 3};
        so.io_timeout = std::chrono::seconds(5);
        so.should_abort = std::move(should_abort);
        return send_kv_export(*tcp_, e, t, so);
    }

    // Every block of `e` is in the store, bit-exact, with the store header e.info(b).
    void expect_stored(const kv::KvExport& e) {
        for (size_t b = 0; b < e.num_blocks(); ++b) {
            const kvstore::BlockInfo info = e.info(b);
            auto got = store_->get(info.key, &info);
            ASSERT_TRUE(got.is_ok()) << b << ": " << got.status().to_string();
            ASSERT_EQ(got->num_layers(), kLayers);
            for (uint32_t l = 0; l < kLayers; ++l) {
                const auto want = e.layer(l, b);
                const auto have = got->layer(l);
                ASSERT_TRUE(std::equal(want.begin(), want.end(), have.begin(), have.end()))
                    << "block " << b << " layer " << l;
            }
        }
    }

    // The inbox counts a transfer once its thread is done with the connection (after
    // the sender already has the Ack or the Failure): wait for it, at most 10 s.
    KvInboxStats stats_after_wait(int64_t received, int64_t failed) {
        for (int i = 0; i < 1000; ++i) {
            const KvInboxStats s = inbox_->stats();
            if (s.num_received >= received && s.num_failed >= failed) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return inbox_->stats();
    }
    int64_t failed_after_wait(int64_t n) { return stats_after_wait(0, n).num_failed; }

    std::unique_ptr<transfer::Transport> tcp_ = transfer::make_tcp_transport();
    std::unique_ptr<kvstore::ShmBlockStore> store_;
    std::unique_ptr<KvInbox> inbox_;
};

TEST_F(KvHandoffTest, BlocksArriveInTheStoreBeforeTheSendersOk) {
    start_inbox(inbox_options());
    const kv::KvExport e = make_export(5, 1);
    auto sent = send(e, 1);
    ASSERT_TRUE(sent.is_ok()) << sent.status().to_string();
    EXPECT_EQ(sent->receiver.peer_id, "decode-0");
    expect_stored(e);  // no waiting: the Ack came after the puts
    // A second transfer on a new connection, and the counters.
    const kv::KvExport f = make_export(2, 2);
    ASSERT_TRUE(send(f, 2).is_ok());
    expect_stored(f);
    const KvInboxStats st = stats_after_wait(2, 0);
    EXPECT_EQ(st.num_received, 2);
    EXPECT_EQ(st.num_failed, 0);
    EXPECT_EQ(st.blocks_stored, 7);
    EXPECT_EQ(st.bytes_received, static_cast<int64_t>(7 * kLayers * kLayerBlockBytes));
}

TEST_F(KvHandoffTest, TransfersOfAnotherShapeAreRefusedAndNothingIsStored) {
    struct Case {
        const char* what;
        std::function<void(KvInboxOptions&)> change;
        StatusCode code;
        const char* words;
    };
    const std::vector<Case> cases = {
        {"model", [](KvInboxOptions& o) { o.model_id = "other"; }, StatusCode::kFailedPrecondition,
         "model"},
        {"layers", [](KvInboxOptions& o) { o.num_layers = 3; }, StatusCode::kFailedPrecondition,
         "4 layers, not 3"},
        {"layer size", [](KvInboxOptions& o) { o.layer_block_bytes = 2000; },
         StatusCode::kFailedPrecondition, "blocks of 2000"},
        {"dtype", [](KvInboxOptions& o) { o.dtype = 2; }, StatusCode::kFailedPrecondition,
         "dtype 1, not 2"},
        {"size limit", [](KvInboxOptions& o) { o.max_transfer_bytes = 10000; },
         StatusCode::kResourceExhausted, ""},
    };
    const kv::KvExport e = make_export(3, 3);
    uint64_t id = 10;
    for (const Case& c : cases) {
        KvInboxOptions o = inbox_options();
        c.change(o);
        start_inbox(o);
        auto sent = send(e, ++id);
        ASSERT_FALSE(sent.is_ok()) << c.what;
        EXPECT_EQ(sent.status().code(), c.code) << c.what << ": " << sent.status().to_string();
        EXPECT_NE(sent.status().message().find(c.words), std::string::npos)
            << c.what << ": " << sent.status().to_string();
        EXPECT_EQ(failed_after_wait(1), 1) << c.what;
        EXPECT_EQ(inbox_->stats().blocks_stored, 0) << c.what;
        EXPECT_TRUE(store_->list_blocks()->empty()) << c.what;
    }
}

TEST_F(KvHandoffTest, AStoreThatRefusesABlockIsTheSendersFailure) {
    open_store(4, 4096);  // a slot holds no block of 4 x 3000 bytes
    start_inbox(inbox_options());
    auto sent = send(make_export(2, 4), 1);
    ASSERT_FALSE(sent.is_ok());
    EXPECT_EQ(sent.status().code(), StatusCode::kResourceExhausted) << sent.status().to_string();
    EXPECT_NE(sent.status().message().find("stored 0 of 2 blocks"), std::string::npos)
        << sent.status().to_string();
    EXPECT_EQ(failed_after_wait(1), 1);
}

// A connection that opens and never sends its first frame does not hold the inbox's
// shutdown for io_timeout: the wait for the first frame checks should_abort between
// slices. With io_timeout 120 s, the destructor returning at all well before it proves
// it (the bound below is a quarter of it: no timing flake).
TEST_F(KvHandoffTest, ASilentConnectionDoesNotHoldTheShutdown) {
    KvInboxOptions o = inbox_options();
    o.io_timeout = std::chrono::seconds(120);
    start_inbox(o);
    auto silent = tcp_->connect("127.0.0.1", inbox_->port(), std::chrono::seconds(5));
    ASSERT_TRUE(silent.is_ok()) << silent.status().to_string();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // taken by a receive thread
    const auto t0 = std::chrono::steady_clock::now();
    inbox_.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

TEST_F(KvHandoffTest, CancelledSendsAndBadTargetsFailCleanly) {
    start_inbox(inbox_options());
    int frames = 0;
    auto cancelled = send(make_export(4, 5), 1, [&frames] { return ++frames > 3; });
    EXPECT_EQ(cancelled.status().code(), StatusCode::kCancelled) << cancelled.status().to_string();
    EXPECT_TRUE(store_->list_blocks()->empty());

    HandoffSendOptions so;
    so.io_timeout = std::chrono::seconds(2);
    const kv::KvExport e = make_export(1, 6);
    for (const char* bad : {"nohost", ":80", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:0x1"}) {
        auto r = send_kv_export(*tcp_, e, {bad, {0, 1}}, so);
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    }
    auto empty = send_kv_export(*tcp_, kv::KvExport{}, {"127.0.0.1:1", {0, 1}}, so);
    EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
    // Nobody listens there (the inbox's port after it closed).
    const uint16_t port = inbox_->port();
    inbox_.reset();
    auto refused = send_kv_export(*tcp_, e, {"127.0.0.1:" + std::to_string(port), {0, 1}}, so);
    EXPECT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().to_string();

    KvInboxOptions o = inbox_options();
    o.num_layers = 0;
    EXPECT_EQ(KvInbox::start(o, store_.get()).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(KvInbox::start(inbox_options(), nullptr).status().code(),
              StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsi::serving
