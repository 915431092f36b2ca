// TieredCache with a model that keeps per-sequence state (DeepSeek V4's KvLayout): state
// slots taken at admission, released at preemption and removal, never swapped; and
// PagedKvCache's addressing of several cache groups over one block table. Hand-over
// landings (V2/V3): one continuation adopts a landing's tail, a second with the same
// tokens does not; reservations leave running sequences a block each; landings expire.
#include "kv/tiered_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace dsi::kv {
namespace {

std::vector<CacheGroupSpec> v4_like_groups() {
    return {{"c4", 2, 4, 8}, {"c4_index", 2, 4, 4}, {"c128", 1, 128, 8}};
}

// A V4-like cache with state slots of 16 words and the SWA state cache in `pool`.
TieredCacheOptions swa_options(SwaStatePool* pool) {
    TieredCacheOptions o;
    o.groups = v4_like_groups();
    o.num_blocks = 16;
    o.state_floats = 16;
    o.num_state_slots = 2;
    o.swa_pool = pool;
    return o;
}

TEST(PagedKvCacheTest, EntriesOfEveryGroupOverOneTable) {
    auto pool = BlockPool::create(v4_like_groups(), 4).value();
    std::vector<BlockId> table = pool->allocate(2).value();
    float state[3] = {};
    PagedKvCache c(pool.get(), 0, table, state);
    EXPECT_EQ(c.capacity(), 256);
    EXPECT_EQ(c.state(), state);
    // Ratio 4: positions 4e .. 4e + 3 share entry e; block 1 starts at position 128.
    EXPECT_EQ(c.entry(0, 1, 8), c.entry(0, 1, 11));
    EXPECT_EQ(c.entry(0, 1, 12) - c.entry(0, 1, 8), 8);
    EXPECT_EQ(c.entry(0, 1, 130), pool->data(0, table[1]) + (1 * 32 + 0) * 8);
    EXPECT_EQ(c.entry(1, 0, 5), pool->data(1, table[0]) + 1 * 4);
    // Ratio 128: one entry per block.
    EXPECT_EQ(c.entry(2, 0, 0), c.entry(2, 0, 127));
    EXPECT_EQ(c.entry(2, 0, 200), pool->data(2, table[1]));
    EXPECT_EQ(c.row(0, 9), c.entry(0, 0, 9));  // row() is the chosen group
    PagedKvCache plain(pool.get(), 0, table);
    EXPECT_EQ(plain.state(), nullptr);
}

TEST(TieredCacheStateTest, SlotsFollowAdmissionAndAreNeverSwapped) {
    TieredCacheOptions o;
    o.groups = v4_like_groups();
    o.num_blocks = 8;
    o.prefix_cache = false;
    o.swap_space_bytes = int64_t{1} << 20;  // room to swap, but state cannot be restored
    o.state_floats = 16;
    o.num_state_slots = 2;
    auto cache = TieredCache::create(o).value();
    EXPECT_EQ(cache->num_state_slots(), 2);
    const BlockKey salt = make_salt("m", "");
    for (SeqId id : {1, 2, 3}) cache->add(id, salt, kvstore::TrafficClass::kChatbot);
    EXPECT_EQ(cache->table(1).state(), nullptr);  // waiting: no slot
    for (SeqId id : {1, 2}) {
        ASSERT_TRUE(cache->peek_admission(id, std::vector<int32_t>(300, 5)).has_value());
        EXPECT_EQ(cache->admit(id, 0), 0);
        ASSERT_TRUE(cache->grow(id, 2).is_ok());
    }
    ASSERT_TRUE(cache->check_invariants().is_ok());
    EXPECT_EQ(cache->stats().state_slots_in_use, 2);
    float* s1 = cache->table(1).state();
    float* s2 = cache->table(2).state();
    ASSERT_NE(s1, nullptr);
    ASSERT_NE(s2, nullptr);
    EXPECT_NE(s1, s2);
    EXPECT_EQ(std::abs(s1 - s2), 16);
    // Preemption with swap space free still recomputes: the state is not in blocks.
    EXPECT_FALSE(cache->preempt(2, 250));
    EXPECT_TRUE(cache->take_saves().empty());
    EXPECT_EQ(cache->stats().state_slots_in_use, 1);
    EXPECT_EQ(cache->stats().preemptions_swapped, 0);
    ASSERT_TRUE(cache->check_invariants().is_ok());
    // The freed slot goes to the next admission.
    EXPECT_EQ(cache->admit(3, 0), 0);
    EXPECT_EQ(cache->table(3).state(), s2);
    ASSERT_TRUE(cache->check_invariants().is_ok());
    cache->remove(1);  // finish / abort
    cache->remove(3);
    cache->remove(2);  // waiting: holds nothing
    EXPECT_EQ(cache->stats().state_slots_in_use, 0);
    EXPECT_EQ(cache->stats().pool.num_used, 0);
    ASSERT_TRUE(cache->check_invariants().is_ok());
}

TEST(TieredCacheStateTest, BadStateOptionsAreRejected) {
    TieredCacheOptions o;
    o.groups = v4_like_groups();
    o.num_blocks = 4;
    o.state_floats = 16;
    o.num_state_slots = 0;
    EXPECT_FALSE(TieredCache::create(o).is_ok());
    o.state_floats = -1;
    o.num_state_slots = 1;
    EXPECT_FALSE(TieredCache::create(o).is_ok());
}

// Sequence 1: a 300-token prompt (ids i % mod) admitted without a hit, 3 blocks grown.
std::vector<int32_t> admit_cold(TieredCache& cache, const BlockKey& salt,
                                kvstore::TrafficClass traffic, int mod) {
    std::vector<int32_t> a(300);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>(static_cast<int>(i) % mod);
    cache.add(1, salt, traffic);
    EXPECT_EQ(cache.peek_admission(1, a)->num_cached_tokens, 0);
    EXPECT_EQ(cache.admit(1, 0), 0);
    EXPECT_TRUE(cache.grow(1, 3).is_ok());
    return a;
}

// The SWA state cache's bookkeeping (docs/swa_cache.md "Engine wiring"), as the engine
// drives it: the prefill chunk cut at the store position, the copy stored when the
// prefill ends, then a longer prompt on the same prefix starts from it with its bytes.
TEST(TieredCacheStateTest, SwaStatesAreCapturedAtStorePositionsAndRestoredOnAHit) {
    SwaStatePool pool(int64_t{1} << 20);
    TieredCacheOptions o = swa_options(&pool);
    auto cache = TieredCache::create(o).value();
    ASSERT_TRUE(cache->swa_enabled());
    const BlockKey salt = make_salt("m", "");
    const std::vector<int32_t> a = admit_cold(*cache, salt, kvstore::TrafficClass::kAgent, 97);
    // S-KV-9: P = floor(299 / 128) * 128 = 256; the chunk [0, 300) is cut there.
    SwaStepPlan p1 = cache->plan_swa_step(1, 0, 300);
    EXPECT_EQ(p1.end, 256);
    EXPECT_EQ(p1.capture_position, 256);
    EXPECT_EQ(p1.restore, nullptr);
    const std::vector<uint8_t> slot(16 * sizeof(float), 0xab);
    cache->publish(1, a, 2);
    cache->on_swa_step(1, a, 0, 256, slot);
    EXPECT_EQ(pool.stats().num_entries, 0);  // held until the prefill's last chunk
    SwaStepPlan p2 = cache->plan_swa_step(1, 256, 300);
    EXPECT_EQ(p2.end, 300);
    EXPECT_EQ(p2.capture_position, 0);
    cache->on_swa_step(1, a, 256, 300, {});
    const SwaStateKey key =
        swa_state_key(chain_keys(std::span<const int32_t>(a).first(256), salt), 256);
    ASSERT_TRUE(pool.contains(key));
    EXPECT_EQ(pool.stats().bytes_by_class[static_cast<size_t>(kvstore::TrafficClass::kAgent)],
              static_cast<int64_t>(slot.size() + 8));  // the copy and its seal
    cache->remove(1);

    // 450 tokens on the same prefix: L1 = min(2 published blocks, 450 - 134 -> 256) = 256,
    // the state is there: start at 256 with its bytes.
    std::vector<int32_t> b = a;
    b.resize(450, 7);
    cache->add(2, salt, kvstore::TrafficClass::kAgent);
    ASSERT_EQ(cache->peek_admission(2, b)->num_cached_tokens, 256);
    EXPECT_EQ(cache->admit(2, 256), 256);
    SwaStepPlan p3 = cache->plan_swa_step(2, 256, 450);
    ASSERT_NE(p3.restore, nullptr);
    EXPECT_TRUE(std::equal(slot.begin(), slot.end(), p3.restore->bytes.begin()));
    EXPECT_EQ(p3.end, 384);  // its own store position: floor(449 / 128) * 128
    EXPECT_EQ(cache->plan_swa_step(2, 384, 450).restore, nullptr);  // once
    const TieredCacheStats st = cache->stats();
    EXPECT_EQ(st.swa_states_restored, 1);
    EXPECT_EQ(st.swa.total().swa_exact_hits, 1);
    EXPECT_EQ(st.swa.total().hit_tokens, 256);
    ASSERT_TRUE(cache->check_invariants().is_ok());
    cache->remove(2);

    // Without a pool a state-slot layout gets no hits at all (blocks alone cannot resume).
    o.swa_pool = nullptr;
    auto plain = TieredCache::create(o).value();
    EXPECT_FALSE(plain->swa_enabled());
    plain->add(1, salt, kvstore::TrafficClass::kAgent);
    EXPECT_EQ(plain->peek_admission(1, b)->num_cached_tokens, 0);
    plain->remove(1);
}

// Issue 18, the V4 hand-over: the export of a prefilled sequence is its blocks [0, P) of
// every group (store layers in group order) and the state at P; a continuation of those
// tokens plus one on another cache starts at P past S-KV-10's cap, a new sequence of the
// same tokens does not (the cap leaves 128, with no state there or at 0's catch-up gain).
TEST(TieredCacheStateTest, AnExportCarriesItsStateAndAContinuationStartsThere) {
    SwaStatePool pool(int64_t{1} << 20);
    TieredCacheOptions o = swa_options(&pool);
    auto cache = TieredCache::create(o).value();
    const BlockKey salt = make_salt("m", "");
    std::vector<int32_t> a(300);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>(i % 89);
    cache->add(1, salt, kvstore::TrafficClass::kAgent);
    ASSERT_EQ(cache->peek_admission(1, a)->num_cached_tokens, 0);
    EXPECT_EQ(cache->admit(1, 0), 0);
    ASSERT_TRUE(cache->grow(1, 3).is_ok());
    PagedKvCache t = cache->table(1);
    for (int64_t g = 0; g < 3; ++g) {  // a mark in the first entry of each group's layers
        for (int64_t l = 0; l < o.groups[static_cast<size_t>(g)].num_layers; ++l) {
            t.entry(static_cast<size_t>(g), l, 0)[0] = static_cast<float>(10 * g + l + 1);
        }
    }
    const std::vector<uint8_t> slot(16 * sizeof(float), 0x5c);
    EXPECT_EQ(cache->export_blocks(1, a), nullptr);  // nothing published yet
    cache->plan_swa_step(1, 0, 300);
    cache->publish(1, a, 2);
    cache->on_swa_step(1, a, 0, 256, slot);
    cache->on_swa_step(1, a, 256, 300, {});
    std::shared_ptr<const KvExport> e = cache->export_blocks(1, a);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(e->num_blocks(), 2u);  // P = 256
    EXPECT_EQ(e->layer_block_bytes,
              (std::vector<uint64_t>{32 * 8 * 4, 32 * 8 * 4, 32 * 4 * 4, 32 * 4 * 4, 8 * 4}));
    const float expected_marks[] = {1, 2, 11, 12, 21};
    for (uint32_t l = 0; l < e->num_layers(); ++l) {
        float first = 0;
        std::memcpy(&first, e->layer(l, 0).data(), sizeof(float));
        EXPECT_EQ(first, expected_marks[l]) << "store layer " << l;
    }
    ASSERT_NE(e->swa_state, nullptr);
    EXPECT_EQ(e->swa_state->key.position, 256);
    EXPECT_EQ(e->swa_state->key.chain, (BlockKey{e->keys[1].lo, e->keys[1].hi}));
    EXPECT_TRUE(swa_sealed_ok(*e->swa_state, slot.size()));
    EXPECT_EQ(e->bytes(), 2 * (2 * 1024 + 2 * 512 + 32) + slot.size() + kSwaSealBytes);
    ASSERT_TRUE(pool.erase(e->swa_state->key));  // no state: the blocks alone are no export
    EXPECT_EQ(cache->export_blocks(1, a), nullptr);
    ASSERT_TRUE(
        pool.put(e->swa_state->key, e->swa_state->traffic_class, e->swa_state->bytes).is_ok());
    cache->remove(1);

    std::vector<int32_t> b = a;
    b.push_back(5);  // the first output token
    cache->add(2, salt, kvstore::TrafficClass::kAgent);
    EXPECT_EQ(cache->peek_admission(2, b)->num_cached_tokens, 0);  // a new sequence: capped
    cache->remove(2);
    cache->add(3, salt, kvstore::TrafficClass::kAgent, /*continuation=*/true);
    ASSERT_EQ(cache->peek_admission(3, b)->num_cached_tokens, 256);
    EXPECT_EQ(cache->admit(3, 256), 256);
    ASSERT_NE(cache->plan_swa_step(3, 256, 301).restore, nullptr);
    const SwaCacheClassCounters c = cache->stats().swa.total();
    EXPECT_EQ(c.swa_exact_hits, 1);
    EXPECT_EQ(c.hit_tokens, 256);
    EXPECT_EQ(c.replays, 0);
    ASSERT_TRUE(cache->check_invariants().is_ok());
    cache->remove(3);
}

// Bounded replay (docs/swa_cache.md "V4.1"): states keep only the stored region (a
// restore puts it into a zeroed slot image), and a prefix whose blocks are there but
// whose state is gone is served by replay: the blocks of [0, L1) pinned, the first step
// re-running [L1 - 128, L1), S-KV-10's hit L1 - 128 counted.
TEST(TieredCacheStateTest, BoundedReplayKeepsTheStoredRegionAndReplaysAMiss) {
    SwaStatePool pool(int64_t{1} << 20);
    TieredCacheOptions o = swa_options(&pool);
    o.swa_bounded_replay = true;
    o.swa_stored_ranges = {{0, 2}, {8, 12}};  // 6 of 16 floats
    auto cache = TieredCache::create(o).value();
    const BlockKey salt = make_salt("m", "");
    const std::vector<int32_t> a = admit_cold(*cache, salt, kvstore::TrafficClass::kChatbot, 89);
    EXPECT_EQ(cache->plan_swa_step(1, 0, 300).capture_position, 256);
    std::vector<uint8_t> slot(16 * sizeof(float));
    for (size_t i = 0; i < slot.size(); ++i) slot[i] = static_cast<uint8_t>(i + 1);
    cache->publish(1, a, 2);
    cache->on_swa_step(1, a, 0, 256, slot);
    EXPECT_EQ(cache->plan_swa_step(1, 256, 300).replay_begin, 0);
    cache->on_swa_step(1, a, 256, 300, {});
    cache->remove(1);
    EXPECT_EQ(pool.stats().bytes, 6 * 4 + 8);  // the stored region and the seal

    std::vector<int32_t> b = a;
    b.resize(450, 7);
    cache->add(2, salt, kvstore::TrafficClass::kChatbot);
    ASSERT_EQ(cache->peek_admission(2, b)->num_cached_tokens, 256);
    EXPECT_EQ(cache->admit(2, 256), 256);
    SwaStepPlan exact = cache->plan_swa_step(2, 256, 450);
    ASSERT_NE(exact.restore, nullptr);
    EXPECT_EQ(exact.replay_begin, 0);
    ASSERT_EQ(exact.restore->bytes.size(), slot.size());
    for (size_t i = 0; i < slot.size(); ++i) {
        const bool stored = i < 8 || (i >= 32 && i < 48);
        EXPECT_EQ(exact.restore->bytes[i], stored ? slot[i] : 0) << i;
    }
    cache->remove(2);

    // The state gone: L1 = 256 from the blocks, no state in [128, 256] -> replay.
    ASSERT_TRUE(
        pool.erase(swa_state_key(chain_keys(std::span<const int32_t>(a).first(256), salt), 256)));
    cache->add(3, salt, kvstore::TrafficClass::kAgent);
    ASSERT_EQ(cache->peek_admission(3, b)->num_cached_tokens, 256);
    EXPECT_EQ(cache->admit(3, 256), 256);
    EXPECT_EQ(cache->num_blocks(3), 2);  // the replayed unit's block is pinned, reused
    SwaStepPlan replay = cache->plan_swa_step(3, 256, 450);
    EXPECT_EQ(replay.restore, nullptr);
    EXPECT_EQ(replay.replay_begin, 128);
    EXPECT_EQ(cache->plan_swa_step(3, 384, 450).replay_begin, 0);  // the first step only
    const SwaCacheClassCounters agent =
        cache->stats().swa.by_class[static_cast<size_t>(kvstore::TrafficClass::kAgent)];
    EXPECT_EQ(agent.replays, 1);
    EXPECT_EQ(agent.replay_tokens, 128);
    EXPECT_EQ(agent.hit_tokens, 128);
    EXPECT_EQ(cache->stats().swa_fallback_tokens, 0);
    ASSERT_TRUE(cache->check_invariants().is_ok());
    cache->remove(3);
}

// A hand-over landed for 3 blocks + 10 tail tokens: the first continuation with those
// tokens starts past all of them and adopts the tail block; a second one with the same
// tokens (waiting at the same time) takes only the full blocks from the prefix index.
TEST(TieredCacheLandingTest, OneContinuationAdoptsTheTailAndRunningSequencesKeepHeadroom) {
    TieredCacheOptions o;
    o.groups = {{"mla", 2, 1, 4}};
    o.num_blocks = 8;
    std::unique_ptr<TieredCache> cache = TieredCache::create(o).value();
    ASSERT_TRUE(cache->landing_supported());
    std::vector<int32_t> tokens(3 * 128 + 11);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 % 500);
    const BlockKey salt = make_salt("m", "");
    const int64_t h = cache->reserve_landing(3 * 128 + 10).value();
    const std::vector<std::vector<uint8_t*>> mem = cache->landing_memory(h);
    ASSERT_EQ(mem.size(), 2u);      // store layers
    ASSERT_EQ(mem[0].size(), 4u);   // 3 full blocks + the tail block
    const std::vector<BlockKey> keys = chain_keys(tokens, salt);
    const BlockKey tail = tail_key(keys[2], std::span(tokens).subspan(3 * 128, 10), salt);
    ASSERT_TRUE(cache->land(h, std::span(keys).first(3), tail, 1000).is_ok());
    EXPECT_EQ(cache->stats().landing_blocks_held, 4);
    for (SeqId id : {1, 2}) cache->add(id, salt, kvstore::TrafficClass::kChatbot, true);
    EXPECT_EQ(cache->peek_admission(1, tokens)->num_cached_tokens, 3 * 128 + 10);
    EXPECT_EQ(cache->peek_admission(2, tokens)->num_cached_tokens, 3 * 128);  // claimed
    EXPECT_EQ(cache->admit(1, 3 * 128 + 10), 3 * 128 + 10);
    EXPECT_EQ(cache->num_blocks(1), 4);
    EXPECT_EQ(cache->num_exclusive_blocks(1), 4);  // the landing let go of the full ones
    EXPECT_EQ(cache->num_landings(), 0);
    EXPECT_EQ(cache->stats().landing_tail_tokens, 10);
    EXPECT_EQ(cache->admit(2, 3 * 128), 3 * 128);
    EXPECT_EQ(cache->num_exclusive_blocks(1), 1);  // the tail block; the rest are shared
    ASSERT_TRUE(cache->check_invariants().is_ok());
    // 4 blocks available, 2 running sequences: at most 2 for a hand-over.
    EXPECT_EQ(cache->num_available_blocks(), 4);
    EXPECT_EQ(cache->reserve_landing(3 * 128).status().code(), StatusCode::kResourceExhausted);
    const int64_t h2 = cache->reserve_landing(2 * 128).value();
    ASSERT_TRUE(cache->check_invariants().is_ok());
    cache->drop_landing(h2);
    // A landing whose continuation never comes goes at its expiry.
    const int64_t h3 = cache->reserve_landing(128 + 1).value();
    ASSERT_TRUE(cache->land(h3, std::span(keys).first(1), tail, 2000).is_ok());
    EXPECT_EQ(cache->expire_landings(1999), 0);
    EXPECT_EQ(cache->expire_landings(2000), 1);
    cache->remove(1);
    cache->remove(2);
    ASSERT_TRUE(cache->check_invariants().is_ok());
    EXPECT_EQ(cache->num_available_blocks(), 8);
    EXPECT_EQ(cache->stats().landing_blocks_held, 0);
}

}  // namespace
}  // namespace dsi::kv
