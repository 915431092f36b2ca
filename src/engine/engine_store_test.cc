// Engine + KV block store (S-KV-4..7): restart hits from a file:// store with outputs
// bitwise equal to a cold run, decode blocks written behind, a damaged block is a miss,
// a dead / full store or a full write-behind queue never stops serving, swap-in
// overlaps the forward pass (counted). Small in-memory model (reduced vocabulary).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "kv/block_key.h"
#include "kvstore/block_store.h"
#include "kvstore/file_store.h"
#include "kvstore/redis_test_server.h"
#include "kvstore/shm_store.h"
#include "model/deepseek.h"
#include "model/synthetic.h"

namespace dsi::engine {
namespace {

namespace fs = std::filesystem;

DeepseekModel& shared_model() {
    static std::unique_ptr<DeepseekModel> m = [] {
        ModelConfig c = synthetic_preset("tiny-v3").value();
        c.vocab_size = 512;
        return DeepseekModel::load(synthetic_memory_model(c, 1234), {2}).value();
    }();
    return *m;
}

struct Output {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
};

EngineOptions options(const std::string& uri = "") {
    EngineOptions o;
    o.num_kv_blocks = 32;
    o.record_logits = true;
    o.scheduler.step_budget_ns = 1e12;
    o.kv_store_uri = uri;
    return o;
}

std::vector<int32_t> prompt_of(int len, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng() % 512));
    return p;
}

// Runs one greedy request to the end (checking invariants between steps).
Output run_one(Engine& e, std::vector<int32_t> prompt, int max_tokens) {
    Output out;
    GenerateRequest r;
    r.prompt = std::move(prompt);
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    EXPECT_TRUE(e.add_request(std::move(r), [&](const TokenEvent& ev) {
                     if (ev.token < 0) return;
                     out.tokens.push_back(ev.token);
                     out.logits.emplace_back(ev.logits.begin(), ev.logits.end());
                 }).is_ok());
    for (int i = 0; i < 100000 && e.has_work(); ++i) {
        Status s = e.step();
        EXPECT_TRUE(s.is_ok()) << s.to_string();
        Status inv = e.check_invariants();
        EXPECT_TRUE(inv.is_ok()) << inv.to_string();
        if (!s.is_ok() || !inv.is_ok()) break;
    }
    EXPECT_FALSE(e.has_work());
    return out;
}

Output run_fresh(EngineOptions o, const std::vector<int32_t>& prompt, int max_tokens,
                 EngineStats* stats = nullptr) {
    std::unique_ptr<Engine> e = Engine::create(&shared_model(), std::move(o),
                                               Env::default_env()).value();
    Output out = run_one(*e, prompt, max_tokens);
    if (stats) *stats = e->stats();
    return out;
}

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() /
               ("dsi_engine_store_" + std::to_string(::getpid()) + "_" +
                std::to_string(std::random_device{}()));
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string uri() const { return "file://" + path.string(); }
};

void expect_same(const Output& a, const Output& b) {
    ASSERT_EQ(a.tokens, b.tokens);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    for (size_t i = 0; i < a.logits.size(); ++i) EXPECT_EQ(a.logits[i], b.logits[i]) << i;
}

constexpr int kPromptLen = 5 * 128 + 40;

