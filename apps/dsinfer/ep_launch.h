// `--ep N` launch scheme (issue 19; docs/comm.md "Expert parallelism in the engine"): the
// process the user started is rank 0; it starts ranks 1..N-1 as copies of itself (the same
// binary and arguments plus `--ep-rank R --ep-group NAME`), which join the group's
// shared-memory segment, serve no requests of their own and exit when rank 0 ends the
// group. A rank started this way dies with rank 0 (PR_SET_PDEATHSIG), and rank 0 reports
// a rank that failed.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/status.h"

namespace dsi {

// A fresh group name for this process: "dsinfer-ep-<pid>-<random>".
std::string new_ep_group_name();

// Starts ranks 1..num_ranks-1 (this process's /proc/self/cmdline plus the rank flags).
// INTERNAL when the command line cannot be read or a fork fails (the ranks already
// started are killed and reaped).
Result<std::vector<pid_t>> spawn_ep_ranks(int num_ranks, const std::string& group);

// Waits for the ranks (after killing them with SIGTERM first when `kill_first`); the
// first rank that did not exit 0 is UNAVAILABLE ("rank 2 exited with status 1").
Status reap_ep_ranks(const std::vector<pid_t>& pids, bool kill_first);

}  // namespace dsi
