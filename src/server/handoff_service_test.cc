// HandoffService (the prefill side of the KV hand-over) over a real engine service and
// a real KvInbox on loopback TCP: the first token goes out at once, the prompt's full
// blocks reach the decode engine's store tier before the final update says so; a
// generation without a target, a first token that stops, a short prompt, an unreachable
// decode engine and an abort while the send waits each end as the header says.
// Into the decode engine's pool (engine/kv_landing.h, KvLandingTest): the export's full
// blocks and the prompt's tail rows are received into blocks the decode engine reserved;
// its continuation starts past the whole prompt and streams what one engine streams
// (greedy and seeded); tokens that do not match the landed keys attach nothing; a
// transfer that aborts, fails its digest, is cut or is malformed, a continuation that
// never comes and a pool with no room each leave the pool's block counts where they
// started.
// No timed assertions (timeouts only bound the failing cases).
#include "server/handoff_service.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <random>
#include <thread>

#include "base/mutex.h"
#include "kv/block_key.h"
#include "engine/kv_landing.h"
#include "kvstore/shm_store.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "server/engine_service.h"
#include "transfer/fault_transport.h"

namespace dsi::server {
namespace {

// One model per engine (an engine owns its model while it runs); the same weights.
std::unique_ptr<DeepseekModel> fresh_tiny_model() {
    ModelConfig c = synthetic_preset("tiny-v3").value();
    c.vocab_size = 512;
    return DeepseekModel::load(synthetic_memory_model(c, 99), {2}).value();
}

DeepseekModel& tiny_model() {
    static std::unique_ptr<DeepseekModel> m = fresh_tiny_model();
    return *m;
}

std::vector<int32_t> prompt_of(int len, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng() % 500));
    return p;
}

// The updates of one generation, as its sink saw them.
class Collector {
public:
    Sink sink() {
        return [this](Update u) {
            MutexLock l(&mu_);
            updates_.push_back(std::move(u));
            cv_.notify_all();
        };
    }
    // Waits (at most 30 s) for the final update; all updates in order.
    std::vector<Update> wait() {
        MutexLock l(&mu_);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (updates_.empty() || !updates_.back().finished) {
            if (!cv_.wait_until(&mu_, deadline)) break;
        }
        return updates_;
    }

    // Waits (at most 30 s) until at least one update came.
    void wait_first() {
        MutexLock l(&mu_);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (updates_.empty()) {
            if (!cv_.wait_until(&mu_, deadline)) break;
        }
    }

private:
    Mutex mu_;
    CondVar cv_;
    std::vector<Update> updates_ DSI_GUARDED_BY(mu_);
};

class HandoffServiceTest : public ::testing::Test {
protected:
    void SetUp() override {
        engine::EngineOptions o;
        o.num_kv_blocks = 64;
        o.scheduler.step_budget_ns = 1e12;
        engine_ = engine::Engine::create(&tiny_model(), o, Env::default_env()).value();
        engine_service_ = std::make_unique<EngineService>(engine_.get());
        const std::string name = "dsi_handoff_service_test_" + std::to_string(::getpid());
        (void)kvstore::ShmBlockStore::unlink(name);
        kvstore::ShmStoreOptions so;
        so.name = name;
        so.num_slots = 32;
        so.slot_bytes = 4 << 20;
        so.unlink_on_close = true;
        store_ = kvstore::ShmBlockStore::open(so).value();
    }
    void TearDown() override {
        engine_service_->stop();  // its last updates run through service_
        service_.reset();
    }

    // The decode side: an inbox for the tiny model's blocks.
    void start_inbox() { inbox_ = serving::KvInbox::start(inbox_options(), store_.get()).value(); }
    serving::KvInboxOptions inbox_options() {
        auto probe = export_of(prompt_of(300, 1));
        EXPECT_NE(probe, nullptr);
        serving::KvInboxOptions io;
        io.host = "127.0.0.1";
        io.self = {"decode-0", transfer::PeerRole::kDecode, 2};
        io.model_id = probe->model_id;
        io.dtype = probe->dtype;
        io.layer_block_bytes = probe->layer_block_bytes;
        return io;
    }