TEST(EngineStoreTest, RestartHitsTheStoreWithColdOutputs) {
    const std::vector<int32_t> prompt = prompt_of(kPromptLen, 1);
    EngineStats cold_stats;
    const Output cold = run_fresh(options(), prompt, 6, &cold_stats);
    EXPECT_EQ(cold_stats.computed_prefill_tokens, kPromptLen);

    TempDir dir;
    EngineStats a;
    expect_same(run_fresh(options(dir.uri()), prompt, 6, &a), cold);
    EXPECT_EQ(a.store_blocks_offered, 5);
    EXPECT_LE(a.store_blocks_written, 5);  // the rest drain in the destructor (B hits all 5)
    EXPECT_EQ(a.store_hit_blocks, 0);

    // Engine B: fresh pool, same store; the forward pass may start before the last
    // layer of the fetched blocks has arrived (slowed swap-in makes it certain).
    EngineOptions ob = options(dir.uri());
    ob.swap_in_layer_delay_us = 3000;
    EngineStats b;
    expect_same(run_fresh(ob, prompt, 6, &b), cold);
    EXPECT_EQ(b.store_lookups, 1);
    EXPECT_EQ(b.store_hit_blocks, 5);
    EXPECT_EQ(b.store_hit_tokens, 5 * 128);
    EXPECT_EQ(b.computed_prefill_tokens, 40);
    EXPECT_EQ(b.cached_prompt_tokens, 5 * 128);
    EXPECT_EQ(b.store_blocks_offered, 0);  // fetched blocks are not written back
    EXPECT_EQ(b.fetch_count, 1);
    EXPECT_GT(b.store_bytes_read, 0);
    EXPECT_EQ(b.swap_in_count, 1);
    EXPECT_EQ(b.swap_in_overlapped, 1);
    // swap_in_wait_ns (time attention waited on a layer) is reported, not asserted: it
    // is 0 whenever the forward pass happens to be slower than the copy.
    EXPECT_GE(b.swap_in_sum_ns, b.swap_in_wait_ns / 2);

    // Async off: same outputs, same hits.
    EngineOptions oc = options(dir.uri());
    oc.async = false;
    EngineStats c;
    expect_same(run_fresh(oc, prompt, 6, &c), cold);
    EXPECT_EQ(c.store_hit_blocks, 5);
    EXPECT_EQ(c.computed_prefill_tokens, 40);
}

TEST(EngineStoreTest, DecodeBlocksAreWrittenBehind) {
    // S-KV-7: 200 prompt tokens + 100 generated: block 1 completes during decode.
    TempDir dir;
    const std::vector<int32_t> prompt = prompt_of(200, 2);
    EngineStats a;
    const Output first = run_fresh(options(dir.uri()), prompt, 100, &a);
    EXPECT_EQ(a.store_blocks_offered, 2);
    // A follow-up turn (prompt + answer + more) hits both blocks from the store.
    std::vector<int32_t> turn2 = prompt;
    turn2.insert(turn2.end(), first.tokens.begin(), first.tokens.end());
    turn2.push_back(7);
    const Output cold = run_fresh(options(), turn2, 4);
    EngineStats b;
    expect_same(run_fresh(options(dir.uri()), turn2, 4, &b), cold);
    EXPECT_EQ(b.store_hit_blocks, 2);
    EXPECT_EQ(b.computed_prefill_tokens, static_cast<int64_t>(turn2.size()) - 256);
}

TEST(EngineStoreTest, DamagedBlockIsAMissAndOutputsStayCorrect) {
    TempDir dir;
    const std::vector<int32_t> prompt = prompt_of(kPromptLen, 3);
    const Output cold = run_fresh(options(), prompt, 5);
    (void)run_fresh(options(dir.uri()), prompt, 5);
    // Flip a payload byte of block 2 (its file is named by the chain key).
    const std::vector<kv::BlockKey> keys =
        kv::chain_keys(prompt, kv::make_salt(options().model_id, ""));
    const std::string name = kvstore::to_hex({keys[2].lo, keys[2].hi}) + ".blk";
    bool found = false;
    for (const auto& f : fs::recursive_directory_iterator(dir.path)) {
        if (f.path().filename() != name) continue;
        std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
        io.seekp(static_cast<std::streamoff>(f.file_size() - 100));
        char c = 0;
        io.read(&c, 1);
        io.seekp(static_cast<std::streamoff>(f.file_size() - 100));
        c = static_cast<char>(c ^ 0x5a);
        io.write(&c, 1);
        found = true;
    }
    ASSERT_TRUE(found);
    EngineStats b;
    expect_same(run_fresh(options(dir.uri()), prompt, 5, &b), cold);
    EXPECT_EQ(b.store_hit_blocks, 2);  // blocks 0, 1; the chain stops at the damage
    EXPECT_GE(b.store_miss_blocks, 1);
    EXPECT_EQ(b.computed_prefill_tokens, kPromptLen - 2 * 128);
}

