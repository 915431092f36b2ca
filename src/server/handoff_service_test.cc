// HandoffService (the prefill side of the KV hand-over) over a real engine service and
// a real KvInbox on loopback TCP: the first token goes out at once, the prompt's full
// blocks reach the decode engine's store tier before the final update says so; a
// generation without a target, a first token that stops, a short prompt, an unreachable
// decode engine and an abort while the send waits each end as the header says.
// No timed assertions (timeouts only bound the failing cases).
#include "server/handoff_service.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <random>
#include <thread>

#include "base/mutex.h"
#include "kv/block_key.h"
#include "kvstore/shm_store.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "server/engine_service.h"

namespace dsi::server {
namespace {

DeepseekModel& tiny_model() {
    static std::unique_ptr<DeepseekModel> m = [] {
        ModelConfig c = synthetic_preset("tiny-v3").value();
        c.vocab_size = 512;
        return DeepseekModel::load(synthetic_memory_model(c, 99), {2}).value();
    }();
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
    void start_inbox() {
        auto probe = export_of(prompt_of(300, 1));
        ASSERT_NE(probe, nullptr);
        serving::KvInboxOptions io;
        io.host = "127.0.0.1";
        io.self = {"decode-0", transfer::PeerRole::kDecode, 2};
        io.model_id = probe->model_id;
        io.dtype = probe->dtype;
        io.layer_block_bytes = probe->layer_block_bytes;
        inbox_ = serving::KvInbox::start(io, store_.get()).value();
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

}  // namespace
}  // namespace dsi::server
