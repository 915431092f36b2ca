// Where the ranks of an --ep group run on a multi-socket host (issue 19 deliverable 1):
// each rank pinned to one NUMA node's cores (or a group of them), its memory preferred
// from that node, so a rank's experts are read from its own socket's memory.
//
// Policy (pure, pin_rank): ranks are laid over the nodes in blocks, rank r on node
// r * num_nodes / N (ranks 0..N/nodes-1 on node 0, ...); the ranks sharing a node split its
// CPUs into contiguous groups as even as possible (a rank gets at least one CPU; more ranks
// than CPUs share them round robin). With one node this is core-group pinning.
// Mechanism (apply_pinning): sched_setaffinity of the calling process (threads started
// afterwards inherit it: call it before the model's thread pool exists) and, when the node
// is real (not a faked topology), libnuma's numa_set_preferred, so the weights this process
// copies and packs afterwards come from that node's memory (a mapped checkpoint's page
// cache is shared and stays where it is).
// The topology comes from libnuma (system_numa_topology) or, for tests on a one-node
// machine, from a spec (parse_numa_topology: "0-3;4-7" = two nodes).
// Thread model: functions; apply_pinning changes the calling process.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsi::comm {

struct NumaTopology {
    std::vector<std::vector<int>> node_cpus;  // per node, its CPU ids ascending
    std::vector<int> node_ids;                // libnuma's id of each (memory-only nodes left out)
    bool faked = false;                       // from a spec: no memory binding
    int num_nodes() const { return static_cast<int>(node_cpus.size()); }
};

// Nodes separated by ';', each a CPU list "0-3,8,10-11". INVALID_ARGUMENT on an empty
// node, a bad number or range, or a CPU listed twice.
Result<NumaTopology> parse_numa_topology(std::string_view spec);
// The host's nodes and their CPUs (libnuma); one node with every online CPU when libnuma
// says NUMA is not available.
Result<NumaTopology> system_numa_topology();

struct RankPinning {
    int node = 0;  // index into the topology's nodes
    std::vector<int> cpus;
};
// REQUIRES: 0 <= rank < num_ranks; topology has >= 1 node, each with >= 1 CPU.
RankPinning pin_rank(const NumaTopology& topology, int rank, int num_ranks);

// Pins this process to pinning.cpus and, when the topology is real, prefers
// pinning.node's memory. INTERNAL naming the call that failed.
Status apply_pinning(const RankPinning& pinning, const NumaTopology& topology);

// "node 1, cpus 4-7" for logs.
std::string describe(const RankPinning& pinning);

}  // namespace dsi::comm
