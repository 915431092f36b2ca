// The SWA state rules (S-KV-8/9/10, S-SWA) with the worked numbers of issue 16 and
// docs/swa_cache.md, the SWA state pool, the counters and the YOCO prefill settings.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <thread>

#include "base/settings.h"
#include "kv/swa_pool.h"
#include "kv/swa_rules.h"
#include "kv/yoco_prefill.h"

namespace dsi::kv {
namespace {

using kvstore::TrafficClass;

int64_t store_at(int64_t len) { return prefill_store_position(len).value(); }

TEST(SwaRulesTest, Geometry) {
    EXPECT_EQ(kSwaRingTokens, 134);
    EXPECT_EQ(SwaGeometry{}.ring_tokens(), 134);
    EXPECT_TRUE(SwaGeometry{}.validate().is_ok());
    EXPECT_FALSE((SwaGeometry{128, 129, 5}).validate().is_ok());  // window > unit
    EXPECT_FALSE((SwaGeometry{0, 1, 5}).validate().is_ok());
    EXPECT_FALSE((SwaGeometry{128, 128, -1}).validate().is_ok());
}

// S-KV-9: floor((len - 1) / 128) * 128; below one full unit: nothing (0).
TEST(SwaRulesTest, PrefillStorePositions) {
    EXPECT_EQ(store_at(1), 0);
    EXPECT_EQ(store_at(127), 0);
    EXPECT_EQ(store_at(128), 0);
    EXPECT_EQ(store_at(129), 128);
    EXPECT_EQ(store_at(255), 128);
    EXPECT_EQ(store_at(256), 128);
    EXPECT_EQ(store_at(257), 256);
    EXPECT_EQ(store_at(1000), 896);
    EXPECT_EQ(prefill_store_position(0).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(prefill_store_position(-5).status().code(), StatusCode::kInvalidArgument);
}

TEST(SwaRulesTest, RingRunsWrap) {
    // Window of the state at 128: positions [0, 128), slots 0..127.
    SwaRingRuns r = swa_ring_runs(0, 128);
    ASSERT_EQ(r.num_runs, 1);
    EXPECT_EQ(r.runs[0].first_slot, 0);
    EXPECT_EQ(r.runs[0].num_slots, 128);
    // State at 256: [128, 256) -> slots 128..133 then 0..121.
    r = swa_ring_runs(128, 256);
    ASSERT_EQ(r.num_runs, 2);
    EXPECT_EQ(r.runs[0].first_slot, 128);
    EXPECT_EQ(r.runs[0].num_slots, 6);
    EXPECT_EQ(r.runs[1].first_slot, 0);
    EXPECT_EQ(r.runs[1].num_slots, 122);
    EXPECT_EQ(swa_ring_runs(5, 5).num_runs, 0);
    EXPECT_EQ(swa_chain_index(128), 0);
    EXPECT_EQ(swa_chain_index(896), 6);
}

// A ring of 134 slots written position by position, as the model writes SWA rows.
struct Ring {
    std::vector<int64_t> slot = std::vector<int64_t>(kSwaRingTokens, -1);
    void write(int64_t pos) { slot[static_cast<size_t>(pos % kSwaRingTokens)] = pos; }
    // The window rows the runs name, in order.
    std::vector<int64_t> read(const SwaRingRuns& r) const {
        std::vector<int64_t> out;
        for (int i = 0; i < r.num_runs; ++i) {
            for (int64_t s = 0; s < r.runs[i].num_slots; ++s) {
                out.push_back(slot[static_cast<size_t>(r.runs[i].first_slot + s)]);
            }
        }
        return out;
    }
};

// S-KV-9: a decode copy for boundary B read with B + d complete tokens while the next
// step writes position B + d holds all 128 window positions for d = 0..5, not for 6.
TEST(SwaRulesTest, DecodeCopyRingHoldsWindowForLateness0To5) {
    for (int64_t boundary : {128, 256, 384, 1024}) {
        for (int64_t d = 0; d <= 6; ++d) {
            Ring ring;
            for (int64_t q = 0; q < boundary + d; ++q) ring.write(q);
            ring.write(boundary + d);  // the step in flight, written before the copy reads
            SwaStoreTracker t;
            ASSERT_TRUE(t.begin_prefill(boundary - 1, boundary - 1).is_ok());
            ASSERT_EQ(t.on_tokens(boundary).value(), boundary);
            const SwaCopyRegion region = t.decode_copy_region(boundary);
            EXPECT_EQ(region.window_begin, boundary - 128);
            std::vector<int64_t> rows = ring.read(region.ring);
            ASSERT_EQ(rows.size(), 128u);
            bool whole = true;
            for (int64_t i = 0; i < 128; ++i)
                whole &= rows[static_cast<size_t>(i)] == boundary - 128 + i;
            EXPECT_EQ(whole, d <= 5) << "boundary " << boundary << " lateness " << d;
            ASSERT_TRUE(t.on_tokens(boundary + d).is_ok());
            const Status landed = t.on_copy_landed(boundary, boundary + d);
            if (d <= 5) {
                EXPECT_TRUE(landed.is_ok()) << landed.to_string();
                EXPECT_EQ(t.latest_complete(), boundary);
            } else {
                EXPECT_EQ(landed.code(), StatusCode::kOutOfRange);
                EXPECT_NE(landed.message().find("6 tokens late"), std::string::npos)
                    << landed.message();
                EXPECT_EQ(t.latest_complete(), 0);
                EXPECT_EQ(t.pending_copy(), 0);  // the late copy is dropped
            }
        }
    }
}

TEST(SwaStoreTrackerTest, ChunkedPrefillCapturesInChunkReachingPAndStoresAtLastChunk) {
    SwaStoreTracker t;
    ASSERT_TRUE(t.begin_prefill(0, 300).is_ok());  // P = 256
    auto c1 = t.on_prefill_chunk(0, 200);
    ASSERT_TRUE(c1.is_ok());
    EXPECT_FALSE(c1->has_value());
    auto c2 = t.on_prefill_chunk(200, 300);
    ASSERT_TRUE(c2.is_ok());
    ASSERT_TRUE(c2->has_value());
    const SwaCopyRegion& r = **c2;
    EXPECT_EQ(r.store_position, 256);
    EXPECT_EQ(r.window_begin, 128);
    EXPECT_EQ(r.chunk_begin, 200);
    // Rows [128, 200) come from the ring (slots 128..133, 0..65), [200, 256) from the chunk.
    ASSERT_EQ(r.ring.num_runs, 2);
    EXPECT_EQ(r.ring.runs[0].first_slot, 128);
    EXPECT_EQ(r.ring.runs[0].num_slots + r.ring.runs[1].num_slots, 72);
    EXPECT_EQ(t.latest_complete(), 256);

    // Captured in an earlier chunk, complete only at the last one.
    SwaStoreTracker u;
    ASSERT_TRUE(u.begin_prefill(0, 300).is_ok());
    auto d1 = u.on_prefill_chunk(0, 256);
    ASSERT_TRUE(d1.is_ok() && d1->has_value());
    EXPECT_EQ((*d1)->ring.num_runs, 0);  // the whole window is in the chunk
    EXPECT_EQ(u.latest_complete(), 0);
    ASSERT_TRUE(u.on_prefill_chunk(256, 280).is_ok());
    EXPECT_EQ(u.latest_complete(), 0);
    auto d3 = u.on_prefill_chunk(280, 300);
    ASSERT_TRUE(d3.is_ok());
    EXPECT_FALSE(d3->has_value());
    EXPECT_EQ(u.latest_complete(), 256);

    // A prefill cut short stores nothing; one below a unit never stores.
    SwaStoreTracker cut;
    ASSERT_TRUE(cut.begin_prefill(0, 300).is_ok());
    ASSERT_TRUE(cut.on_prefill_chunk(0, 290).is_ok());
    EXPECT_EQ(cut.latest_complete(), 0);
    SwaStoreTracker small;
    ASSERT_TRUE(small.begin_prefill(0, 128).is_ok());
    auto s1 = small.on_prefill_chunk(0, 128);
    ASSERT_TRUE(s1.is_ok());
    EXPECT_FALSE(s1->has_value());
    EXPECT_EQ(small.latest_complete(), 0);
}

TEST(SwaStoreTrackerTest, PrefillFromHitThenDecodeToRequestEnd) {
    SwaStoreTracker t;
    // L = 1000 with a hit of 768: the prefill runs [768, 1000) and stores at 896.
    ASSERT_TRUE(t.begin_prefill(768, 1000).is_ok());
    auto c = t.on_prefill_chunk(768, 1000);
    ASSERT_TRUE(c.is_ok() && c->has_value());
    EXPECT_EQ((*c)->store_position, 896);
    EXPECT_EQ((*c)->ring.num_runs, 0);
    EXPECT_EQ(t.latest_complete(), 896);
    // Decode 1000 -> 1024: copy at 1024, landing 3 late.
    for (int64_t n = 1001; n < 1024; ++n) EXPECT_EQ(t.on_tokens(n).value(), 0);
    EXPECT_EQ(t.on_tokens(1024).value(), 1024);
    EXPECT_EQ(t.pending_copy(), 1024);
    EXPECT_EQ(t.latest_complete(), 896);  // not complete until it lands
    ASSERT_TRUE(t.on_tokens(1027).is_ok());
    EXPECT_TRUE(t.on_copy_landed(1024, 1027).is_ok());
    EXPECT_EQ(t.latest_complete(), 1024);
    // Speculative steps: 1150 -> 1155 crosses 1152 (detected 3 late), then the request
    // ends before the copy lands: the latest complete copy (1024) is stored.
    ASSERT_TRUE(t.on_tokens(1150).is_ok());
    EXPECT_EQ(t.on_tokens(1155).value(), 1152);
    EXPECT_EQ(t.latest_complete(), 1024);
}

TEST(SwaStoreTrackerTest, PromptOnABoundaryTakesNoDecodeCopyThere) {
    SwaStoreTracker t;
    ASSERT_TRUE(t.begin_prefill(0, 256).is_ok());
    ASSERT_TRUE(t.on_prefill_chunk(0, 256).is_ok());
    EXPECT_EQ(t.latest_complete(), 128);
    EXPECT_EQ(t.on_tokens(257).value(), 0);
    EXPECT_EQ(t.on_tokens(384).value(), 384);
}

TEST(SwaStoreTrackerTest, RollbackDropsCopiesPastTheNewLength) {
    SwaStoreTracker t;
    ASSERT_TRUE(t.begin_prefill(0, 300).is_ok());
    ASSERT_TRUE(t.on_prefill_chunk(0, 300).is_ok());
    EXPECT_EQ(t.on_tokens(386).value(), 384);
    ASSERT_TRUE(t.on_rollback(383).is_ok());  // the drafts that crossed 384 were rejected
    EXPECT_EQ(t.pending_copy(), 0);
    EXPECT_EQ(t.on_copy_landed(384, 383).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.on_tokens(385).value(), 384);
    ASSERT_TRUE(t.on_copy_landed(384, 385).is_ok());
    EXPECT_EQ(t.latest_complete(), 384);
    ASSERT_TRUE(t.on_rollback(380).is_ok());
    EXPECT_EQ(t.latest_complete(), 256);  // falls back to the prefill's state
}

TEST(SwaStoreTrackerTest, MalformedCallsAreErrorsAndChangeNothing) {
    SwaStoreTracker t;
    EXPECT_EQ(t.begin_prefill(0, 0).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.begin_prefill(-1, 10).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.begin_prefill(20, 10).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(t.begin_prefill(0, 300).is_ok());
    EXPECT_EQ(t.begin_prefill(0, 300).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.on_prefill_chunk(10, 20).status().code(), StatusCode::kInvalidArgument);  // gap
    EXPECT_EQ(t.on_prefill_chunk(0, 0).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.on_prefill_chunk(0, 301).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.on_tokens(301).status().code(), StatusCode::kInvalidArgument);  // mid-prefill
    EXPECT_EQ(t.on_rollback(0).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(t.on_prefill_chunk(0, 300).is_ok());
    EXPECT_EQ(t.on_prefill_chunk(300, 301).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.on_tokens(299).status().code(), StatusCode::kInvalidArgument);  // decreasing
    EXPECT_EQ(t.on_rollback(-1).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.on_rollback(301).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.on_copy_landed(384, 384).code(), StatusCode::kInvalidArgument);  // none pending
    EXPECT_EQ(t.on_tokens(384).value(), 384);
    EXPECT_EQ(t.on_copy_landed(256, 384).code(), StatusCode::kInvalidArgument);  // not pending
    EXPECT_EQ(t.on_copy_landed(384, 390).code(), StatusCode::kInvalidArgument);  // future
    EXPECT_EQ(t.length(), 384);
    EXPECT_EQ(t.pending_copy(), 384);
    EXPECT_EQ(t.latest_complete(), 256);
}

// ---- Hit rule ------------------------------------------------------------------------

SwaStateLookup states(std::set<int64_t> at, std::vector<int64_t>* asked = nullptr) {
    return [at = std::move(at), asked](int64_t p) {
        if (asked != nullptr) asked->push_back(p);
        return at.contains(p);
    };
}

SwaHitPlan hit(int64_t l, int64_t block_hit, std::set<int64_t> at) {
    Result<SwaHitPlan> p = plan_swa_hit(l, block_hit, states(std::move(at)));
    DSI_CHECK(p.is_ok(), p.status().to_string());
    return *p;
}

TEST(SwaHitTest, WorkedNumbers) {
    // L = 1000: cap 1000 - 134 = 866 -> 768 even with a block hit of 896.
    SwaHitPlan p = hit(1000, 896, {768});
    EXPECT_EQ(p.block_hit_tokens, 768);
    EXPECT_EQ(p.kind, SwaHitKind::kExact);
    EXPECT_EQ(p.hit_tokens, 768);
    EXPECT_EQ(p.compute_begin, 768);
    EXPECT_EQ(p.rerun_tokens(), 0);
    // A state at L1 - 128 only: hit L1, [640, 768) re-run exactly from it.
    p = hit(1000, 896, {640, 896});
    EXPECT_EQ(p.kind, SwaHitKind::kCatchUp);
    EXPECT_EQ(p.hit_tokens, 768);
    EXPECT_EQ(p.swa_state_position, 640);
    EXPECT_EQ(p.compute_begin, 640);
    EXPECT_EQ(p.rerun_begin, 640);
    EXPECT_EQ(p.rerun_end, 768);
    // No state in [640, 768] (one at 896 is past the cap): hit 640, replay [640, 768).
    p = hit(1000, 896, {512, 896});
    EXPECT_EQ(p.kind, SwaHitKind::kReplay);
    EXPECT_EQ(p.block_hit_tokens, 768);
    EXPECT_EQ(p.hit_tokens, 640);
    EXPECT_EQ(p.compute_begin, 640);
    EXPECT_EQ(p.rerun_begin, 640);
    EXPECT_EQ(p.rerun_end, 768);
    EXPECT_FALSE(p.swa_hit());
    // The block hit below the cap decides: L = 1000, block hit 256.
    p = hit(1000, 256, {});
    EXPECT_EQ(p.block_hit_tokens, 256);
    EXPECT_EQ(p.hit_tokens, 128);
    EXPECT_EQ(p.kind, SwaHitKind::kReplay);
    p = hit(1000, 256, {256});
    EXPECT_EQ(p.hit_tokens, 256);
    // L = 8192, full block hit: cap 8058 -> 7936.
    p = hit(8192, 8192, {7936});
    EXPECT_EQ(p.hit_tokens, 7936);
    p = hit(8192, 8192, {});
    EXPECT_EQ(p.hit_tokens, 7808);
    EXPECT_EQ(p.rerun_tokens(), 128);
}

TEST(SwaHitTest, EdgeCases) {
    // L < 134 and up to 261: the cap leaves no full unit.
    for (int64_t l : {1, 100, 133, 134, 135, 261}) {
        SwaHitPlan p = hit(l, l / 128 * 128, {128});
        EXPECT_EQ(p.kind, SwaHitKind::kNone) << l;
        EXPECT_EQ(p.hit_tokens, 0) << l;
        EXPECT_EQ(p.compute_begin, 0) << l;
    }
    // L = 262: cap 128.
    EXPECT_EQ(hit(262, 256, {128}).hit_tokens, 128);
    // L1 = 128 with no stored state: the empty state at 0 always exists -> catch-up
    // from 0 (exact), hit 128; the lookup is never asked about position 0.
    std::vector<int64_t> asked;
    Result<SwaHitPlan> p = plan_swa_hit(262, 256, states({}, &asked));
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->kind, SwaHitKind::kCatchUp);
    EXPECT_EQ(p->hit_tokens, 128);
    EXPECT_EQ(p->swa_state_position, 0);
    EXPECT_EQ(p->rerun_begin, 0);
    EXPECT_EQ(asked, std::vector<int64_t>{128});
    // Block hit 0.
    EXPECT_EQ(hit(5000, 0, {128}).kind, SwaHitKind::kNone);
    // No lookup at all behaves as no states.
    p = plan_swa_hit(1000, 768, SwaStateLookup{});
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->kind, SwaHitKind::kReplay);
}

TEST(SwaHitTest, MalformedInput) {
    const SwaStateLookup none = states({});
    EXPECT_EQ(plan_swa_hit(0, 0, none).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(plan_swa_hit(-5, 0, none).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(plan_swa_hit(1000, -128, none).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(plan_swa_hit(1000, 100, none).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(plan_swa_hit(1000, 1024, none).status().code(), StatusCode::kInvalidArgument);
}

TEST(SwaHitTest, ReplayAttentionIsTruncatedToTheSegment) {
    // Replaying from s = 640: query 640 sees only itself, 700 sees [640, 700], 767 and
    // later see a full window.
    EXPECT_EQ(swa_replay_key_begin(640, 640), 640);
    EXPECT_EQ(swa_replay_key_begin(640, 700), 640);
    EXPECT_EQ(swa_replay_key_begin(640, 767), 640);
    EXPECT_EQ(swa_replay_key_begin(640, 768), 641);
    EXPECT_EQ(swa_replay_key_begin(640, 1000), 873);
}

// ---- Size ------------------------------------------------------------------------

TEST(SwaSlotShapeTest, V41StoredRegionIs1415040Bytes) {
    SwaSlotShape s;
    s.stored_layers = 20;
    s.swa_row_bytes = 512 + 512 / 32;  // MXFP8
    EXPECT_EQ(s.swa_row_bytes, 528);
    EXPECT_EQ(s.stored_bytes(), 1415040);
    s.dropped_swa_layers = 23;  // 20 decoder layers + 3 draft layers
    s.accumulator_bytes = 100;
    EXPECT_EQ(s.dropped_bytes(), 23 * 134 * 528 + 100);
    EXPECT_EQ(s.slot_bytes(), 1415040 + 23 * 134 * 528 + 100);
    EXPECT_TRUE(s.validate().is_ok());
    s.ring_tokens = 100;
    EXPECT_FALSE(s.validate().is_ok());
}

// ---- Pool ------------------------------------------------------------------------

SwaStateKey key(uint64_t id, int64_t position = 128) { return {BlockKey{id, ~id}, position}; }

std::vector<uint8_t> bytes(size_t n, uint8_t v = 7) { return std::vector<uint8_t>(n, v); }

TEST(SwaStatePoolTest, LruEvictionAtBudgetIsCounted) {
    SwaStatePool pool(300);
    ASSERT_TRUE(pool.put(key(1), TrafficClass::kChatbot, bytes(100)).is_ok());
    ASSERT_TRUE(pool.put(key(2), TrafficClass::kAgent, bytes(100)).is_ok());
    ASSERT_TRUE(pool.put(key(3), TrafficClass::kChatbot, bytes(100)).is_ok());
    ASSERT_TRUE(pool.get(key(1)).is_ok());  // 1 is now the most recent
    EXPECT_TRUE(pool.contains(key(2)));     // contains() does not touch
    ASSERT_TRUE(pool.put(key(4), TrafficClass::kChatbot, bytes(150)).is_ok());
    // 2 (agent) and 3 (chatbot) were least recent: both evicted to fit 150 B.
    EXPECT_FALSE(pool.contains(key(2)));
    EXPECT_FALSE(pool.contains(key(3)));
    EXPECT_TRUE(pool.contains(key(1)));
    EXPECT_TRUE(pool.contains(key(4)));
    SwaPoolStats s = pool.stats();
    EXPECT_EQ(s.bytes, 250);
    EXPECT_EQ(s.num_entries, 2);
    EXPECT_EQ(s.evictions, 2);
    EXPECT_EQ(s.evicted_bytes, 200);
    EXPECT_EQ(s.evictions_by_class[0], 1);
    EXPECT_EQ(s.evictions_by_class[1], 1);
    EXPECT_EQ(s.bytes_by_class[0], 250);
    EXPECT_EQ(s.bytes_by_class[1], 0);
    EXPECT_EQ(s.hits, 1);
    EXPECT_TRUE(pool.check_invariants().is_ok());
    EXPECT_EQ(pool.get(key(2)).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(pool.stats().misses, 1);
}

TEST(SwaStatePoolTest, ReplaceRefuseEraseAndPin) {
    SwaStatePool pool(200);
    ASSERT_TRUE(pool.put(key(1), TrafficClass::kChatbot, bytes(100, 1)).is_ok());
    auto pinned = pool.get(key(1));
    ASSERT_TRUE(pinned.is_ok());
    ASSERT_TRUE(pool.put(key(1), TrafficClass::kAgent, bytes(150, 2)).is_ok());
    EXPECT_EQ(pool.stats().replaced, 1);
    EXPECT_EQ(pool.stats().bytes, 150);
    EXPECT_EQ(pool.stats().evictions, 0);
    // The pinned old entry is still readable after it was replaced.
    EXPECT_EQ((*pinned)->bytes.size(), 100u);
    EXPECT_EQ((*pinned)->bytes[0], 1);
    EXPECT_EQ(pool.put(key(2), TrafficClass::kChatbot, bytes(201)).code(),
              StatusCode::kResourceExhausted);
    EXPECT_EQ(pool.stats().refused, 1);
    EXPECT_TRUE(pool.contains(key(1)));  // a refused put evicts nothing
    EXPECT_EQ(pool.put(key(3, 100), TrafficClass::kChatbot, bytes(10)).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(pool.put(key(3, 0), TrafficClass::kChatbot, bytes(10)).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(pool.put(key(3), TrafficClass::kChatbot, {}).code(), StatusCode::kInvalidArgument);
    // Same chain key, other position: another entry.
    EXPECT_FALSE(pool.contains(key(1, 256)));
    EXPECT_TRUE(pool.erase(key(1)));
    EXPECT_FALSE(pool.erase(key(1)));
    EXPECT_EQ(pool.stats().bytes, 0);
    EXPECT_TRUE(pool.check_invariants().is_ok());
    SwaStatePool none(0);
    EXPECT_EQ(none.put(key(1), TrafficClass::kChatbot, bytes(1)).code(),
              StatusCode::kResourceExhausted);
}

// The change log the engine announces to the cluster's SWA directory.
TEST(SwaStatePoolTest, ChangesSinceACursorAndSnapshots) {
    SwaStatePool pool(300);
    SwaPoolChanges c = pool.changes_since(0);
    EXPECT_TRUE(c.snapshot);
    EXPECT_TRUE(c.added.empty());
    const uint64_t start = c.next;
    ASSERT_TRUE(pool.put(key(1), TrafficClass::kChatbot, bytes(100)).is_ok());
    ASSERT_TRUE(pool.put(key(2), TrafficClass::kChatbot, bytes(100)).is_ok());
    c = pool.changes_since(start);
    EXPECT_FALSE(c.snapshot);
    EXPECT_EQ(c.added, (std::vector<SwaStateKey>{key(1), key(2)}));
    EXPECT_TRUE(c.removed.empty());
    const uint64_t mid = c.next;
    // Evictions and erases are removals; an add then a removal nets to a removal, a
    // replacement to an add.
    ASSERT_TRUE(pool.put(key(3), TrafficClass::kChatbot, bytes(150)).is_ok());  // evicts 1
    ASSERT_TRUE(pool.put(key(2), TrafficClass::kAgent, bytes(100)).is_ok());    // replaces 2
    EXPECT_TRUE(pool.erase(key(3)));
    c = pool.changes_since(mid);
    EXPECT_EQ(c.added, (std::vector<SwaStateKey>{key(2)}));
    EXPECT_EQ(c.removed, (std::vector<SwaStateKey>{key(1), key(3)}));
    EXPECT_TRUE(pool.changes_since(c.next).added.empty());
    EXPECT_TRUE(pool.changes_since(c.next).removed.empty());
    // A cursor the log no longer reaches (or one from another pool) gets a snapshot.
    for (size_t i = 0; i < SwaStatePool::kChangeLogLength; ++i) {
        ASSERT_TRUE(pool.put(key(2), TrafficClass::kAgent, bytes(100)).is_ok());
    }
    c = pool.changes_since(mid);
    EXPECT_TRUE(c.snapshot);
    EXPECT_EQ(c.added, (std::vector<SwaStateKey>{key(2)}));
    EXPECT_TRUE(pool.changes_since(c.next + 5).snapshot);
}

TEST(SwaStatePoolTest, KeysFromTheChainAndLocalPull) {
    std::vector<BlockKey> chain = {{1, 1}, {2, 2}, {3, 3}};
    EXPECT_EQ(swa_state_key(chain, 256).chain, (BlockKey{2, 2}));
    EXPECT_EQ(swa_state_key(chain, 384).position, 384);
    SwaStatePool pool(1 << 20);
    ASSERT_TRUE(pool.put(swa_state_key(chain, 256), TrafficClass::kAgent, bytes(64)).is_ok());
    LocalSwaStateSource local(&pool);
    auto got = local.pull(swa_state_key(chain, 256), 0);
    ASSERT_TRUE(got.is_ok());
    EXPECT_EQ((*got)->traffic_class, TrafficClass::kAgent);
    EXPECT_EQ(local.pull(swa_state_key(chain, 128), 0).status().code(), StatusCode::kNotFound);
    // The hit rule's lookup over the pool.
    Result<SwaHitPlan> p = plan_swa_hit(
        600, 384, [&](int64_t pos) { return pool.contains(swa_state_key(chain, pos)); });
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->block_hit_tokens, 384);
    EXPECT_EQ(p->kind, SwaHitKind::kCatchUp);
    EXPECT_EQ(p->hit_tokens, 384);
}

// The scheduling thread puts while a fetch thread gets (run under ASan/TSan builds).
TEST(SwaStatePoolTest, ConcurrentPutAndGet) {
    SwaStatePool pool(64 * 100);
    std::thread fetcher([&] {
        for (int i = 0; i < 4000; ++i) {
            auto got = pool.get(key(static_cast<uint64_t>(i % 97)));
            if (got.is_ok()) {
                EXPECT_EQ((*got)->bytes.size(), 100u);
            }
        }
    });
    for (int i = 0; i < 4000; ++i) {
        ASSERT_TRUE(pool.put(key(static_cast<uint64_t>(i % 97)), TrafficClass::kChatbot, bytes(100))
                        .is_ok());
    }
    fetcher.join();
    EXPECT_TRUE(pool.check_invariants().is_ok());
    EXPECT_LE(pool.stats().bytes, 64 * 100);
}

TEST(SwaCacheCountersTest, PerTrafficClass) {
    SwaCacheCounters c;
    c.record(hit(1000, 896, {768}), TrafficClass::kChatbot);  // exact
    c.record(hit(1000, 896, {640}), TrafficClass::kChatbot);  // catch-up
    c.record(hit(1000, 896, {}), TrafficClass::kAgent);       // replay
    c.record(hit(100, 0, {}), TrafficClass::kAgent);          // none
    const SwaCacheClassCounters& chat = c.by_class[0];
    EXPECT_EQ(chat.requests, 2);
    EXPECT_EQ(chat.block_hits, 2);
    EXPECT_EQ(chat.block_hit_tokens, 1536);
    EXPECT_EQ(chat.swa_hits, 2);
    EXPECT_EQ(chat.swa_exact_hits, 1);
    EXPECT_EQ(chat.catch_up_tokens, 128);
    EXPECT_EQ(chat.replays, 0);
    const SwaCacheClassCounters& agent = c.by_class[1];
    EXPECT_EQ(agent.requests, 2);
    EXPECT_EQ(agent.block_hits, 1);
    EXPECT_EQ(agent.hit_tokens, 640);
    EXPECT_EQ(agent.replays, 1);
    EXPECT_EQ(agent.replay_tokens, 128);
    SwaPoolStats ps;
    ps.bytes_by_class = {1000, 2000};
    ps.evictions_by_class = {3, 4};
    c.set_pool(ps);
    const SwaCacheClassCounters t = c.total();
    EXPECT_EQ(t.requests, 4);
    EXPECT_EQ(t.pool_bytes, 3000);
    EXPECT_EQ(t.pool_evictions, 7);
    EXPECT_EQ(t.hit_tokens, 768 + 768 + 640);
}

// ---- YOCO prefill settings -------------------------------------------------------------

TEST(YocoPrefillTest, ParseAndValidate) {
    EXPECT_EQ(parse_yoco_truncation_mode("compact").value(), YocoTruncationMode::kCompact);
    EXPECT_EQ(parse_yoco_truncation_mode("off").value(), YocoTruncationMode::kOff);
    EXPECT_EQ(parse_yoco_truncation_mode("full").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(yoco_truncation_mode_name(YocoTruncationMode::kOff), "off");
    YocoPrefillSettings s;
    EXPECT_EQ(s.keep_tokens, 140);
    EXPECT_TRUE(validate_yoco_prefill(s, 12).is_ok());
    const Status too_few = validate_yoco_prefill(s, 13);
    EXPECT_EQ(too_few.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(too_few.message().find("window 128 + max rollback 13 = 141"), std::string::npos)
        << too_few.message();
    s.keep_tokens = 127;  // below the window even without rollback
    EXPECT_FALSE(validate_yoco_prefill(s, 0).is_ok());
    EXPECT_FALSE(validate_yoco_prefill(s, -1).is_ok());
    s.mode = YocoTruncationMode::kOff;  // off keeps every token
    EXPECT_TRUE(validate_yoco_prefill(s, 5).is_ok());
}

// The settings mechanism (base/settings.h) maps the flags to the SPEC's names.
TEST(YocoPrefillTest, SettingsFromTheEnvironment) {
    EXPECT_EQ(setting_env_name("--yoco-prefill-keep-tokens"), "DSINFER_YOCO_PREFILL_KEEP_TOKENS");
    EXPECT_EQ(setting_env_name("--yoco-prefill-truncation-mode"),
              "DSINFER_YOCO_PREFILL_TRUNCATION_MODE");
    ::setenv("DSINFER_YOCO_PREFILL_KEEP_TOKENS", "120", 1);
    ::setenv("DSINFER_YOCO_PREFILL_TRUNCATION_MODE", "off", 1);
    CLI::App app;
    int64_t keep = kDefaultYocoKeepTokens;
    std::string mode = "compact";
    add_setting(app, "--yoco-prefill-keep-tokens", keep, "keep");
    add_setting(app, "--yoco-prefill-truncation-mode", mode, "mode");
    const char* argv[] = {"prog"};
    app.parse(1, const_cast<char**>(argv));
    ::unsetenv("DSINFER_YOCO_PREFILL_KEEP_TOKENS");
    ::unsetenv("DSINFER_YOCO_PREFILL_TRUNCATION_MODE");
    EXPECT_EQ(keep, 120);
    Result<YocoTruncationMode> m = parse_yoco_truncation_mode(mode);
    ASSERT_TRUE(m.is_ok());
    YocoPrefillSettings s{*m, keep};
    EXPECT_TRUE(validate_yoco_prefill(s, 5).is_ok());  // off
    s.mode = YocoTruncationMode::kCompact;
    EXPECT_FALSE(validate_yoco_prefill(s, 5).is_ok());  // 120 < 133
}

}  // namespace
}  // namespace dsi::kv
