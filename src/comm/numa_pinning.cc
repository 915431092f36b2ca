#include "comm/numa_pinning.h"

#include <numa.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <set>

namespace dsi::comm {
namespace {

Result<int> parse_cpu(std::string_view s, std::string_view spec) {
    int v = -1;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < 0 || v >= CPU_SETSIZE) {
        return invalid_argument("numa topology '" + std::string(spec) + "': bad CPU '" +
                                std::string(s) + "'");
    }
    return v;
}

}  // namespace

Result<NumaTopology> parse_numa_topology(std::string_view spec) {
    NumaTopology t;
    t.faked = true;
    std::set<int> seen;
    size_t begin = 0;
    while (begin <= spec.size()) {
        const size_t end = std::min(spec.find(';', begin), spec.size());
        const std::string_view node = spec.substr(begin, end - begin);
        std::vector<int> cpus;
        size_t b = 0;
        while (b <= node.size() && !node.empty()) {
            const size_t e = std::min(node.find(',', b), node.size());
            const std::string_view item = node.substr(b, e - b);
            const size_t dash = item.find('-');
            DSI_ASSIGN_OR_RETURN(int lo, parse_cpu(item.substr(0, dash), spec));
            int hi = lo;
            if (dash != std::string_view::npos) {
                DSI_ASSIGN_OR_RETURN(hi, parse_cpu(item.substr(dash + 1), spec));
            }
            if (hi < lo) {
                return invalid_argument("numa topology '" + std::string(spec) + "': range '" +
                                        std::string(item) + "' runs backwards");
            }
            for (int c = lo; c <= hi; ++c) {
                if (!seen.insert(c).second) {
                    return invalid_argument("numa topology '" + std::string(spec) + "': CPU " +
                                            std::to_string(c) + " listed twice");
                }
                cpus.push_back(c);
            }
            b = e + 1;
        }
        if (cpus.empty()) {
            return invalid_argument("numa topology '" + std::string(spec) + "': node " +
                                    std::to_string(t.num_nodes()) + " has no CPU");
        }
        std::sort(cpus.begin(), cpus.end());
        t.node_ids.push_back(t.num_nodes());
        t.node_cpus.push_back(std::move(cpus));
        begin = end + 1;
    }
    return t;
}

Result<NumaTopology> system_numa_topology() {
    NumaTopology t;
    if (numa_available() < 0) {
        std::vector<int> cpus;
        const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
        for (int c = 0; c < std::max(1L, n); ++c) cpus.push_back(c);
        t.node_cpus.push_back(std::move(cpus));
        t.node_ids.push_back(0);
        return t;
    }
    const int nodes = numa_num_configured_nodes();
    bitmask* mask = numa_allocate_cpumask();
    for (int node = 0; node < nodes; ++node) {
        std::vector<int> cpus;
        if (numa_node_to_cpus(node, mask) == 0) {
            for (unsigned c = 0; c < mask->size; ++c) {
                if (numa_bitmask_isbitset(mask, c)) cpus.push_back(static_cast<int>(c));
            }
        }
        if (!cpus.empty()) {  // memory-only nodes are left out
            t.node_cpus.push_back(std::move(cpus));
            t.node_ids.push_back(node);
        }
    }
    numa_free_cpumask(mask);
    if (t.node_cpus.empty()) return internal_error("libnuma: no node with CPUs");
    return t;
}

RankPinning pin_rank(const NumaTopology& topology, int rank, int num_ranks) {
    DSI_CHECK(rank >= 0 && rank < num_ranks && topology.num_nodes() > 0, "pin_rank");
    const int nodes = topology.num_nodes();
    RankPinning p;
    p.node = static_cast<int>(int64_t{rank} * nodes / num_ranks);
    // The ranks on this node: those with the same block.
    int first = rank;
    while (first > 0 && static_cast<int>(int64_t{first - 1} * nodes / num_ranks) == p.node) {
        --first;
    }
    int count = 0;
    while (first + count < num_ranks &&
           static_cast<int>(int64_t{first + count} * nodes / num_ranks) == p.node) {
        ++count;
    }
    const std::vector<int>& cpus = topology.node_cpus[static_cast<size_t>(p.node)];
    const int n = static_cast<int>(cpus.size());
    const int i = rank - first;
    if (count > n) {
        p.cpus.push_back(cpus[static_cast<size_t>(i % n)]);
        return p;
    }
    // Contiguous groups, the first n mod count one CPU larger.
    const int base = n / count;
    const int extra = n % count;
    const int begin = i * base + std::min(i, extra);
    const int size = base + (i < extra ? 1 : 0);
    p.cpus.assign(cpus.begin() + begin, cpus.begin() + begin + size);
    return p;
}

Status apply_pinning(const RankPinning& pinning, const NumaTopology& topology) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : pinning.cpus) CPU_SET(c, &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0) {
        return internal_error("sched_setaffinity(" + describe(pinning) +
                              "): " + std::strerror(errno));
    }
    if (!topology.faked && numa_available() >= 0 && topology.num_nodes() > 1) {
        numa_set_preferred(topology.node_ids[static_cast<size_t>(pinning.node)]);
    }
    return Status::ok();
}

std::string describe(const RankPinning& pinning) {
    std::string s = "node " + std::to_string(pinning.node) + ", cpus ";
    for (size_t i = 0; i < pinning.cpus.size(); ++i) {
        size_t j = i;
        while (j + 1 < pinning.cpus.size() && pinning.cpus[j + 1] == pinning.cpus[j] + 1) ++j;
        if (i > 0) s += ",";
        s += std::to_string(pinning.cpus[i]);
        if (j > i) s += "-" + std::to_string(pinning.cpus[j]);
        i = j;
    }
    return s;
}

}  // namespace dsi::comm
