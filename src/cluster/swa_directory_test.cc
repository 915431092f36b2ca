// Tests of the SWA-state directory: announcements, incarnations, membership, bounds,
// ageing, malformed input, and the partition of keys over routers.
#include "cluster/swa_directory.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace dsi::cluster {
namespace {

SwaStateId state(uint64_t k, int64_t position = 256) { return {k, ~k, position}; }

SwaAnnouncement changes(const std::string& engine, uint64_t incarnation,
                        std::vector<SwaStateId> added, std::vector<SwaStateId> removed = {}) {
    return {engine, incarnation, false, std::move(added), std::move(removed)};
}

std::vector<std::string> engines_of(const SwaDirectory& d, const SwaStateId& id) {
    std::vector<std::string> out;
    for (const SwaHolder& h : d.holders(id)) {
        out.push_back(h.engine);
    }
    return out;
}

TEST(SwaDirectoryTest, AnnouncementsAddAndRemoveHolders) {
    SwaDirectory d;
    ASSERT_TRUE(d.announce(changes("e1", 1, {state(1), state(2)}), 10).is_ok());
    ASSERT_TRUE(d.announce(changes("e2", 7, {state(1)}), 20).is_ok());
    EXPECT_EQ(engines_of(d, state(1)), (std::vector<std::string>{"e2", "e1"}));  // newest first
    EXPECT_EQ(d.holders(state(1))[0].incarnation, 7u);
    EXPECT_EQ(d.holders(state(1))[0].seen_ns, 20);
    EXPECT_TRUE(d.holders(state(3)).empty());
    EXPECT_FALSE(d.contains(state(2, 384)));  // the position is part of the key

    ASSERT_TRUE(d.announce(changes("e1", 1, {}, {state(1), state(3)}), 30).is_ok());
    EXPECT_EQ(engines_of(d, state(1)), (std::vector<std::string>{"e2"}));
    // Announced again: refreshed, not doubled.
    ASSERT_TRUE(d.announce(changes("e2", 7, {state(1)}), 40).is_ok());
    EXPECT_EQ(d.holders(state(1)).size(), 1u);
    EXPECT_EQ(d.holders(state(1))[0].seen_ns, 40);
    const SwaDirectoryStats s = d.stats();
    EXPECT_EQ(s.num_states, 2);
    EXPECT_EQ(s.num_entries, 2);
    EXPECT_EQ(s.added, 3);
    EXPECT_EQ(s.removed, 1);
    EXPECT_TRUE(d.check_invariants().is_ok());
}

TEST(SwaDirectoryTest, ASnapshotReplacesTheEnginesSet) {
    SwaDirectory d;
    ASSERT_TRUE(d.announce(changes("e1", 1, {state(1), state(2)}), 0).is_ok());
    ASSERT_TRUE(d.announce(changes("e2", 1, {state(2)}), 0).is_ok());
    // A router that restarted (or an engine whose change log wrapped) gets a snapshot.
    ASSERT_TRUE(d.announce({"e1", 1, true, {state(3)}, {state(3)}}, 5).is_ok());
    EXPECT_TRUE(d.holders(state(1)).empty());
    EXPECT_EQ(engines_of(d, state(2)), (std::vector<std::string>{"e2"}));
    EXPECT_EQ(engines_of(d, state(3)), (std::vector<std::string>{"e1"}));  // removed ignored
    EXPECT_EQ(d.stats().snapshots, 1);
    EXPECT_TRUE(d.check_invariants().is_ok());
}

TEST(SwaDirectoryTest, IncarnationsDropAPredecessorsStatesAndIgnoreItsLateNews) {
    SwaDirectory d;
    ASSERT_TRUE(d.announce(changes("e1", 5, {state(1), state(2)}), 0).is_ok());
    // The engine restarted: its pool is new, whatever the old one held is gone.
    ASSERT_TRUE(d.announce(changes("e1", 6, {state(3)}), 1).is_ok());
    EXPECT_TRUE(d.holders(state(1)).empty());
    EXPECT_EQ(d.holders(state(3))[0].incarnation, 6u);
    // A late announcement of the dead predecessor changes nothing.
    const Status stale = d.announce(changes("e1", 5, {state(1)}, {state(3)}), 2);
    EXPECT_EQ(stale.code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(d.holders(state(1)).empty());
    EXPECT_FALSE(d.holders(state(3)).empty());
    EXPECT_EQ(d.stats().stale_announcements, 1);
    EXPECT_TRUE(d.check_invariants().is_ok());
}

TEST(SwaDirectoryTest, MembershipDropsEnginesThatLeftOrRestarted) {
    SwaDirectory d;
    ASSERT_TRUE(d.announce(changes("e1", 1, {state(1)}), 0).is_ok());
    ASSERT_TRUE(d.announce(changes("e2", 1, {state(1), state(2)}), 0).is_ok());
    ASSERT_TRUE(d.announce(changes("e3", 1, {state(3)}), 0).is_ok());
    // e1 left; e2's record is a new incarnation (restarted before it announced); e3 stays.
    d.set_engines({{"e2", 2}, {"e3", 1}});
    EXPECT_TRUE(d.holders(state(2)).empty());
    EXPECT_TRUE(d.holders(state(1)).empty());
    EXPECT_EQ(engines_of(d, state(3)), (std::vector<std::string>{"e3"}));
    // The old e2's late news is stale now; the new one's is taken.
    EXPECT_EQ(d.announce(changes("e2", 1, {state(2)}), 1).code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(d.announce(changes("e2", 2, {state(2)}), 1).is_ok());
    EXPECT_EQ(engines_of(d, state(2)), (std::vector<std::string>{"e2"}));
    // An engine that left and comes back with its old incarnation starts from nothing.
    d.set_engines({{"e2", 2}});
    EXPECT_TRUE(d.holders(state(3)).empty());
    ASSERT_TRUE(d.announce(changes("e3", 1, {state(4)}), 2).is_ok());
    EXPECT_EQ(d.stats().num_entries, 2);
    EXPECT_TRUE(d.check_invariants().is_ok());
}

TEST(SwaDirectoryTest, BoundsEvictTheLeastRecentlyAnnounced) {
    SwaDirectorySettings s;
    s.max_entries = 3;
    s.max_holders_per_state = 2;
    SwaDirectory d(s);
    ASSERT_TRUE(d.announce(changes("e1", 1, {state(1), state(2), state(3)}), 0).is_ok());
    ASSERT_TRUE(d.announce(changes("e1", 1, {state(1)}), 1).is_ok());  // state 1 refreshed
    ASSERT_TRUE(d.announce(changes("e1", 1, {state(4)}), 2).is_ok());  // state 2 goes
    EXPECT_TRUE(d.contains(state(1)));
    EXPECT_FALSE(d.contains(state(2)));
    EXPECT_TRUE(d.contains(state(3)));
    EXPECT_TRUE(d.contains(state(4)));
    EXPECT_EQ(d.stats().evicted, 1);
    // A third holder of one state pushes out its oldest holder.
    ASSERT_TRUE(d.announce(changes("e2", 1, {state(4)}), 3).is_ok());
    ASSERT_TRUE(d.announce(changes("e3", 1, {state(4)}), 4).is_ok());
    EXPECT_EQ(engines_of(d, state(4)), (std::vector<std::string>{"e3", "e2"}));
    EXPECT_EQ(d.stats().num_entries, 3);
    EXPECT_TRUE(d.check_invariants().is_ok());
}

TEST(SwaDirectoryTest, MalformedAnnouncementsAreRefusedWhole) {
    SwaDirectorySettings s;
    s.max_announcement_states = 4;
    SwaDirectory d(s);
    EXPECT_EQ(d.announce(changes("", 1, {state(1)}), 0).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(d.announce(changes("e1", 1, {state(1), state(2, 0)}), 0).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(d.announce(changes("e1", 1, {state(1), state(2, 200)}), 0).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(d.announce(changes("e1", 1, {}, {state(2, -128)}), 0).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(d.announce(changes("e1", 1, {state(1), state(2), state(3)}, {state(4), state(5)}), 0)
                  .code(),
              StatusCode::kInvalidArgument);
    EXPECT_FALSE(d.contains(state(1)));  // nothing of a refused announcement applied
    EXPECT_EQ(d.stats().malformed_announcements, 5);
    EXPECT_EQ(d.stats().announcements, 0);
    // A malformed announcement sets no incarnation either.
    ASSERT_TRUE(d.announce(changes("e1", 0, {state(1)}), 0).is_ok());
    EXPECT_TRUE(d.check_invariants().is_ok());
}

TEST(SwaDirectoryTest, EnginesNotHeardFromAgeOut) {
    SwaDirectorySettings s;
    s.entry_ttl_ns = 100;
    SwaDirectory d(s);
    ASSERT_TRUE(d.announce(changes("e1", 1, {state(1)}), 0).is_ok());
    ASSERT_TRUE(d.announce(changes("e2", 1, {state(2)}), 0).is_ok());
    ASSERT_TRUE(d.announce(changes("e1", 1, {}), 90).is_ok());  // nothing new: still heard
    EXPECT_EQ(d.expire(150), std::vector<std::string>{"e2"});
    EXPECT_TRUE(d.contains(state(1)));
    EXPECT_FALSE(d.contains(state(2)));
    d.expire(191);
    EXPECT_FALSE(d.contains(state(1)));
    EXPECT_EQ(d.stats().expired, 2);
    EXPECT_TRUE(d.check_invariants().is_ok());
}

TEST(SwaDirectoryTest, KeysSplitOverRoutersAndMoveOnlyWithTheirRouter) {
    const std::vector<std::string> two = {"router-a", "router-b"};
    const std::vector<std::string> three = {"router-a", "router-b", "router-c"};
    EXPECT_EQ(swa_owner(state(1), {}), -1);
    EXPECT_EQ(swa_owner(state(1), std::vector<std::string>{"r"}), 0);
    std::map<int, int> by_owner;
    int moved = 0;
    const int n = 3000;
    for (int i = 0; i < n; ++i) {
        const SwaStateId id = state(0x1234567ULL * static_cast<uint64_t>(i), 128 * (1 + i % 5));
        const int o2 = swa_owner(id, two);
        const int o3 = swa_owner(id, three);
        ++by_owner[o3];
        EXPECT_EQ(o2, swa_owner(id, two));  // stable
        if (o3 != 2) {
            // Keys not taken by the new router stay where they were.
            EXPECT_EQ(o3, o2);
        } else {
            ++moved;
        }
    }
    for (int r = 0; r < 3; ++r) {
        EXPECT_GT(by_owner[r], n / 4) << r;  // roughly even: each near n / 3
    }
    EXPECT_GT(moved, n / 4);
    EXPECT_LT(moved, n / 2);
}

}  // namespace
}  // namespace dsi::cluster
