// NUMA pinning of --ep ranks (issue 19): the topology spec, the block placement of ranks
// over nodes and CPU groups, and the pinning itself in forked ranks under a faked
// two-node topology (this machine has one node).
#include "comm/numa_pinning.h"

#include <gtest/gtest.h>
#include <sched.h>

#include "comm/test_ranks.h"

namespace dsi::comm {
namespace {

TEST(NumaPinningTest, ParsesTopologySpecs) {
    auto t = parse_numa_topology("0-3,8;4-7");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_TRUE(t->faked);
    ASSERT_EQ(t->num_nodes(), 2);
    EXPECT_EQ(t->node_cpus[0], (std::vector<int>{0, 1, 2, 3, 8}));
    EXPECT_EQ(t->node_cpus[1], (std::vector<int>{4, 5, 6, 7}));
    for (const char* bad : {"", "0;", "0-x", "3-1", "0,0", "0;0", "-1"}) {
        EXPECT_EQ(parse_numa_topology(bad).status().code(), StatusCode::kInvalidArgument) << bad;
    }
    auto sys = system_numa_topology();
    ASSERT_TRUE(sys.is_ok());
    EXPECT_GE(sys->num_nodes(), 1);
    EXPECT_FALSE(sys->faked);
}

TEST(NumaPinningTest, RanksInBlocksOverNodesAndCpuGroups) {
    const NumaTopology two = parse_numa_topology("0-7;8-15").value();
    // 4 ranks on 2 nodes: 2 per node, each half of its node's CPUs.
    EXPECT_EQ(describe(pin_rank(two, 0, 4)), "node 0, cpus 0-3");
    EXPECT_EQ(describe(pin_rank(two, 1, 4)), "node 0, cpus 4-7");
    EXPECT_EQ(describe(pin_rank(two, 2, 4)), "node 1, cpus 8-11");
    EXPECT_EQ(describe(pin_rank(two, 3, 4)), "node 1, cpus 12-15");
    // 3 ranks: node 0 has ranks 0 and 1 (8 CPUs: 4 + 4), node 1 rank 2 alone.
    EXPECT_EQ(describe(pin_rank(two, 1, 3)), "node 0, cpus 4-7");
    EXPECT_EQ(describe(pin_rank(two, 2, 3)), "node 1, cpus 8-15");
    // One node, 3 ranks over 8 CPUs: 3 + 3 + 2.
    const NumaTopology one = parse_numa_topology("0-7").value();
    EXPECT_EQ(describe(pin_rank(one, 0, 3)), "node 0, cpus 0-2");
    EXPECT_EQ(describe(pin_rank(one, 2, 3)), "node 0, cpus 6-7");
    // More ranks than CPUs: shared round robin.
    const NumaTopology tiny = parse_numa_topology("0;1").value();
    EXPECT_EQ(describe(pin_rank(tiny, 2, 4)), "node 1, cpus 1");
    EXPECT_EQ(describe(pin_rank(tiny, 3, 4)), "node 1, cpus 1");
}

// Each forked rank pins itself under a faked topology of the CPUs this process may use,
// split into two "nodes", and reports the CPUs it then runs on.
TEST(NumaPinningTest, ForkedRanksPinThemselves) {
    cpu_set_t mine;
    ASSERT_EQ(::sched_getaffinity(0, sizeof mine, &mine), 0);
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &mine)) cpus.push_back(c);
    }
    std::string spec = std::to_string(cpus[0]);
    if (cpus.size() > 1) {
        spec += ";";
        for (size_t i = 1; i < cpus.size(); ++i)
            spec += (i > 1 ? "," : "") + std::to_string(cpus[i]);
    }
    const NumaTopology t = parse_numa_topology(spec).value();
    SharedArray<int> seen(2 * CPU_SETSIZE);
    auto codes = run_ranks(2, [&](int r) {
        const RankPinning p = pin_rank(t, r, 2);
        if (!apply_pinning(p, t).is_ok()) return 1;
        cpu_set_t now;
        if (::sched_getaffinity(0, sizeof now, &now) != 0) return 2;
        for (int c = 0; c < CPU_SETSIZE; ++c)
            seen[static_cast<size_t>(r) * CPU_SETSIZE + c] = CPU_ISSET(c, &now);
        return 0;
    });
    ASSERT_EQ(codes, (std::vector<int>{0, 0}));
    for (int r = 0; r < 2; ++r) {
        const RankPinning p = pin_rank(t, r, 2);
        for (int c = 0; c < CPU_SETSIZE; ++c) {
            const bool want = std::find(p.cpus.begin(), p.cpus.end(), c) != p.cpus.end();
            EXPECT_EQ(seen[static_cast<size_t>(r) * CPU_SETSIZE + c] != 0, want)
                << "rank " << r << " cpu " << c;
        }
    }
    EXPECT_EQ(apply_pinning(RankPinning{0, {CPU_SETSIZE - 1}}, t).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace dsi::comm
