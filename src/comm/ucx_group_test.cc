// The UCX EP group with ranks as forked processes talking TCP over loopback (UCX_TLS=tcp,
// the default): bitwise equality with a single-process reference for EP 2 and 4, identity
// and redundant placements; a rank killed mid-dispatch; a shape that differs between
// ranks; a coordinator that never comes; bad coordinator addresses.
#include "comm/ucx_group.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "comm/moe_test_calls.h"
#include "comm/test_ranks.h"

namespace dsi::comm {
namespace {

using namespace moe_test;

PlacementTable make_placement(bool redundant, int ranks) {
    return PlacementTable::identity(kExperts, ranks, kExperts / ranks + (redundant ? 2 : 0))
        .value();
}

UcxGroupOptions rank_options(const std::string& coordinator, int rank, int ranks, int slots) {
    UcxGroupOptions o;
    o.coordinator = coordinator;
    o.rank = rank;
    o.shape.num_ranks = ranks;
    o.shape.hidden = kHidden;
    o.shape.top_k = kTopK;
    o.shape.max_tokens_per_rank = kGlobalTokens / ranks;
    o.shape.slots_per_rank = slots;
    o.attach_timeout_ms = 15'000;
    o.op_timeout_ms = 15'000;
    return o;
}

std::string loopback() {
    return "127.0.0.1:" + std::to_string(pick_free_port("127.0.0.1").value());
}

// One rank of an EP run (run_calls); exit code 2: create failed.
int run_rank(const std::string& coordinator, int rank, int ranks, bool redundant,
             ReplicaChoice choice, float* out) {
    const PlacementTable placement = make_placement(redundant, ranks);
    auto comm =
        create_ucx_communicator(rank_options(coordinator, rank, ranks, placement.slots_per_rank()));
    if (!comm.is_ok()) {
        std::fprintf(stderr, "rank %d create: %s\n", rank, comm.status().to_string().c_str());
        return 2;
    }
    return run_calls(**comm, placement, choice, out);
}

TEST(UcxGroupTest, BitwiseEqualToSingleProcessForEp2And4) {
    std::vector<std::vector<float>> want;
    for (int c = 0; c < kCalls; ++c) {
        want.push_back(reference(make_input(c)));
    }
    const size_t floats = static_cast<size_t>(kCalls) * kGlobalTokens * kHidden;
    struct Case {
        int ranks;
        bool redundant;
        ReplicaChoice choice;
    };
    for (const Case& k :
         {Case{2, false, ReplicaChoice::kFirst}, Case{2, true, ReplicaChoice::kRoundRobin},
          Case{4, false, ReplicaChoice::kFirst}, Case{4, true, ReplicaChoice::kSpread},
          Case{4, true, ReplicaChoice::kLocalFirst}}) {
        SCOPED_TRACE("ep " + std::to_string(k.ranks) + (k.redundant ? " redundant" : " identity") +
                     ", rule " + std::to_string(static_cast<int>(k.choice)));
        SharedArray<float> out(floats);
        const std::string coordinator = loopback();
        auto codes = run_ranks(k.ranks, [&](int r) {
            return run_rank(coordinator, r, k.ranks, k.redundant, k.choice, out.data());
        });
        EXPECT_EQ(codes, std::vector<int>(static_cast<size_t>(k.ranks), 0));
        for (int c = 0; c < kCalls; ++c) {
            EXPECT_EQ(std::memcmp(out.data() + static_cast<size_t>(c) * kGlobalTokens * kHidden,
                                  want[c].data(), want[c].size() * sizeof(float)),
                      0)
                << "call " << c;
        }
    }
}

TEST(UcxGroupTest, RankKilledMidDispatchFailsTheOthersWithUnavailable) {
    const int ranks = 4;
    const std::string coordinator = loopback();
    auto codes = run_ranks(ranks, [&](int r) {
        const PlacementTable placement = make_placement(true, ranks);
        UcxGroupOptions options = rank_options(coordinator, r, ranks, placement.slots_per_rank());
        options.op_timeout_ms = 20'000;  // the death must be seen long before this
        if (r == 2) {
            // Sends posted, not yet waited for: the peers wait for this rank's rows.
            options.before_dispatch_wait = [](uint64_t call) {
                if (call == 2) {
                    ::raise(SIGKILL);
                }
            };
        }
        auto comm = create_ucx_communicator(options);
        if (!comm.is_ok()) {
            return 90;
        }
        return run_until_failure(**comm, placement, 3);
    });
    for (int r = 0; r < ranks; ++r) {
        if (r == 2) {
            EXPECT_EQ(codes[r], 128 + SIGKILL);
        } else {
            // UNAVAILABLE, not DEADLINE_EXCEEDED (20 s): the death was seen, not waited out.
            EXPECT_EQ(codes[r], static_cast<int>(StatusCode::kUnavailable)) << "rank " << r;
        }
    }
}

// The tests below run their ranks as threads of this process, so that the sanitizer
// build's leak check sees every path (a forked rank ends with _exit: no leak check).
std::vector<Status> run_threads(int n, const std::function<Status(int)>& fn) {
    std::vector<Status> out(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
        threads.emplace_back([&, r] { out[static_cast<size_t>(r)] = fn(r); });
    }
    for (auto& t : threads) {
        t.join();
    }
    return out;
}

TEST(UcxGroupTest, ShapeThatDiffersBetweenRanksFailsEveryRank) {
    const std::string coordinator = loopback();
    const auto out = run_threads(2, [&](int r) {
        UcxGroupOptions options = rank_options(coordinator, r, 2, 8);
        if (r == 1) {
            options.shape.hidden = kHidden * 2;
        }
        return create_ucx_communicator(options).status();
    });
    for (const Status& s : out) {
        EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
        EXPECT_NE(s.message().find("hidden 64 at rank 1, 32 at rank 0"), std::string::npos)
            << s.to_string();
    }
}

TEST(UcxGroupTest, MisuseOnOneRankFailsItsPeerAtOnceAndBreaksBoth) {
    const std::string coordinator = loopback();
    const PlacementTable placement = make_placement(false, 2);
    const auto out = run_threads(2, [&](int r) -> Status {
        UcxGroupOptions options = rank_options(coordinator, r, 2, placement.slots_per_rank());
        options.op_timeout_ms = 20'000;  // the peer's failure must come long before this
        DSI_ASSIGN_OR_RETURN(std::unique_ptr<MoeCommunicator> comm,
                             create_ucx_communicator(options));
        const CallInput in = make_input(0);
        const RankSlice slice(in, r, 2);
        DSI_ASSIGN_OR_RETURN(MoeLayout layout, comm->layout(placement, slice.ids, slice.tokens,
                                                            ReplicaChoice::kFirst));
        // Rank 1 passes one row too few: INVALID_ARGUMENT here, and it leaves the group.
        const std::span<const float> x = r == 1 ? slice.x.subspan(kHidden) : slice.x;
        Status s = comm->dispatch(layout, x).status();
        // Broken: the next collective fails with the same code, at once.
        const Status again = comm->barrier();
        return again.code() == s.code() ? s : internal_error("later call: " + again.to_string());
    });
    EXPECT_EQ(out[0].code(), StatusCode::kUnavailable) << out[0].to_string();
    EXPECT_EQ(out[1].code(), StatusCode::kInvalidArgument) << out[1].to_string();
}

TEST(UcxGroupTest, CoordinatorThatNeverComesIsDeadlineExceeded) {
    const std::string coordinator = loopback();  // nobody listens there
    UcxGroupOptions options = rank_options(coordinator, 1, 2, 8);
    options.attach_timeout_ms = 300;
    EXPECT_EQ(create_ucx_communicator(options).status().code(), StatusCode::kDeadlineExceeded);
    // Rank 0 alone: its peer never joins.
    options.rank = 0;
    const Status s = create_ucx_communicator(options).status();
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
    EXPECT_NE(s.message().find("ranks 1 did not join"), std::string::npos) << s.to_string();
}

TEST(UcxGroupTest, CoordinatorPortTakenIsAlreadyExists) {
    const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
    ASSERT_EQ(::listen(taken, 4), 0);
    socklen_t len = sizeof at;
    ASSERT_EQ(::getsockname(taken, reinterpret_cast<sockaddr*>(&at), &len), 0);
    UcxGroupOptions options =
        rank_options("127.0.0.1:" + std::to_string(ntohs(at.sin_port)), 0, 2, 8);
    options.attach_timeout_ms = 300;
    EXPECT_EQ(create_ucx_communicator(options).status().code(), StatusCode::kAlreadyExists);
    ::close(taken);
}

TEST(UcxGroupTest, BadOptionsAreInvalidArgument) {
    for (const char* bad : {"nohostport", "127.0.0.1:", "127.0.0.1:99999", "[::1]5000",
                            "no-such-host.invalid:5000"}) {
        UcxGroupOptions options = rank_options(bad, 1, 2, 8);
        options.attach_timeout_ms = 300;
        EXPECT_EQ(create_ucx_communicator(options).status().code(), StatusCode::kInvalidArgument)
            << bad;
        EXPECT_EQ(check_coordinator_address(bad).code(),
                  std::string(bad).find("invalid") != std::string::npos
                      ? StatusCode::kOk
                      : StatusCode::kInvalidArgument)
            << bad;
    }
    UcxGroupOptions options = rank_options("127.0.0.1:5000", 2, 2, 8);  // rank >= ranks
    EXPECT_EQ(create_ucx_communicator(options).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsi::comm