// A store whose every operation fails (down, or full for writes).
class FailingStore final : public kvstore::BlockStore {
public:
    explicit FailingStore(bool full) : full_(full) {}
    Status put(const kvstore::BlockInfo&, std::span<const std::span<const uint8_t>>,
               int64_t) override {
        if (full_) {
            metrics_.puts_dropped.fetch_add(1);
            return resource_exhausted("disk full");
        }
        return unavailable("down");
    }
    Result<kvstore::Block> get(const kvstore::StoreKey&, const kvstore::BlockInfo*,
                               int64_t) override {
        return unavailable("down");
    }
    Result<bool> contains(const kvstore::StoreKey&, int64_t) override {
        return unavailable("down");
    }
    Result<int64_t> match_prefix(std::span<const kvstore::StoreKey>, int64_t) override {
        if (full_) return int64_t{0};
        return unavailable("down");
    }
    Status remove(const kvstore::StoreKey&) override { return unavailable("down"); }
    Result<std::vector<kvstore::GcEntry>> list_blocks() override { return unavailable("down"); }
    Result<int64_t> capacity_bytes() override { return unavailable("down"); }
    kvstore::StoreMetrics& metrics() override { return metrics_; }
    std::string uri() const override { return "failing://"; }

private:
    bool full_;
    kvstore::StoreMetrics metrics_;
};

TEST(EngineStoreTest, DeadOrFullStoreDoesNotStopServing) {
    const std::vector<int32_t> prompt = prompt_of(kPromptLen, 4);
    const Output cold = run_fresh(options(), prompt, 5);
    for (bool full : {false, true}) {
        FailingStore store(full);
        EngineOptions o = options();
        o.kv_store = &store;
        EngineStats s;
        expect_same(run_fresh(o, prompt, 5, &s), cold);
        EXPECT_EQ(s.store_hit_blocks, 0);
        EXPECT_EQ(s.computed_prefill_tokens, kPromptLen);
        EXPECT_EQ(s.store_blocks_offered, 5);
        if (full) {
            EXPECT_EQ(s.store_puts_dropped, 5);
        }
    }
    // An unreachable Redis and a malformed URI: served without a store.
    for (const char* uri : {"redis://127.0.0.1:1?timeout_ms=50", "bogus://x"}) {
        EngineStats s;
        expect_same(run_fresh(options(uri), prompt, 5, &s), cold);
        EXPECT_EQ(s.store_hit_blocks, 0);
    }
}

