// Engines as ranks of an expert-parallel group (forked processes): each rank serves its
// own requests, ranks finish at different times and one has no requests at all, and
// every request's tokens equal those one engine with the whole model gives; a rank that
// dies mid-run is an error on its peers, not a hang.
#include "engine/ep_rank.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>

#include "comm/shm_group.h"
#include "comm/test_ranks.h"
#include "engine/engine_test_util.h"

namespace dsi::engine {
namespace {

using comm::run_ranks;
using comm::SharedArray;

constexpr int kMaxTokens = 12;
constexpr int kMaxRequests = 3;  // per rank

std::string unique_group() {
    static std::atomic<int> counter{0};
    return "dsi_engine_ep_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
}

// Rank r's requests (rank 2 of 4 has none); lengths differ so ranks finish apart.
std::vector<GenerateRequest> requests_of(int rank, int ranks) {
    std::vector<GenerateRequest> out;
    if (ranks == 4 && rank == 2) return out;
    for (int i = 0; i < (rank == 0 ? 2 : 1) + (rank == 3 ? 1 : 0); ++i) {
        GenerateRequest r;
        for (int t = 0; t < 4 + 3 * rank + 5 * i; ++t) r.prompt.push_back((rank * 31 + i * 7 + t * 11 + 3) % 512);
        r.sampling.max_tokens = 4 + (rank * 3 + i * 5) % (kMaxTokens - 3);
        r.sampling.temperature = i == 0 ? 0.0f : 0.8f;
        r.sampling.seed = 100 + rank * 10 + i;
        r.sampling.ignore_eos = true;
        out.push_back(std::move(r));
    }
    return out;
}

// One rank: its requests through an engine stepping in lockstep with the group; writes
// each request's tokens to out[request][kMaxTokens] (-1 padded). Exit 0 ok, 10 load,
// 11 engine, 12 the loop's status.
int engine_rank(const std::string& group, int rank, int ranks, int32_t* out) {
    auto model = ep_model(group, rank, ranks);
    if (model == nullptr) return 10;
    Harness h(base_options(), Env::default_env(), model.get());
    std::vector<RequestId> ids;
    for (GenerateRequest& r : requests_of(rank, ranks)) ids.push_back(h.add(std::move(r)));
    Status s = run_ep_rank(*h.engine, *model, [] { return true; }, Env::default_env());
    if (!s.is_ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.to_string().c_str());
        return 12;
    }
    for (size_t i = 0; i < ids.size(); ++i) {
        const std::vector<int32_t>& t = h.out[ids[i]][0].tokens;
        if (t.size() > static_cast<size_t>(kMaxTokens)) return 11;
        std::copy(t.begin(), t.end(), out + i * kMaxTokens);
    }
    return 0;
}

class EpRankTest : public ::testing::TestWithParam<int> {};

TEST_P(EpRankTest, EveryRequestGetsTheTokensOfOneEngine) {
    const int ranks = GetParam();
    const size_t per_rank = static_cast<size_t>(kMaxRequests) * kMaxTokens;
    SharedArray<int32_t> out(per_rank * ranks);
    std::fill(out.data(), out.data() + per_rank * ranks, -1);
    const std::string group = unique_group();
    auto codes = run_ranks(
        ranks, [&](int r) { return engine_rank(group, r, ranks, out.data() + r * per_rank); },
        120'000);
    (void)comm::ShmMoeCommunicator::unlink(group);
    for (int r = 0; r < ranks; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
    // One engine, the whole model, every rank's requests together.
    Harness one(base_options(), Env::default_env(), &shared_model());
    std::vector<std::pair<int, RequestId>> all;  // (slot in out, id)
    for (int r = 0; r < ranks; ++r) {
        std::vector<GenerateRequest> reqs = requests_of(r, ranks);
        for (size_t i = 0; i < reqs.size(); ++i) {
            all.emplace_back(static_cast<int>(r * per_rank + i * kMaxTokens), one.add(std::move(reqs[i])));
        }
    }
    one.run_checked();
    for (const auto& [slot, id] : all) {
        const std::vector<int32_t>& want = one.out[id][0].tokens;
        ASSERT_FALSE(want.empty());
        std::vector<int32_t> got(out.data() + slot, out.data() + slot + kMaxTokens);
        got.resize(want.size());
        EXPECT_EQ(got, want) << "request at " << slot;
        if (want.size() < static_cast<size_t>(kMaxTokens)) {
            EXPECT_EQ(out[static_cast<size_t>(slot) + want.size()], -1);  // no extra tokens
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpRankTest, ::testing::Values(2, 4));

TEST(EpRankFailure, ARankKilledMidRunFailsItsPeers) {
    const std::string group = unique_group();
    auto codes = run_ranks(2, [&](int r) {
        auto model = ep_model(group, r, 2);
        if (model == nullptr) return 10;
        EngineOptions o = base_options();
        Harness h(o, Env::default_env(), model.get());
        GenerateRequest req = requests_of(r, 2)[0];
        req.sampling.max_tokens = kMaxTokens;
        h.add(std::move(req));
        if (r == 1) {
            // A few steps, then killed without leaving the group.
            for (int i = 0; i < 3; ++i) {
                if (!h.engine->step().is_ok()) return 11;
            }
            ::raise(SIGKILL);
        }
        Status s = run_ep_rank(*h.engine, *model, [] { return true; }, Env::default_env());
        return static_cast<int>(s.code());
    });
    (void)comm::ShmMoeCommunicator::unlink(group);
    // Seen as gone (UNAVAILABLE), not waited out until the 20 s deadline.
    EXPECT_EQ(codes[0], static_cast<int>(StatusCode::kUnavailable));
    EXPECT_EQ(codes[1], 128 + SIGKILL);
}

}  // namespace
}  // namespace dsi::engine