    // What the engine exports for `prompt` (run directly, max_tokens 1).
    std::shared_ptr<const kv::KvExport> export_of(std::vector<int32_t> prompt) {
        Collector c;
        Generation g;
        g.request.prompt = std::move(prompt);
        g.request.sampling.max_tokens = 1;
        g.request.export_kv = true;
        engine_service_->start(next_ticket_++, std::move(g), c.sink());
        return c.wait().back().kv_export;
    }

    void start_service(int threads = 2) {
        HandoffServiceOptions o;
        o.self = {"prefill-0", transfer::PeerRole::kPrefill, 1};
        o.io_timeout = std::chrono::seconds(2);
        o.num_threads = threads;
        service_ = std::make_unique<HandoffService>(engine_service_.get(), o);
    }

    Generation generation(int prompt_len, uint64_t seed, int max_tokens, const std::string& address) {
        Generation g;
        g.request.prompt = prompt_of(prompt_len, seed);
        g.request.sampling.max_tokens = max_tokens;
        g.request.sampling.ignore_eos = true;
        if (!address.empty()) g.handoff = serving::HandoffTarget{address, {7, seed}};
        return g;
    }

    std::string inbox_address() const { return "127.0.0.1:" + std::to_string(inbox_->port()); }

    int64_t counter(const std::string& name) const {
        for (const auto& c : service_->stats_snapshot().extra_counters) {
            if (c.name == name) return c.value;
        }
        ADD_FAILURE() << "no counter " << name;
        return -1;
    }

    std::unique_ptr<engine::Engine> engine_;
    std::unique_ptr<EngineService> engine_service_;
    std::unique_ptr<kvstore::ShmBlockStore> store_;
    std::unique_ptr<serving::KvInbox> inbox_;
    std::unique_ptr<HandoffService> service_;
    Ticket next_ticket_ = 1;
};

TEST_F(HandoffServiceTest, FirstTokenAtOnceThenTheBlocksAreStoredBeforeTheFinalUpdate) {
    start_inbox();
    start_service();
    Collector c;
    Generation g = generation(3 * 128 + 10, 5, 20, inbox_address());
    const std::vector<int32_t> prompt = g.request.prompt;
    service_->start(next_ticket_++, std::move(g), c.sink());
    const std::vector<Update> u = c.wait();
    ASSERT_EQ(u.size(), 2u);
    ASSERT_EQ(u[0].tokens.size(), 1u);  // the first token, not finished
    EXPECT_FALSE(u[0].finished);
    EXPECT_EQ(u[0].kv_export, nullptr);
    EXPECT_TRUE(u[1].finished);
    EXPECT_TRUE(u[1].tokens.empty());
    EXPECT_EQ(u[1].reason, engine::FinishReason::kLength);
    ASSERT_TRUE(u[1].handoff);
    EXPECT_TRUE(u[1].handoff->ok) << u[1].handoff->error;
    EXPECT_EQ(u[1].handoff->blocks, 3);
    EXPECT_GT(u[1].handoff->bytes, 0);
    // Stored under the engine's own hash chain: a decode engine's admission finds them.
    std::vector<kvstore::StoreKey> chain;
    for (const kv::BlockKey& k : kv::chain_keys(prompt, kv::make_salt("model", ""))) {
        chain.push_back({k.lo, k.hi});
    }
    EXPECT_EQ(store_->match_prefix(chain).value(), 3);
    EXPECT_EQ(counter("kv_handoff_sent_total"), 1);
    EXPECT_EQ(counter("kv_handoff_blocks_sent_total"), 3);
    EXPECT_EQ(inbox_->stats().blocks_stored, 3);
}

