// The KV hand-over (serving/kv_handoff.h) over real loopback TCP into a real store
// tier (an shm segment): blocks arrive bit-exact with the store's identities before the
// sender's OK; every transfer of another shape is refused before memory is taken; a
// store that refuses a block, a cancelled sender and malformed targets fail cleanly.
// No timed assertions.
#include "serving/kv_handoff.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <random>
#include <set>
#include <thread>

#include "engine/engine.h"
#include "kv/tiered_cache.h"
#include "kvstore/shm_store.h"
#include "model/deepseek_v4.h"
#include "model/synthetic.h"
#include "transfer/fault_transport.h"

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
    e.layer_block_bytes.assign(kLayers, kLayerBlockBytes);
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
        o.layer_block_bytes.assign(kLayers, kLayerBlockBytes);
        o.io_timeout = std::chrono::seconds(5);
        return o;
    }

    void start_inbox(KvInboxOptions o) {
        auto inbox = KvInbox::start(std::move(o), store_.get());
        ASSERT_TRUE(inbox.is_ok()) << inbox.status().to_string();
        inbox_ = std::move(inbox).value();
    }

    Result<transfer::SendReport> send(const kv::KvExport& e, uint64_t id,
                                      std::function<bool()> should_abort = nullptr,
                                      transfer::Transport* transport = nullptr) {
        HandoffTarget t{"127.0.0.1:" + std::to_string(inbox_->port()), {1, id}};
        HandoffSendOptions so;
        so.self = {"prefill-0", transfer::PeerRole::kPrefill, 3};
        so.io_timeout = std::chrono::seconds(5);
        so.should_abort = std::move(should_abort);
        return send_kv_export(transport != nullptr ? *transport : *tcp_, e, t, so);
    }

    // Every block of `e` is in the store, bit-exact, with the store header e.info(b).
    void expect_stored(const kv::KvExport& e) {
        for (size_t b = 0; b < e.num_blocks(); ++b) {
            const kvstore::BlockInfo info = e.info(b);
            auto got = store_->get(info.key, &info);
            ASSERT_TRUE(got.is_ok()) << b << ": " << got.status().to_string();
            ASSERT_EQ(got->num_layers(), e.num_layers());
            for (uint32_t l = 0; l < e.num_layers(); ++l) {
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

    // A send the inbox refused with `code`, its message naming `words`, counted failed.
    void expect_refused(const Result<transfer::SendReport>& sent, StatusCode code,
                        const std::string& words, const std::string& what) {
        ASSERT_FALSE(sent.is_ok()) << what;
        EXPECT_EQ(sent.status().code(), code) << what << ": " << sent.status().to_string();
        EXPECT_NE(sent.status().message().find(words), std::string::npos)
            << what << ": " << sent.status().to_string();
        EXPECT_EQ(failed_after_wait(1), 1) << what;
    }

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

// Over the queue bound (here 0: every connection) a sender is told the inbox is busy --
// RESOURCE_EXHAUSTED naming it -- instead of seeing its connection reset; nothing is
// stored and the refusal is counted.
TEST_F(KvHandoffTest, ASenderOverTheQueueBoundIsToldTheInboxIsBusy) {
    KvInboxOptions o = inbox_options();
    o.max_queued = 0;
    start_inbox(o);
    const kv::KvExport e = make_export(3, 1);
    auto sent = send(e, 1);
    ASSERT_FALSE(sent.is_ok());
    EXPECT_EQ(sent.status().code(), StatusCode::kResourceExhausted) << sent.status().to_string();
    EXPECT_NE(sent.status().message().find("kv inbox busy"), std::string::npos)
        << sent.status().to_string();
    for (size_t b = 0; b < e.num_blocks(); ++b) {
        EXPECT_FALSE(store_->contains(e.info(b).key).value()) << b;
    }
    const KvInboxStats st = inbox_->stats();
    EXPECT_EQ(st.num_rejected, 1);
    EXPECT_EQ(st.num_received, 0);
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
        {"layers", [](KvInboxOptions& o) { o.layer_block_bytes.resize(3); },
         StatusCode::kFailedPrecondition, "4 layers, not 3"},
        {"layer size", [](KvInboxOptions& o) { o.layer_block_bytes[2] = 2000; },
         StatusCode::kFailedPrecondition, "layer 2 of 9000 bytes, not 3 blocks of 2000"},
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
        expect_refused(send(e, ++id), c.code, c.words, c.what);
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
    o.layer_block_bytes.clear();
    EXPECT_EQ(KvInbox::start(o, store_.get()).status().code(), StatusCode::kInvalidArgument);
    o = inbox_options();
    o.layer_block_bytes[1] = 0;
    EXPECT_EQ(KvInbox::start(o, store_.get()).status().code(), StatusCode::kInvalidArgument);
    o = inbox_options();
    o.swa_state_bytes = 1000;  // a state without a pool to put it in
    EXPECT_EQ(KvInbox::start(o, store_.get()).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(KvInbox::start(inbox_options(), nullptr).status().code(),
              StatusCode::kInvalidArgument);
}

// ---- V4 / V4.1: blocks of three cache groups and the SWA state (tiny-v4's shape) ----

const engine::StoreBlockShape& tiny_v4_shape() {
    static const engine::StoreBlockShape shape = [] {
        ModelConfig c = synthetic_preset("tiny-v4").value();
        c.vocab_size = 512;
        DeepseekV4Model::Options o;
        o.num_threads = 1;
        auto m = DeepseekV4Model::load(synthetic_v4_memory_model(c, 7), o);
        EXPECT_TRUE(m.is_ok()) << m.status().to_string();
        return engine::store_block_shape(**m).value();
    }();
    return shape;
}

// A sealed state of tiny-v4's size at `position`, named by `chain`.
std::shared_ptr<kv::SwaState> make_state(const kvstore::StoreKey& chain, int64_t position,
                                         uint64_t seed, int64_t extra_bytes = 0) {
    auto st = std::make_shared<kv::SwaState>();
    st->key = {kv::BlockKey{chain.lo, chain.hi}, position};
    st->traffic_class = kvstore::TrafficClass::kAgent;
    st->bytes.resize(tiny_v4_shape().swa_state_bytes - kv::kSwaSealBytes +
                     static_cast<uint64_t>(extra_bytes));
    std::mt19937_64 rng(seed);
    for (auto& byte : st->bytes) byte = static_cast<uint8_t>(rng());
    kv::swa_seal(st->bytes, position);
    return st;
}

// What a V4 prefill engine exports: `blocks` blocks of every store layer (sizes by
// cache group) and the state at their end.
kv::KvExport make_v4_export(size_t blocks, uint64_t seed) {
    const engine::StoreBlockShape& shape = tiny_v4_shape();
    kv::KvExport e;
    e.model_id = "tiny";
    e.dtype = shape.dtype;
    e.traffic_class = kvstore::TrafficClass::kAgent;
    e.block_tokens = 128;
    e.layer_block_bytes = shape.layer_block_bytes;
    std::mt19937_64 rng(seed);
    for (size_t b = 0; b < blocks; ++b) {
        e.keys.push_back({rng(), rng()});
        e.token_hashes.push_back(rng());
    }
    for (uint64_t bytes : e.layer_block_bytes) {
        std::vector<uint8_t>& l = e.layers.emplace_back(blocks * bytes);
        for (auto& byte : l) byte = static_cast<uint8_t>(rng());
    }
    e.swa_state = make_state(e.keys.back(), static_cast<int64_t>(blocks) * 128, seed + 1);
    return e;
}

class KvHandoffV4Test : public KvHandoffTest {
protected:
    void SetUp() override {
        const engine::StoreBlockShape& shape = tiny_v4_shape();
        const auto block =
            static_cast<int64_t>(kvstore::header_bytes(shape.num_layers()) + shape.block_bytes());
        open_store(16, (block + 4095) / 4096 * 4096);
    }

    KvInboxOptions v4_inbox_options(kv::SwaStatePool* pool) const {
        const engine::StoreBlockShape& shape = tiny_v4_shape();
        KvInboxOptions o = inbox_options();
        o.dtype = shape.dtype;
        o.layer_block_bytes = shape.layer_block_bytes;
        o.swa_state_bytes = shape.swa_state_bytes;
        o.swa_pool = pool;
        return o;
    }

    // Nothing of a refused transfer is kept: no block, no state.
    void expect_nothing_kept(const kv::SwaStatePool& pool, const std::string& what) {
        EXPECT_TRUE(store_->list_blocks()->empty()) << what;
        EXPECT_EQ(pool.stats().num_entries, 0) << what;
        EXPECT_EQ(inbox_->stats().states_stored, 0) << what;
    }

    kv::SwaStatePool pool_{int64_t{64} << 20};
};

TEST_F(KvHandoffV4Test, BlocksOfEveryGroupAndTheStateArriveBeforeTheSendersOk) {
    const engine::StoreBlockShape& shape = tiny_v4_shape();
    // tiny-v4's store layers: c4 entries, c4_index keys, c128 entries, sizes by group.
    const std::set<uint64_t> sizes(shape.layer_block_bytes.begin(), shape.layer_block_bytes.end());
    EXPECT_GE(sizes.size(), 2u);
    EXPECT_GT(shape.swa_state_bytes, kv::kSwaSealBytes);
    start_inbox(v4_inbox_options(&pool_));
    const kv::KvExport e = make_v4_export(3, 11);
    auto sent = send(e, 1);
    ASSERT_TRUE(sent.is_ok()) << sent.status().to_string();
    expect_stored(e);                        // every layer of every block, bit-exact, before the OK
    auto got = pool_.get(e.swa_state->key);  // the state too
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ((*got)->bytes, e.swa_state->bytes);
    EXPECT_EQ((*got)->traffic_class, kvstore::TrafficClass::kAgent);
    EXPECT_EQ((*got)->key.position, 3 * 128);
    const KvInboxStats st = stats_after_wait(1, 0);
    EXPECT_EQ(st.blocks_stored, 3);
    EXPECT_EQ(st.states_stored, 1);
    EXPECT_EQ(st.bytes_received, static_cast<int64_t>(e.bytes()));
    EXPECT_EQ(e.bytes(), 3 * shape.block_bytes() + shape.swa_state_bytes);
}

TEST_F(KvHandoffV4Test, MalformedStatesAreRefusedAndNothingIsKept) {
    struct Case {
        const char* what;
        std::function<void(kv::KvExport&)> change;
        StatusCode code;
        const char* words;
    };
    const std::vector<Case> cases = {
        {"missing", [](kv::KvExport& e) { e.swa_state = nullptr; }, StatusCode::kFailedPrecondition,
         "SWA state section is missing"},
        {"oversized",
         [](kv::KvExport& e) { e.swa_state = make_state(e.keys.back(), 3 * 128, 5, 4096); },
         StatusCode::kFailedPrecondition, "SWA state section of"},
        {"undersized",
         [](kv::KvExport& e) { e.swa_state = make_state(e.keys.back(), 3 * 128, 5, -8); },
         StatusCode::kFailedPrecondition, "SWA state section of"},
        {"seal",
         [](kv::KvExport& e) {
             auto st = std::make_shared<kv::SwaState>(*e.swa_state);
             st->bytes[1000] ^= 0x40;  // the frames' digests are over the damaged bytes
             e.swa_state = st;
         },
         StatusCode::kDataLoss, "fails its seal"},
        {"position", [](kv::KvExport& e) { e.swa_state = make_state(e.keys.back(), 2 * 128, 5); },
         StatusCode::kInvalidArgument, "at position 256, not at the blocks' end 384"},
        {"key", [](kv::KvExport& e) { e.swa_state = make_state(e.keys[0], 3 * 128, 5); },
         StatusCode::kInvalidArgument, "not the last block's"},
    };
    uint64_t id = 20;
    for (const Case& c : cases) {
        kv::SwaStatePool pool(int64_t{64} << 20);
        start_inbox(v4_inbox_options(&pool));
        kv::KvExport e = make_v4_export(3, 12);
        c.change(e);
        expect_refused(send(e, ++id), c.code, c.words, c.what);
        expect_nothing_kept(pool, c.what);
    }
    // A state to a model that keeps none; a state larger than the decode engine's pool.
    {
        KvInboxOptions o = v4_inbox_options(nullptr);
        o.swa_state_bytes = 0;
        start_inbox(o);
        expect_refused(send(make_v4_export(2, 13), ++id), StatusCode::kFailedPrecondition,
                       "unexpected state section 'swa_state'", "a stateless model");
        EXPECT_TRUE(store_->list_blocks()->empty());
    }
    kv::SwaStatePool small(static_cast<int64_t>(tiny_v4_shape().swa_state_bytes) - 1);
    start_inbox(v4_inbox_options(&small));
    expect_refused(send(make_v4_export(2, 14), ++id), StatusCode::kResourceExhausted,
                   "larger than the pool", "a small pool");
    expect_nothing_kept(small, "a small pool");
}

// The state travels in State frames like the block list: a frame damaged on the wire
// fails its digest, a connection cut inside the state leaves an incomplete transfer;
// either way nothing is kept.
TEST_F(KvHandoffV4Test, ADamagedOrCutStateFrameFailsAndNothingIsKept) {
    transfer::FaultPlan damage;
    damage.corrupt_rate = 1.0;
    damage.spare_first_writes = 3;  // Hello, Begin, the block list: the state frame is next
    transfer::FaultPlan cut;
    cut.cut_after_bytes = 100'000;  // past the block list, inside the state (~0.5 MB)
    const std::pair<const char*, transfer::FaultPlan> faults[] = {{"damaged", damage},
                                                                  {"cut", cut}};
    uint64_t id = 40;
    for (const auto& [what, plan] : faults) {
        kv::SwaStatePool pool(int64_t{64} << 20);
        start_inbox(v4_inbox_options(&pool));
        transfer::FaultInjectingTransport faulty(tcp_.get(), plan);
        auto sent = send(make_v4_export(3, 15), ++id, nullptr, &faulty);
        ASSERT_FALSE(sent.is_ok()) << what;
        if (std::string(what) == "damaged") {
            EXPECT_EQ(sent.status().code(), StatusCode::kDataLoss) << sent.status().to_string();
            EXPECT_GE(faulty.counts().num_corrupted, 1u) << what;
        } else {
            EXPECT_EQ(sent.status().code(), StatusCode::kUnavailable) << sent.status().to_string();
            EXPECT_EQ(faulty.counts().num_cuts, 1u);
        }
        EXPECT_EQ(failed_after_wait(1), 1) << what;
        expect_nothing_kept(pool, what);
    }
}

}  // namespace
}  // namespace dsi::serving