// Restart through Redis: engine A writes blocks behind to redis://, engine B (fresh
// pool) hits them with cold outputs. Then the server is killed between B's requests:
// the next request misses, computes everything, its writes are dropped, and nothing
// hangs (every Redis call has a timeout).
TEST(EngineStoreTest, RedisRestartHitsAndKilledServerIsAMiss) {
    if (!kvstore::testing::have_redis_server()) GTEST_SKIP() << "no redis-server";
    kvstore::testing::RedisTestServer server;
    ASSERT_TRUE(server.ready());
    const std::string uri =
        "redis://127.0.0.1:" + std::to_string(server.port()) + "?timeout_ms=500&backoff_ms=100";
    const std::vector<int32_t> prompt = prompt_of(kPromptLen, 11);
    const std::vector<int32_t> other = prompt_of(kPromptLen, 12);
    const Output cold = run_fresh(options(), prompt, 4);
    const Output cold_other = run_fresh(options(), other, 4);
    EngineStats a;
    expect_same(run_fresh(options(uri), prompt, 4, &a), cold);
    (void)run_fresh(options(uri), other, 4);  // `other` is in Redis too
    EXPECT_EQ(a.store_blocks_offered, 5);

    std::unique_ptr<Engine> b =
        Engine::create(&shared_model(), options(uri), Env::default_env()).value();
    expect_same(run_one(*b, prompt, 4), cold);
    EXPECT_EQ(b->stats().store_hit_blocks, 5);
    EXPECT_EQ(b->stats().computed_prefill_tokens, 40);

    server.kill9();
    const auto t0 = std::chrono::steady_clock::now();
    expect_same(run_one(*b, other, 4), cold_other);
    const EngineStats s = b->stats();
    EXPECT_EQ(s.store_hit_blocks, 5) << "no new hits with the server dead";
    EXPECT_EQ(s.computed_prefill_tokens, 40 + kPromptLen);
    EXPECT_EQ(s.store_blocks_offered, 5);  // other's blocks: offered, then refused
    b.reset();  // the write-behind drain is bounded
    std::printf("request + shutdown with the Redis server dead: %.0f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count());
}

// The chain engine pool -> host shm -> store: a restart hits the shm tier; with the shm
// pool emptied the blocks come from the file store (and are promoted into shm); a
// repeat in the same engine hits the device pool. Outputs are always the cold ones.
TEST(EngineStoreTest, HitAtEachTierThroughTheShmPool) {
    TempDir dir;
    const std::string name = "dsi_engine_test_" + std::to_string(::getpid());
    (void)kvstore::ShmBlockStore::unlink(name);
    kvstore::ShmStoreOptions so;
    so.name = name;
    so.num_slots = 16;
    so.slot_bytes = 1 << 20;
    so.unlink_on_close = true;
    std::unique_ptr<kvstore::ShmBlockStore> shm = kvstore::ShmBlockStore::open(so).value();
    std::unique_ptr<kvstore::FileBlockStore> file =
        kvstore::FileBlockStore::open(dir.path.string()).value();
    kvstore::TieredBlockStore tiers(shm.get(), file.get());
    EngineOptions o = options();
    o.kv_store = &tiers;
    const std::vector<int32_t> prompt = prompt_of(kPromptLen, 13);
    const Output cold = run_fresh(options(), prompt, 4);
    expect_same(run_fresh(o, prompt, 4), cold);  // writes behind to shm and file

    EngineStats b;
    expect_same(run_fresh(o, prompt, 4, &b), cold);
    EXPECT_EQ(b.store_hit_blocks, 5);
    EXPECT_EQ(shm->metrics().snapshot().hits, 5) << "host shm tier";
    EXPECT_EQ(file->metrics().snapshot().hits, 0);

    for (const kv::BlockKey& k : kv::chain_keys(prompt, kv::make_salt(o.model_id, ""))) {
        ASSERT_TRUE(shm->remove({k.lo, k.hi}).is_ok());
    }
    std::unique_ptr<Engine> c = Engine::create(&shared_model(), o, Env::default_env()).value();
    expect_same(run_one(*c, prompt, 4), cold);
    EXPECT_EQ(c->stats().store_hit_blocks, 5);
    EXPECT_EQ(file->metrics().snapshot().hits, 5) << "store tier";
    EXPECT_EQ(shm->list_blocks()->size(), 5u) << "promoted back into shm";
    expect_same(run_one(*c, prompt, 4), cold);
    EXPECT_EQ(c->stats().store_hit_blocks, 5) << "no store read the second time";
    EXPECT_GE(c->stats().pool.hit_blocks, 5) << "device pool tier";
}

// Issue 18 hand-over: a prefill engine's export of its finished sequence (export_kv),
// stored block by block where a decode engine looks (here: its shm tier), lets the
// decode engine continue the generation (resume_output = the first token) computing
// only the partial block and that token, with the cold run's tokens and logits.
TEST(EngineStoreTest, ExportedBlocksLetAnotherEngineContinueWithColdOutputs) {
    const std::vector<int32_t> prompt = prompt_of(kPromptLen, 21);
    const Output cold = run_fresh(options(), prompt, 6);

    std::unique_ptr<Engine> a = Engine::create(&shared_model(), options(),
                                               Env::default_env()).value();
    std::shared_ptr<const kv::KvExport> exported;
    std::vector<int32_t> first;
    GenerateRequest r;
    r.prompt = prompt;
    r.sampling.max_tokens = 1;
    r.sampling.ignore_eos = true;
    r.export_kv = true;
    ASSERT_TRUE(a->add_request(r, [&](const TokenEvent& ev) {
                     if (ev.token >= 0) first.push_back(ev.token);
                     if (ev.finished) {
                         EXPECT_EQ(ev.reason, FinishReason::kLength);
                         exported = ev.kv_export;
                     }
                 }).is_ok());
    ASSERT_TRUE(a->run().is_ok());
    ASSERT_EQ(first, std::vector<int32_t>{cold.tokens[0]});
    ASSERT_NE(exported, nullptr);
    EXPECT_EQ(a->stats().kv_exports, 1);
    ASSERT_EQ(exported->num_blocks(), 5u);  // the full prompt blocks; the partial one's rows:
    EXPECT_EQ(exported->tail_tokens, static_cast<uint32_t>(kPromptLen % 128));
    const std::span<const int32_t> tail = std::span<const int32_t>(prompt).subspan(5 * 128);
    EXPECT_EQ(exported->tail_token_hash, kvstore::token_ids_hash(tail));
    const std::vector<kv::BlockKey> chain =
        kv::chain_keys(prompt, kv::make_salt(options().model_id, ""));
    for (size_t b = 0; b < 5; ++b) {
        EXPECT_EQ(exported->keys[b], (kvstore::StoreKey{chain[b].lo, chain[b].hi}));
    }
    ASSERT_EQ(exported->layer_block_bytes.size(), exported->num_layers());
    EXPECT_EQ(exported->bytes(), exported->num_layers() * exported->num_blocks() *
                                         exported->layer_block_bytes[0] +
                                     exported->num_layers() * exported->tail_bytes(0));
    EXPECT_EQ(exported->tail_bytes(0), exported->layer_block_bytes[0] / 128 * (kPromptLen % 128));
    EXPECT_EQ(exported->swa_state, nullptr);

    const std::string name = "dsi_engine_export_" + std::to_string(::getpid());
    (void)kvstore::ShmBlockStore::unlink(name);
    kvstore::ShmStoreOptions so;
    so.name = name;
    so.num_slots = 16;
    so.slot_bytes = 1 << 20;
    so.unlink_on_close = true;
    std::unique_ptr<kvstore::ShmBlockStore> inbox = kvstore::ShmBlockStore::open(so).value();
    for (size_t b = 0; b < exported->num_blocks(); ++b) {
        std::vector<std::span<const uint8_t>> layers;
        for (uint32_t l = 0; l < exported->num_layers(); ++l) layers.push_back(exported->layer(l, b));
        ASSERT_TRUE(inbox->put(exported->info(b), layers).is_ok());
    }

    EngineOptions ob = options();
    ob.kv_store = inbox.get();
    std::unique_ptr<Engine> b = Engine::create(&shared_model(), ob, Env::default_env()).value();
    Output rest;
    GenerateRequest c;
    c.prompt = prompt;
    c.sampling.max_tokens = 6;
    c.sampling.ignore_eos = true;
    c.resume_output = first;
    ASSERT_TRUE(b->add_request(c, [&](const TokenEvent& ev) {
                     if (ev.token < 0) return;
                     rest.tokens.push_back(ev.token);
                     rest.logits.emplace_back(ev.logits.begin(), ev.logits.end());
                 }).is_ok());
    ASSERT_TRUE(b->run().is_ok());
    Output expected;
    expected.tokens.assign(cold.tokens.begin() + 1, cold.tokens.end());
    expected.logits.assign(cold.logits.begin() + 1, cold.logits.end());
    expect_same(rest, expected);
    EXPECT_EQ(b->stats().store_hit_blocks, 5);
    EXPECT_EQ(b->stats().computed_prefill_tokens, 40 + 1);  // the partial block + the token

    // No export: a prompt without a full block, n > 1, an aborted request.
    for (int variant = 0; variant < 3; ++variant) {
        GenerateRequest q;
        q.prompt = variant == 0 ? prompt_of(100, 22) : prompt;
        q.sampling.max_tokens = variant == 2 ? 50 : 1;
        q.sampling.ignore_eos = true;
        q.sampling.n = variant == 1 ? 2 : 1;
        q.export_kv = true;
        int finished = 0;
        auto id = a->add_request(q, [&](const TokenEvent& ev) {
            if (!ev.finished) return;
            ++finished;
            EXPECT_EQ(ev.kv_export, nullptr) << variant;
        });
        ASSERT_TRUE(id.is_ok());
        if (variant == 2) {
            ASSERT_TRUE(a->step().is_ok());
            ASSERT_TRUE(a->abort(*id).is_ok());
        }
        ASSERT_TRUE(a->run().is_ok());
        EXPECT_EQ(finished, variant == 1 ? 2 : 1) << variant;
    }
    EXPECT_EQ(a->stats().kv_exports, 1);
    ASSERT_TRUE(a->check_invariants().is_ok());
}

TEST(EngineStoreTest, FullWriteQueueDropsAndCounts) {
    TempDir dir;
    const std::vector<int32_t> prompt = prompt_of(kPromptLen, 5);
    const Output cold = run_fresh(options(), prompt, 3);
    EngineOptions o = options(dir.uri());
    o.kv_store_write_queue_bytes = 1;  // nothing fits
    EngineStats s;
    expect_same(run_fresh(o, prompt, 3, &s), cold);
    EXPECT_EQ(s.store_blocks_offered, 0);
    EXPECT_EQ(s.store_blocks_dropped, 5);
}

TEST(EngineStoreTest, OtherRequestsRunWhileOneFetches) {
    // A slow swap-in and a fetch must not block a request that needs no store.
    TempDir dir;
    const std::vector<int32_t> shared = prompt_of(kPromptLen, 6);
    (void)run_fresh(options(dir.uri()), shared, 2);
    const std::vector<int32_t> other = prompt_of(50, 7);
    const Output cold_shared = run_fresh(options(), shared, 4);
    const Output cold_other = run_fresh(options(), other, 4);
    std::unique_ptr<Engine> e =
        Engine::create(&shared_model(), options(dir.uri()), Env::default_env()).value();
    std::map<int, Output> out;
    int idx = 0;
    for (const auto* p : {&shared, &other}) {
        GenerateRequest r;
        r.prompt = *p;
        r.sampling.max_tokens = 4;
        r.sampling.ignore_eos = true;
        const int k = idx++;
        ASSERT_TRUE(e->add_request(std::move(r), [&out, k](const TokenEvent& ev) {
                         if (ev.token < 0) return;
                         out[k].tokens.push_back(ev.token);
                         out[k].logits.emplace_back(ev.logits.begin(), ev.logits.end());
                     }).is_ok());
    }
    ASSERT_TRUE(e->run().is_ok());
    ASSERT_TRUE(e->check_invariants().is_ok());
    expect_same(out[0], cold_shared);
    expect_same(out[1], cold_other);
    EXPECT_EQ(e->stats().store_hit_blocks, 5);
}

// A file:// store whose reads wait at a gate the test opens (a fetch held in flight).
class GatedStore final : public kvstore::BlockStore {
public:
    explicit GatedStore(kvstore::BlockStore* inner) : inner_(inner) {}
    void close_gate() {
        std::lock_guard<std::mutex> l(mu_);
        open_ = false;
        entered_ = false;
    }
    void open_gate() {
        {
            std::lock_guard<std::mutex> l(mu_);
            open_ = true;
        }
        cv_.notify_all();
    }
    bool entered() {
        std::lock_guard<std::mutex> l(mu_);
        return entered_;
    }
    Status put(const kvstore::BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
               int64_t d) override {
        return inner_->put(info, layers, d);
    }
    Result<kvstore::Block> get(const kvstore::StoreKey& k, const kvstore::BlockInfo* e,
                               int64_t d) override {
        wait_gate();
        return inner_->get(k, e, d);
    }
    std::vector<Result<kvstore::Block>> get_many(std::span<const kvstore::StoreKey> k,
                                                 std::span<const kvstore::BlockInfo> e,
                                                 int64_t d) override {
        wait_gate();
        return inner_->get_many(k, e, d);
    }
    std::vector<Result<kvstore::Block>> read_many_into(
        std::span<const kvstore::StoreKey> k, std::span<const kvstore::BlockInfo> e,
        std::span<const std::span<uint8_t>> dsts, int64_t d) override {
        wait_gate();
        return inner_->read_many_into(k, e, dsts, d);
    }
    Result<bool> contains(const kvstore::StoreKey& k, int64_t d) override {
        return inner_->contains(k, d);
    }
    Result<int64_t> match_prefix(std::span<const kvstore::StoreKey> c, int64_t d) override {
        return inner_->match_prefix(c, d);
    }
    Status remove(const kvstore::StoreKey& k) override { return inner_->remove(k); }
    Result<std::vector<kvstore::GcEntry>> list_blocks() override { return inner_->list_blocks(); }
    Result<int64_t> capacity_bytes() override { return inner_->capacity_bytes(); }
    kvstore::StoreMetrics& metrics() override { return inner_->metrics(); }
    std::string uri() const override { return "gated+" + inner_->uri(); }

private:
    void wait_gate() {
        std::unique_lock<std::mutex> l(mu_);
        entered_ = true;
        cv_.wait_for(l, std::chrono::seconds(30), [this] { return open_; });
    }
    kvstore::BlockStore* inner_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool open_ = true;
    bool entered_ = false;
};

int64_t buffers_in_use_when_settled(const Engine& e, int64_t want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (e.stats().fetch_buffers_in_use != want && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return e.stats().fetch_buffers_in_use;
}

// S-KV-5: the fetcher reads into a bounded pool of reused host buffers; each is free
// again once its block is swapped in, also when the request is aborted mid-fetch; a
// pool smaller than the chain fetches the chain's head and computes the rest.
TEST(EngineStoreTest, FetchBuffersAreReusedBoundedAndNotLeaked) {
    TempDir dir;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<Output> colds;
    for (uint64_t i = 0; i < 3; ++i) {
        prompts.push_back(prompt_of(kPromptLen, 20 + i));
        colds.push_back(run_fresh(options(), prompts.back(), 3));
        (void)run_fresh(options(dir.uri()), prompts.back(), 3);  // into the store
    }
    std::unique_ptr<kvstore::FileBlockStore> file =
        kvstore::FileBlockStore::open(dir.path.string()).value();
    GatedStore gated(file.get());
    EngineOptions o = options();
    o.kv_store = &gated;
    std::unique_ptr<Engine> e = Engine::create(&shared_model(), o, Env::default_env()).value();
    // Three restarts' worth of fetches (5 blocks each) through one pool.
    for (size_t i = 0; i < prompts.size(); ++i) {
        expect_same(run_one(*e, prompts[i], 3), colds[i]);
        EXPECT_EQ(buffers_in_use_when_settled(*e, 0), 0) << i;
    }
    EngineStats s = e->stats();
    EXPECT_EQ(s.store_hit_blocks, 15);
    EXPECT_EQ(s.fetch_buffer_leases, 15);
    EXPECT_EQ(s.fetch_buffers_allocated, 5) << "buffers are reused across fetches";

    // Abort while the fetch is in flight: its buffers come back once the read ends.
    const std::vector<int32_t> fourth = prompt_of(kPromptLen, 30);
    (void)run_fresh(options(dir.uri()), fourth, 3);
    gated.close_gate();
    GenerateRequest r;
    r.prompt = fourth;
    r.sampling.max_tokens = 3;
    r.sampling.ignore_eos = true;
    const RequestId rid = e->add_request(std::move(r), [](const TokenEvent&) {}).value();
    for (int i = 0; i < 10000 && !gated.entered(); ++i) {
        ASSERT_TRUE(e->step().is_ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(gated.entered()) << "the fetch never started";
    EXPECT_EQ(e->stats().fetch_buffers_in_use, 5);  // held by the read in flight
    ASSERT_TRUE(e->abort(rid).is_ok());
    EXPECT_FALSE(e->has_work());
    gated.open_gate();
    EXPECT_EQ(buffers_in_use_when_settled(*e, 0), 0) << "aborted fetch leaked its buffers";
    ASSERT_TRUE(e->check_invariants().is_ok());
    EXPECT_EQ(e->stats().fetch_buffers_allocated, 5);

    // A pool of 3 buffers: the chain's first 3 blocks hit, the other 2 are computed.
    EngineOptions small = options();
    small.kv_store = &gated;
    const DeepseekModel& m = shared_model();
    const int64_t block_bytes =
        static_cast<int64_t>(kvstore::header_bytes(static_cast<uint32_t>(m.kv_num_layers()))) +
        m.kv_num_layers() * 128 * m.kv_row_floats() * 4;
    small.kv_store_fetch_buffer_bytes = 3 * block_bytes;
    std::unique_ptr<Engine> f =
        Engine::create(&shared_model(), small, Env::default_env()).value();
    expect_same(run_one(*f, prompts[0], 3), colds[0]);
    s = f->stats();
    EXPECT_EQ(s.fetch_buffers_allocated, 3);
    EXPECT_EQ(s.store_hit_blocks, 3);
    EXPECT_EQ(s.computed_prefill_tokens, kPromptLen - 3 * 128);
    EXPECT_EQ(buffers_in_use_when_settled(*f, 0), 0);
}

}  // namespace
}  // namespace dsi::engine

namespace dsi::engine {
namespace {

// Figure (bench/RESULTS.md): time to first token of a long shared prefix, cold vs a
// restart that hits the file:// store. Prints the times (speed is a figure, not an
// assertion); asserts the work: the hit computes only the suffix.
TEST(EngineStoreTest, TtftStoreHitVsColdOnTinyPreset) {
    ModelConfig c = synthetic_preset("tiny").value();
    c.vocab_size = 512;
    std::unique_ptr<DeepseekModel> model =
        DeepseekModel::load(synthetic_memory_model(c, 99), {2}).value();
    TempDir dir;
    const std::vector<int32_t> prompt = prompt_of(8 * 128 + 16, 8);
    auto ttft_ms = [&](const std::string& uri, EngineStats* st) {
        EngineOptions o = options(uri);
        o.num_kv_blocks = 40;
        o.record_logits = false;
        std::unique_ptr<Engine> e = Engine::create(model.get(), o, Env::default_env()).value();
        GenerateRequest r;
        r.prompt = prompt;
        r.sampling.max_tokens = 1;
        r.sampling.ignore_eos = true;
        const auto t0 = std::chrono::steady_clock::now();
        double ms = -1;
        EXPECT_TRUE(e->add_request(std::move(r), [&](const TokenEvent& ev) {
                         if (ev.token >= 0 && ms < 0) {
                             ms = std::chrono::duration<double, std::milli>(
                                      std::chrono::steady_clock::now() - t0)
                                      .count();
                         }
                     }).is_ok());
        EXPECT_TRUE(e->run().is_ok());
        *st = e->stats();
        return ms;
    };
    EngineStats cold, warm;
    const double cold_ms = ttft_ms(dir.uri(), &cold);  // also fills the store
    const double hit_ms = ttft_ms(dir.uri(), &warm);
    EXPECT_EQ(warm.store_hit_blocks, 8);
    std::printf("tiny preset, %zu-token prompt (8 blocks): TTFT cold %.1f ms, store hit %.1f "
                "ms (%.2fx), fetch %.2f ms, swap-in %.2f ms, %lld bytes read\n",
                prompt.size(), cold_ms, hit_ms, hit_ms / cold_ms,
                warm.fetch_sum_ns / 1e6, warm.swap_in_sum_ns / 1e6,
                static_cast<long long>(warm.store_bytes_read));
    EXPECT_EQ(cold.computed_prefill_tokens, static_cast<int64_t>(prompt.size()));
    EXPECT_EQ(warm.computed_prefill_tokens, 16);
}

}  // namespace
}  // namespace dsi::engine