TEST_F(HandoffServiceTest, WithoutATargetOrWithNothingLeftTheGenerationRunsWholeHere) {
    start_inbox();
    start_service();
    {  // no target
        Collector c;
        service_->start(next_ticket_++, generation(200, 6, 5, ""), c.sink());
        const std::vector<Update> u = c.wait();
        ASSERT_EQ(u.size(), 5u);
        EXPECT_FALSE(u.back().handoff);
        EXPECT_EQ(u.back().reason, engine::FinishReason::kLength);
    }
    {  // max_tokens 1: nothing left for a decode engine
        Collector c;
        service_->start(next_ticket_++, generation(200, 7, 1, inbox_address()), c.sink());
        const std::vector<Update> u = c.wait();
        ASSERT_EQ(u.size(), 1u);
        EXPECT_FALSE(u.back().handoff);
    }
    {  // the first token is a stop: finished here
        Generation g = generation(200, 8, 5, inbox_address());
        Collector probe;
        engine_service_->start(next_ticket_++, generation(200, 8, 1, ""), probe.sink());
        g.request.sampling.stop_token_ids = {probe.wait().front().tokens.at(0).token};
        Collector c;
        service_->start(next_ticket_++, std::move(g), c.sink());
        const std::vector<Update> u = c.wait();
        ASSERT_EQ(u.size(), 1u);
        EXPECT_EQ(u.back().reason, engine::FinishReason::kStop);
        EXPECT_FALSE(u.back().handoff);
    }
    {  // a prompt without a full block: a hand-over with nothing to send
        Collector c;
        service_->start(next_ticket_++, generation(100, 9, 5, inbox_address()), c.sink());
        const std::vector<Update> u = c.wait();
        ASSERT_EQ(u.size(), 2u);
        ASSERT_TRUE(u.back().handoff);
        EXPECT_TRUE(u.back().handoff->ok);
        EXPECT_EQ(u.back().handoff->blocks, 0);
        EXPECT_EQ(counter("kv_handoff_empty_total"), 1);
    }
    EXPECT_EQ(inbox_->stats().num_received, 0);
}

TEST_F(HandoffServiceTest, AnUnreachableDecodeEngineIsAFailedHandOverNotAFailedGeneration) {
    start_inbox();
    const uint16_t port = inbox_->port();
    inbox_.reset();  // nobody listens there now
    start_service();
    Collector c;
    service_->start(next_ticket_++, generation(300, 10, 5, "127.0.0.1:" + std::to_string(port)),
                    c.sink());
    const std::vector<Update> u = c.wait();
    ASSERT_EQ(u.size(), 2u);
    EXPECT_EQ(u[0].tokens.size(), 1u);
    ASSERT_TRUE(u[1].handoff);
    EXPECT_FALSE(u[1].handoff->ok);
    EXPECT_NE(u[1].handoff->error.find("UNAVAILABLE"), std::string::npos) << u[1].handoff->error;
    EXPECT_TRUE(u[1].error.is_ok());
    EXPECT_EQ(counter("kv_handoff_failed_total"), 1);
}

TEST_F(HandoffServiceTest, AnAbortWhileTheSendWaitsEndsTheGenerationAsAborted) {
    // A decode engine that accepts and never answers: the one sender thread waits for
    // its Hello / Ack until the 2 s I/O timeout, so the second hand-over queues.
    auto tcp = transfer::make_tcp_transport();
    auto silent = tcp->listen("127.0.0.1", 0).value();
    std::thread acceptor([&silent] {
        auto conn = silent->accept(std::chrono::seconds(10));
        std::this_thread::sleep_for(std::chrono::seconds(3));
    });
    start_service(/*threads=*/1);
    const std::string address = "127.0.0.1:" + std::to_string(silent->port());
    Collector first, second;
    service_->start(100, generation(300, 11, 5, address), first.sink());
    service_->start(101, generation(300, 12, 5, address), second.sink());
    // Abort the second once its first token is out (its KV is then queued).
    second.wait_first();
    service_->abort(101);
    const std::vector<Update> s = second.wait();
    EXPECT_EQ(s.back().reason, engine::FinishReason::kAbort);
    EXPECT_FALSE(s.back().handoff);
    const std::vector<Update> f = first.wait();
    ASSERT_TRUE(f.back().handoff);
    EXPECT_FALSE(f.back().handoff->ok);
    acceptor.join();
    EXPECT_EQ(counter("kv_handoff_aborted_total"), 1);
}

// --- into the decode engine's pool (engine/kv_landing.h) ---

std::vector<int32_t> tokens_of(const std::vector<Update>& u) {
    std::vector<int32_t> t;
    for (const Update& x : u) {
        for (const TokenOut& o : x.tokens) t.push_back(o.token);
    }
    return t;
}

