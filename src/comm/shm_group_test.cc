// The shared-memory EP group with ranks as forked processes: bitwise equality with a
// single-process reference for EP = 1, 2, 4, with and without redundant replicas and for
// every replica rule; a rank killed mid-dispatch; malformed input; attach errors.
#include "comm/shm_group.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "cluster/eplb.h"
#include "comm/expert_load.h"
#include "comm/moe_test_calls.h"
#include "comm/test_ranks.h"

namespace dsi::comm {
namespace {

using namespace moe_test;

std::string unique_name() {
    static std::atomic<int> counter{0};
    return "dsi_comm_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
}

MoeShape test_shape(int ranks, int slots) {
    MoeShape s;
    s.num_ranks = ranks;
    s.hidden = kHidden;
    s.top_k = kTopK;
    s.max_tokens_per_rank = kGlobalTokens / ranks;
    s.slots_per_rank = slots;
    return s;
}

class ShmGroupTest : public ::testing::Test {
protected:
    std::string name_ = unique_name();
    // A failed run may leave the name behind (a group that never formed).
    void TearDown() override { (void)ShmMoeCommunicator::unlink(name_); }
};

// Options of rank `rank` of a group of `ranks` over `placement`.
ShmOptions rank_options(const std::string& name, int rank, int ranks,
                        const PlacementTable& placement) {
    ShmOptions options;
    options.name = name;
    options.rank = rank;
    options.shape = test_shape(ranks, placement.slots_per_rank());
    return options;
}

enum class PlacementKind { kIdentity, kRedundant, kEplb };

PlacementTable make_placement(PlacementKind kind, int ranks) {
    if (kind == PlacementKind::kIdentity) {
        return PlacementTable::identity(kExperts, ranks, kExperts / ranks).value();
    }
    if (kind == PlacementKind::kRedundant) {  // 2 spare slots per rank
        return PlacementTable::identity(kExperts, ranks, kExperts / ranks + 2).value();
    }
    // The EPLB policy's placement for the inputs' loads (2 redundant per rank).
    ExpertLoadCounter counter(1, kExperts);
    for (int c = 0; c < kCalls; ++c) {
        DSI_CHECK(counter.add(0, make_input(c).ids).is_ok());
    }
    const int physical = cluster::num_physical_experts(kExperts, ranks, 2);
    auto p = cluster::place_experts(counter.step_loads(), 1, kExperts,
                                    cluster::EplbLayout{1, 1, ranks, physical});
    return layer_placement(p.value().phy_to_log, physical, 0, kExperts, ranks).value();
}

// One rank of an EP run (run_calls); exit code 2: create failed.
int run_rank(const std::string& name, int rank, int ranks, PlacementKind kind, ReplicaChoice choice,
             float* out) {
    const PlacementTable placement = make_placement(kind, ranks);
    auto comm = ShmMoeCommunicator::create(rank_options(name, rank, ranks, placement));
    return comm.is_ok() ? run_calls(**comm, placement, choice, out) : 2;
}

TEST_F(ShmGroupTest, BitwiseEqualToSingleProcessForEverySizePlacementAndReplicaRule) {
    std::vector<std::vector<float>> want;
    for (int c = 0; c < kCalls; ++c) {
        want.push_back(reference(make_input(c)));
    }
    const size_t floats = static_cast<size_t>(kCalls) * kGlobalTokens * kHidden;
    int run = 0;
    for (int ranks : {1, 2, 4}) {
        for (PlacementKind kind :
             {PlacementKind::kIdentity, PlacementKind::kRedundant, PlacementKind::kEplb}) {
            for (ReplicaChoice choice : {ReplicaChoice::kFirst, ReplicaChoice::kSpread,
                                         ReplicaChoice::kLocalFirst, ReplicaChoice::kRoundRobin}) {
                if (kind == PlacementKind::kIdentity && choice != ReplicaChoice::kFirst) {
                    continue;  // one replica each: the rule changes nothing
                }
                SCOPED_TRACE("ep " + std::to_string(ranks) + ", placement " +
                             std::to_string(static_cast<int>(kind)) + ", rule " +
                             std::to_string(static_cast<int>(choice)));
                SharedArray<float> out(floats);
                const std::string name = name_ + "_" + std::to_string(run++);
                auto codes = run_ranks(ranks, [&](int r) {
                    return run_rank(name, r, ranks, kind, choice, out.data());
                });
                (void)ShmMoeCommunicator::unlink(name);
                EXPECT_EQ(codes, std::vector<int>(static_cast<size_t>(ranks), 0));
                for (int c = 0; c < kCalls; ++c) {
                    EXPECT_EQ(
                        std::memcmp(out.data() + static_cast<size_t>(c) * kGlobalTokens * kHidden,
                                    want[c].data(), want[c].size() * sizeof(float)),
                        0)
                        << "call " << c;
                }
            }
        }
    }
}

// Exit codes of the fault tests: status code of the failing call, +100 if it came later
// than the test's bound.
int code_of(const Status& s) { return static_cast<int>(s.code()); }

TEST_F(ShmGroupTest, RankKilledMidDispatchFailsTheOthersFast) {
    const int ranks = 4;
    auto codes = run_ranks(ranks, [&](int r) {
        const PlacementTable placement = make_placement(PlacementKind::kRedundant, ranks);
        ShmOptions options = rank_options(name_, r, ranks, placement);
        options.op_timeout_ms = 20'000;  // the death must be seen long before this
        if (r == 2) {
            // Rows written, not yet published: the peers wait for this rank's dispatch.
            options.before_dispatch_publish = [](uint64_t call) {
                if (call == 2) {
                    ::raise(SIGKILL);
                }
            };
        }
        auto comm = ShmMoeCommunicator::create(options);
        if (!comm.is_ok()) {
            return 90;
        }
        return run_until_failure(**comm, placement, 2);
    });
    for (int r = 0; r < ranks; ++r) {
        if (r == 2) {
            EXPECT_EQ(codes[r], 128 + SIGKILL);
        } else {
            // UNAVAILABLE, not DEADLINE_EXCEEDED (20 s): the death was detected, not waited
            // out. (No bound on the time: speed is not asserted in tests.)
            EXPECT_EQ(codes[r], static_cast<int>(StatusCode::kUnavailable)) << "rank " << r;
        }
    }
}

// Rank 0 of a pair runs `wait` while rank 1 stays alive and silent for 3 s; the ranks'
// exit codes (rank 0: its status code).
std::vector<int> with_silent_peer(const std::string& name, int64_t op_timeout_ms,
                                  const std::function<Status(ShmMoeCommunicator&)>& wait) {
    return run_ranks(2, [&](int r) {
        const PlacementTable placement = make_placement(PlacementKind::kIdentity, 2);
        ShmOptions options = rank_options(name, r, 2, placement);
        options.op_timeout_ms = op_timeout_ms;
        auto comm = ShmMoeCommunicator::create(options);
        if (!comm.is_ok()) {
            return 90;
        }
        if (r == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // alive, silent
            return 0;
        }
        return code_of(wait(**comm));
    });
}

TEST_F(ShmGroupTest, SilentPeerHitsTheDeadline) {
    SharedArray<int64_t> elapsed_ms(1);
    auto codes = with_silent_peer(name_, 300, [&](ShmMoeCommunicator& comm) {
        const int64_t t0 = steady_clock_ns();
        Status s = comm.barrier();
        elapsed_ms[0] = (steady_clock_ns() - t0) / 1'000'000;
        return s;
    });
    // DEADLINE_EXCEEDED (not UNAVAILABLE, which waiting until the silent peer exits at
    // 3 s would give), and not before its 300 ms deadline.
    EXPECT_EQ(codes[0], static_cast<int>(StatusCode::kDeadlineExceeded));
    EXPECT_EQ(codes[1], 0);
    EXPECT_GE(elapsed_ms[0], 250);
}

// Bad input on one rank fails the call on every rank (no rank waits for it), and the group
// stays usable for the next call.
TEST_F(ShmGroupTest, MalformedInputFailsEveryRankThenRecovers) {
    const int ranks = 2;
    SharedArray<int> results(ranks * 4);
    auto codes = run_ranks(ranks, [&](int r) {
        const PlacementTable placement = make_placement(PlacementKind::kIdentity, ranks);
        ShmOptions options = rank_options(name_, r, ranks, placement);
        options.shape.max_recv_rows = kGlobalTokens / ranks * kTopK;  // no rank takes everything
        options.op_timeout_ms = 20'000;  // errors must come from the protocol, not this
        auto comm = ShmMoeCommunicator::create(options);
        if (!comm.is_ok()) {
            return 90;
        }
        const int tokens = kGlobalTokens / ranks;
        std::vector<int32_t> ids(static_cast<size_t>(tokens) * kTopK);
        for (size_t i = 0; i < ids.size(); ++i) {
            ids[i] = static_cast<int32_t>(i % kExperts);
        }
        // 1: rank 1 routes to expert 99.
        std::vector<int32_t> bad = ids;
        if (r == 1) {
            bad[5] = 99;
        }
        results[r * 4 + 0] =
            code_of((*comm)->layout(placement, bad, tokens, ReplicaChoice::kFirst).status());
        // 2: rank 0 sends more tokens than the capacity.
        std::vector<int32_t> many(static_cast<size_t>(tokens + 1) * kTopK, 0);
        results[r * 4 + 1] =
            r == 0
                ? code_of(
                      (*comm)->layout(placement, many, tokens + 1, ReplicaChoice::kFirst).status())
                : code_of((*comm)->layout(placement, ids, tokens, ReplicaChoice::kFirst).status());
        // 3: every row to expert 0 (rank 0): more than rank 0 may receive.
        std::vector<int32_t> hot(ids.size(), 0);
        results[r * 4 + 2] =
            code_of((*comm)->layout(placement, hot, tokens, ReplicaChoice::kFirst).status());
        // 4: a good call afterwards.
        auto layout = (*comm)->layout(placement, ids, tokens, ReplicaChoice::kFirst);
        if (!layout.is_ok()) {
            return 91;
        }
        std::vector<float> x(static_cast<size_t>(tokens) * kHidden, 1.0f);
        auto view = (*comm)->dispatch(*layout, x);
        if (!view.is_ok()) {
            return 92;
        }
        std::vector<float> gate(static_cast<size_t>(tokens) * kTopK, 1.0f);
        if (!(*comm)->combine(*layout, (*comm)->expert_output_buffer(*layout), gate, x).is_ok()) {
            return 93;
        }
        // 5: rank 1 dispatches rows of the wrong size: it leaves, rank 0 fails at once.
        layout = (*comm)->layout(placement, ids, tokens, ReplicaChoice::kFirst);
        if (!layout.is_ok()) {
            return 94;
        }
        const int64_t t0 = steady_clock_ns();
        std::vector<float> short_rows(r == 1 ? 3 : x.size());
        results[r * 4 + 3] = code_of((*comm)->dispatch(*layout, short_rows).status());
        if (steady_clock_ns() - t0 > 2'000'000'000) {
            return 95;
        }
        // Broken for good: the same error again, no wait.
        auto again = (*comm)->layout(placement, ids, tokens, ReplicaChoice::kFirst);
        return code_of(again.status()) == results[r * 4 + 3] ? 0 : 96;
    });
    EXPECT_EQ(codes, (std::vector<int>{0, 0}));
    const int invalid = static_cast<int>(StatusCode::kInvalidArgument);
    const int precondition = static_cast<int>(StatusCode::kFailedPrecondition);
    const int exhausted = static_cast<int>(StatusCode::kResourceExhausted);
    EXPECT_EQ(results[0], precondition);  // rank 0 is told rank 1 failed
    EXPECT_EQ(results[4], invalid);
    EXPECT_EQ(results[1], exhausted);
    EXPECT_EQ(results[5], precondition);
    EXPECT_EQ(results[2], exhausted);
    EXPECT_EQ(results[6], exhausted);
    EXPECT_EQ(results[3], static_cast<int>(StatusCode::kUnavailable));
    EXPECT_EQ(results[7], invalid);
}

// Ranks as threads of one process (allowed: each opens the segment itself).
TEST_F(ShmGroupTest, AttachErrors) {
    ShmOptions a;
    a.name = name_;
    a.rank = 0;
    a.shape = test_shape(2, kExperts / 2);
    a.attach_timeout_ms = 600;
    Status rank0;
    std::thread t([&] { rank0 = ShmMoeCommunicator::create(a).status(); });
    // A rank with another layout: refused, no hang.
    ShmOptions b = a;
    b.rank = 1;
    b.shape.hidden = 64;
    auto other = ShmMoeCommunicator::create(b);
    EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(other.status().message().find("hidden 64 here, 32 in the segment"), std::string::npos)
        << other.status().message();
    // The name is taken while rank 0 waits for its group.
    auto twice = ShmMoeCommunicator::create(a);
    EXPECT_EQ(twice.status().code(), StatusCode::kAlreadyExists);
    t.join();
    EXPECT_EQ(rank0.code(), StatusCode::kDeadlineExceeded);
    EXPECT_NE(rank0.message().find("ranks 1 did not attach"), std::string::npos) << rank0.message();
    // Rank 0 unlinked the segment of the group that never formed.
    EXPECT_EQ(ShmMoeCommunicator::unlink(name_).code(), StatusCode::kNotFound);
    // No segment at all: the attaching rank gives up at its deadline.
    b.shape.hidden = kHidden;
    b.attach_timeout_ms = 100;
    EXPECT_EQ(ShmMoeCommunicator::create(b).status().code(), StatusCode::kDeadlineExceeded);
    b.name = "bad/name";
    EXPECT_EQ(ShmMoeCommunicator::create(b).status().code(), StatusCode::kInvalidArgument);
    b.name = name_;
    b.rank = 2;
    EXPECT_EQ(ShmMoeCommunicator::create(b).status().code(), StatusCode::kInvalidArgument);
}

// The launcher's word that the group is abandoned (a rank died before it attached, which
// the waiting ranks cannot see) ends both waits with UNAVAILABLE, long before the attach
// deadline: rank 0 waiting for its peers, and a rank waiting for the segment.
TEST_F(ShmGroupTest, AnAbandonedGroupEndsTheAttachAtOnce) {
    std::atomic<bool> abandoned{false};
    ShmOptions a;
    a.name = name_;
    a.rank = 0;
    a.shape = test_shape(3, kExperts / 3);
    a.attach_timeout_ms = 600'000;  // only the word can end these waits within the test
    a.abandoned = [&] { return abandoned.load(); };
    Status rank0;
    std::thread t([&] { rank0 = ShmMoeCommunicator::create(a).status(); });
    ShmOptions b = a;
    b.rank = 1;
    Status rank1;
    std::thread t1([&] { rank1 = ShmMoeCommunicator::create(b).status(); });
    // Rank 2 never comes; rank 1 attaches and waits with rank 0.
    abandoned = true;
    t.join();
    t1.join();
    EXPECT_EQ(rank0.code(), StatusCode::kUnavailable) << rank0.to_string();
    EXPECT_NE(rank0.message().find("abandoned"), std::string::npos) << rank0.message();
    EXPECT_EQ(rank1.code(), StatusCode::kUnavailable) << rank1.to_string();
    EXPECT_EQ(ShmMoeCommunicator::unlink(name_).code(), StatusCode::kNotFound);
    // No segment at all: the attaching rank stops waiting for it.
    EXPECT_EQ(ShmMoeCommunicator::create(b).status().code(), StatusCode::kUnavailable);
}

// A segment larger than /dev/shm can hold fails at creation, not with SIGBUS mid-step.
TEST_F(ShmGroupTest, SegmentTooLargeForSharedMemoryIsRefused) {
    ShmOptions a;
    a.name = name_;
    a.shape = test_shape(1, kExperts);
    a.shape.hidden = 1 << 16;
    a.shape.max_recv_rows = int64_t{1} << 22;  // 4 rows regions x 1 TiB
    auto c = ShmMoeCommunicator::create(a);
    EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted) << c.status().to_string();
    EXPECT_EQ(ShmMoeCommunicator::unlink(name_).code(), StatusCode::kNotFound);
}

// A segment someone else wrote under the group's name: another format, or ours at another
// version (docs/comm.md: magic "DSIMCOMM" at byte 0, version at byte 8).
TEST_F(ShmGroupTest, ForeignOrOtherVersionSegmentIsRefused) {
    for (uint32_t version : {0u, 99u}) {
        const int fd = ::shm_open(("/" + name_).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(::ftruncate(fd, 8192), 0);
        const uint64_t magic = version == 0 ? 0x1234567890abcdefULL : 0x4d4d4f434d495344ULL;
        ASSERT_EQ(::pwrite(fd, &magic, sizeof(magic), 0), static_cast<ssize_t>(sizeof(magic)));
        ASSERT_EQ(::pwrite(fd, &version, sizeof(version), 8),
                  static_cast<ssize_t>(sizeof(version)));
        ::close(fd);
        ShmOptions b;
        b.name = name_;
        b.rank = 1;
        b.shape = test_shape(2, kExperts / 2);
        b.attach_timeout_ms = 2'000;
        auto c = ShmMoeCommunicator::create(b);
        EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
        EXPECT_NE(
            c.status().message().find(version == 0 ? "not an EP group" : "version 3 here, 99"),
            std::string::npos)
            << c.status().message();
        ASSERT_TRUE(ShmMoeCommunicator::unlink(name_).is_ok());
    }
}

// A group of two ranks that are threads of this process.
using CommResult = Result<std::unique_ptr<ShmMoeCommunicator>>;
std::pair<CommResult, CommResult> thread_pair(const std::string& name) {
    ShmOptions a;
    a.name = name;
    a.shape = test_shape(2, kExperts / 2);
    ShmOptions b = a;
    b.rank = 1;
    CommResult ca = Status(StatusCode::kInternal, "unset");
    std::thread t([&] { ca = ShmMoeCommunicator::create(a); });
    CommResult cb = ShmMoeCommunicator::create(b);
    t.join();
    return {std::move(ca), std::move(cb)};
}

// A group that formed has dropped its name; a rank that leaves makes the others'
// next wait UNAVAILABLE.
TEST_F(ShmGroupTest, FormedGroupUnlinksAndALeavingRankIsSeen) {
    auto [ca, cb] = thread_pair(name_);
    ASSERT_TRUE(ca.is_ok()) << ca.status().to_string();
    ASSERT_TRUE(cb.is_ok()) << cb.status().to_string();
    EXPECT_EQ(ShmMoeCommunicator::unlink(name_).code(), StatusCode::kNotFound);
    Status sb;
    std::thread tb([&] { sb = (*cb)->barrier(); });
    EXPECT_TRUE((*ca)->barrier().is_ok());
    tb.join();
    EXPECT_TRUE(sb.is_ok());
    cb = Status(StatusCode::kCancelled, "gone");  // rank 1 leaves
    EXPECT_EQ((*ca)->barrier().code(), StatusCode::kUnavailable);
}

TEST_F(ShmGroupTest, StepsOutOfOrderBreakTheGroupFast) {
    auto [ca, cb] = thread_pair(name_);
    ASSERT_TRUE(ca.is_ok() && cb.is_ok());
    // Rank 0 combines without a layout; rank 1 waits in a barrier and is told at once.
    std::vector<float> none;
    EXPECT_EQ((*ca)->combine(MoeLayout{}, none, none, none).code(),
              StatusCode::kFailedPrecondition);
    // UNAVAILABLE, not the 10 s DEADLINE_EXCEEDED: told, not timed out.
    EXPECT_EQ((*cb)->barrier().code(), StatusCode::kUnavailable);
}

// all_gather: every rank sees every rank's value, across many gathers interleaved with MoE
// calls (the value slots alternate like the buffer sets); its own timeout replaces the
// step deadline; a rank that leaves makes the next gather UNAVAILABLE.
TEST_F(ShmGroupTest, AllGatherSeesEveryRanksValueAndAPeerLeaving) {
    const int ranks = 3;
    auto codes = run_ranks(ranks, [&](int r) {
        // 3 ranks x 6 slots: experts 0..15, then replicas of 0 and 1 (16 % 3 != 0).
        std::vector<int> slots;
        for (int p = 0; p < ranks * 6; ++p) {
            slots.push_back(p % kExperts);
        }
        const PlacementTable group = PlacementTable::create(kExperts, ranks, 6, slots).value();
        ShmOptions options = rank_options(name_, r, ranks, group);
        options.op_timeout_ms = 20'000;
        auto comm = ShmMoeCommunicator::create(options);
        if (!comm.is_ok()) {
            return 90;
        }
        for (int g = 0; g < 7; ++g) {
            auto values = (*comm)->all_gather(r * 100 + g);
            if (!values.is_ok()) {
                return 91;
            }
            for (int q = 0; q < ranks; ++q) {
                if ((*values)[static_cast<size_t>(q)] != q * 100 + g) {
                    return 92;
                }
            }
            if (g % 3 == 1) {  // an MoE call with no tokens between gathers
                auto layout = (*comm)->layout(group, {}, 0, ReplicaChoice::kFirst);
                if (!layout.is_ok() || !(*comm)->dispatch(*layout, {}).is_ok() ||
                    !(*comm)
                         ->combine(*layout, (*comm)->expert_output_buffer(*layout), {}, {})
                         .is_ok()) {
                    return 93;
                }
            }
        }
        if (r == 2) {
            return 0;  // leaves (the communicator is destroyed at exit)
        }
        // Rank 2 is gone: told at once (not after the 60 s timeout given here).
        return code_of((*comm)->all_gather(0, 60'000).status());
    });
    EXPECT_EQ(codes[0], static_cast<int>(StatusCode::kUnavailable));
    EXPECT_EQ(codes[1], static_cast<int>(StatusCode::kUnavailable));
    EXPECT_EQ(codes[2], 0);
}

TEST_F(ShmGroupTest, AllGatherTimeoutReplacesTheStepDeadline) {
    auto codes = with_silent_peer(
        name_, 20'000, [](ShmMoeCommunicator& comm) { return comm.all_gather(1, 300).status(); });
    // DEADLINE_EXCEEDED from the gather's own 300 ms, long before the peer exits at 3 s
    // (UNAVAILABLE) or the 20 s step deadline.
    EXPECT_EQ(codes[0], static_cast<int>(StatusCode::kDeadlineExceeded));
    EXPECT_EQ(codes[1], 0);
}

}  // namespace
}  // namespace dsi::comm