// An engine behind its service, with its own model.
struct Side {
    Side(int64_t blocks, std::shared_ptr<engine::KvLanding> landing = nullptr,
         kvstore::BlockStore* store = nullptr) {
        model = fresh_tiny_model();
        engine::EngineOptions o;
        o.num_kv_blocks = blocks;
        o.scheduler.step_budget_ns = 1e12;
        o.kv_landing = std::move(landing);
        o.kv_store = store;
        engine = engine::Engine::create(model.get(), o, Env::default_env()).value();
        service = std::make_unique<EngineService>(engine.get());
    }
    ~Side() {
        service->stop();
        service.reset();
    }
    std::vector<Update> run(engine::GenerateRequest r) {
        Collector c;
        Generation g;
        g.request = std::move(r);
        service->start(next_ticket++, std::move(g), c.sink());
        return c.wait();
    }
    engine::EngineStats stats() const { return service->stats_snapshot().engine; }

    std::unique_ptr<DeepseekModel> model;
    std::unique_ptr<engine::Engine> engine;
    std::unique_ptr<EngineService> service;
    Ticket next_ticket = 1;
};

engine::GenerateRequest request(std::vector<int32_t> prompt, int max_tokens, bool seeded) {
    engine::GenerateRequest r;
    r.prompt = std::move(prompt);
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    if (seeded) {
        r.sampling.temperature = 0.8f;
        r.sampling.seed = 5;
    }
    return r;
}

// The decode side receives into its engine's pool (a landing); the prefill side is
// HandoffServiceTest's engine; a third engine runs whole requests for reference.
class KvLandingTest : public HandoffServiceTest {
protected:
    static constexpr int64_t kDecodeBlocks = 24;

    void SetUp() override {
        HandoffServiceTest::SetUp();
        start(std::chrono::seconds(30));
    }
    void TearDown() override {
        inbox_.reset();  // its writes into the pool end before the engine goes
        decode_.reset();
        HandoffServiceTest::TearDown();
    }

    void start(std::chrono::milliseconds ttl) {
        inbox_.reset();
        decode_.reset();
        landing_ = std::make_shared<engine::KvLanding>(ttl);
        decode_ = std::make_unique<Side>(kDecodeBlocks, landing_, store_.get());
        landing_->set_waker([s = decode_->service.get()] { s->wake(); });
        serving::KvInboxOptions io = inbox_options();
        io.landing = landing_.get();
        io.io_timeout = std::chrono::seconds(5);
        inbox_ = serving::KvInbox::start(io, store_.get()).value();
    }

    struct Prefilled {
        std::shared_ptr<const kv::KvExport> kv;
        int32_t first = -1;
    };
    // The prefill engine's run of `prompt` (max_tokens 1): its export and first token.
    Prefilled prefilled(std::vector<int32_t> prompt, bool seeded) {
        Collector c;
        Generation g;
        g.request = request(std::move(prompt), 1, seeded);
        g.request.export_kv = true;
        engine_service_->start(next_ticket_++, std::move(g), c.sink());
        const std::vector<Update> u = c.wait();
        Prefilled p;
        p.kv = u.back().kv_export;
        if (!tokens_of(u).empty()) p.first = tokens_of(u)[0];
        return p;
    }

    Result<transfer::SendReport> send(const kv::KvExport& kv, uint64_t id,
                                      transfer::Transport* transport = nullptr,
                                      std::function<bool()> should_abort = nullptr) {
        serving::HandoffSendOptions so;
        so.self = {"prefill-0", transfer::PeerRole::kPrefill, 1};
        so.io_timeout = std::chrono::seconds(5);
        so.should_abort = std::move(should_abort);
        return serving::send_kv_export(transport ? *transport : *tcp_, kv,
                                       {inbox_address(), {9, id}}, so);
    }

    // The continuation the router sends after the first token.
    std::vector<Update> continue_on_decode(std::vector<int32_t> prompt, int32_t first,
                                           int max_tokens, bool seeded) {
        engine::GenerateRequest r = request(std::move(prompt), max_tokens, seeded);
        r.resume_output = {first};
        return decode_->run(std::move(r));
    }

    // Waits (at most 10 s) until the decode engine's pool holds nothing for hand-overs
    // and every block is available again (free or cached), as at the start.
    void expect_pool_back(const char* what) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        engine::KvLandingStats l;
        engine::EngineStats e;
        do {
            decode_->service->wake();
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            l = landing_->stats();
            e = decode_->stats();
        } while ((l.blocks_held != 0 || e.pool.num_used != 0) &&
                 std::chrono::steady_clock::now() < deadline);
        EXPECT_EQ(l.blocks_held, 0) << what;
        EXPECT_EQ(e.pool.num_used, 0) << what;
        EXPECT_EQ(e.pool.num_free + e.pool.num_cached, kDecodeBlocks) << what;
    }

    Side reference_{64};  // the whole request on one engine, no hand-over
    std::unique_ptr<transfer::Transport> tcp_ = transfer::make_tcp_transport();
    std::shared_ptr<engine::KvLanding> landing_;
    std::unique_ptr<Side> decode_;
};

// Full blocks and the tail land in the pool; the continuation computes only the first
// output token and streams what one engine streams, greedy and seeded.
TEST_F(KvLandingTest, LandedBlocksAndTailGiveTheTokensOfOneEngine) {
    uint64_t id = 1;
    for (const bool seeded : {false, true}) {
        for (const int len : {3 * 128 + 10, 2 * 128}) {
            const std::string what = (seeded ? "seeded, " : "greedy, ") + std::to_string(len);
            const std::vector<int32_t> prompt = prompt_of(len, 20 + id);
            Prefilled p = prefilled(prompt, seeded);
            ASSERT_NE(p.kv, nullptr) << what;
            EXPECT_EQ(p.kv->num_blocks(), static_cast<size_t>(len / 128)) << what;
            EXPECT_EQ(p.kv->tail_tokens, static_cast<uint32_t>(len % 128)) << what;
            ASSERT_TRUE(send(*p.kv, id++).is_ok()) << what;
            const int64_t computed = decode_->stats().computed_prefill_tokens;
            const std::vector<Update> u = continue_on_decode(prompt, p.first, 12, seeded);
            // Admitted past the whole prompt: only the first output token was computed.
            EXPECT_EQ(u.front().cached_prompt_tokens, len) << what;
            EXPECT_EQ(decode_->stats().computed_prefill_tokens - computed, 1) << what;
            std::vector<int32_t> got = {p.first};
            for (int32_t t : tokens_of(u)) got.push_back(t);
            EXPECT_EQ(got, tokens_of(reference_.run(request(prompt, 12, seeded)))) << what;
        }
    }
    const engine::KvLandingStats l = landing_->stats();
    EXPECT_EQ(l.attached, 4);
    EXPECT_EQ(l.tail_tokens, 2 * 10);
    EXPECT_EQ(inbox_->stats().num_landed, 4);
    EXPECT_EQ(inbox_->stats().tail_tokens_landed, 2 * 10);
    EXPECT_EQ(inbox_->stats().blocks_stored, 0);  // nothing went through the store tier
    expect_pool_back("after the continuations");
}

// A continuation whose tail tokens differ from the landed ones attaches no tail: it
// takes the full blocks (same keys) and computes the rest, giving its own tokens.
TEST_F(KvLandingTest, ADifferentTailAttachesNothingAndIsRecomputed) {
    std::vector<int32_t> prompt = prompt_of(2 * 128 + 30, 31);
    Prefilled p = prefilled(prompt, false);
    ASSERT_NE(p.kv, nullptr);
    ASSERT_TRUE(send(*p.kv, 50).is_ok());
    prompt[2 * 128 + 7] = (prompt[2 * 128 + 7] + 1) % 500;
    const std::vector<Update> u = continue_on_decode(prompt, p.first, 6, false);
    EXPECT_EQ(u.front().cached_prompt_tokens, 2 * 128);
    std::vector<int32_t> want_prompt = prompt;
    want_prompt.push_back(p.first);
    std::vector<int32_t> want = tokens_of(reference_.run(request(want_prompt, 5, false)));
    EXPECT_EQ(tokens_of(u), want);
    EXPECT_EQ(landing_->stats().attached, 0);
    EXPECT_EQ(landing_->stats().tail_tokens, 0);
}

// A transfer that the sender aborts mid-way, one whose frames fail their digest and one
// cut inside the layers release their reservation at once; a malformed one is refused
// before any block is reserved.
TEST_F(KvLandingTest, FailedTransfersReleaseTheirBlocksAndMalformedOnesTakeNone) {
    Prefilled p = prefilled(prompt_of(4 * 128 + 50, 41), false);
    ASSERT_NE(p.kv, nullptr);
    int frames = 0;
    EXPECT_FALSE(send(*p.kv, 60, nullptr, [&frames] { return ++frames > 6; }).is_ok());
    transfer::FaultPlan damage;
    damage.corrupt_rate = 1.0;
    damage.spare_first_writes = 3;
    transfer::FaultInjectingTransport damaged(tcp_.get(), damage);
    auto d = send(*p.kv, 61, &damaged);
    ASSERT_FALSE(d.is_ok());
    EXPECT_EQ(d.status().code(), StatusCode::kDataLoss) << d.status().to_string();
    transfer::FaultPlan cut;
    cut.cut_after_bytes = p.kv->bytes() / 2;
    transfer::FaultInjectingTransport cutting(tcp_.get(), cut);
    EXPECT_FALSE(send(*p.kv, 62, &cutting).is_ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (inbox_->stats().num_failed < 3 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(inbox_->stats().num_failed, 3);
    expect_pool_back("after the failed transfers");
    EXPECT_EQ(landing_->stats().dropped, 3);
    const int64_t reserved = landing_->stats().reserved;
    EXPECT_EQ(reserved, 3);
    // A layer of another size: refused at Begin, nothing reserved.
    kv::KvExport bad = *p.kv;
    bad.layer_block_bytes[0] += 512;
    bad.layers[0].resize(bad.num_blocks() * bad.layer_block_bytes[0] + bad.tail_bytes(0));
    auto r = send(bad, 63);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().to_string();
    EXPECT_EQ(landing_->stats().reserved, reserved);
    expect_pool_back("after the malformed transfer");
}

// A continuation that never comes: its landing is released after the TTL (the full
// blocks stay in the prefix index, unreferenced).
TEST_F(KvLandingTest, ALandingWhoseContinuationNeverComesIsReleasedAfterItsTtl) {
    start(std::chrono::seconds(1));
    Prefilled p = prefilled(prompt_of(3 * 128 + 5, 51), false);
    ASSERT_NE(p.kv, nullptr);
    ASSERT_TRUE(send(*p.kv, 70).is_ok());
    EXPECT_GT(landing_->stats().blocks_held, 0);
    expect_pool_back("after the TTL");
    EXPECT_EQ(landing_->stats().expired, 1);
}

// A pool with no room: the transfer takes the store-tier path (full blocks only), and the
// continuation still gives the tokens of one engine.
TEST_F(KvLandingTest, APoolWithNoRoomFallsBackToTheStoreTier) {
    Result<engine::KvLanding::Grant> all =
        landing_->reserve(kDecodeBlocks * 128, std::chrono::seconds(5));
    ASSERT_TRUE(all.is_ok()) << all.status().to_string();
    const std::vector<int32_t> prompt = prompt_of(3 * 128 + 20, 61);
    Prefilled p = prefilled(prompt, false);
    ASSERT_NE(p.kv, nullptr);
    ASSERT_TRUE(send(*p.kv, 80).is_ok());
    EXPECT_EQ(inbox_->stats().num_landing_fallbacks, 1);
    EXPECT_EQ(inbox_->stats().blocks_stored, 3);
    EXPECT_EQ(landing_->stats().refused, 1);
    landing_->drop(all->handle);
    const std::vector<Update> u = continue_on_decode(prompt, p.first, 8, false);
    EXPECT_EQ(u.front().cached_prompt_tokens, 3 * 128);  // the store tier's blocks
    std::vector<int32_t> got = {p.first};
    for (int32_t t : tokens_of(u)) got.push_back(t);
    EXPECT_EQ(got, tokens_of(reference_.run(request(prompt, 8, false))));
    expect_pool_back("after the fallback");
}

}  // namespace
}  // namespace dsi::server
