// `--ep N` launch scheme (issue 19; docs/comm.md "Expert parallelism in the engine"): the
// process the user started is rank 0; it starts ranks 1..N-1 as copies of itself (the same
// binary and arguments plus `--ep-rank R --ep-group NAME`), which join the group's
// shared-memory segment, serve no requests of their own (they lend their experts to rank
// 0's forward passes) and exit when rank 0 ends the group. A started rank dies with rank 0
// (PR_SET_PDEATHSIG), and rank 0 reports a rank that failed.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "base/status.h"
#include "serving/replica.h"

namespace dsi {

struct EpFlags {
    int ep = 1;
    int rank = 0;       // set by rank 0 for the ranks it starts
    std::string group;  // ditto
    int64_t attach_timeout_ms = 60'000;
};

// --ep, --ep-attach-timeout-ms, and the hidden --ep-rank / --ep-group.
void add_ep_flags(CLI::App& cmd, EpFlags* f);

// This process's part of an --ep group.
class EpLaunch {
public:
    // Before open_replica: fills options.expert_parallel from `f` (a no-op for --ep 1);
    // rank 0 checks --ep against the checkpoint's config (so a bad --ep starts nothing)
    // and starts ranks 1..N-1. `long_idle`: the ranks may wait for rank 0's next request
    // without limit (serve) rather than the default idle deadline. INVALID_ARGUMENT
    // naming the flag; INTERNAL when a rank cannot be started.
    static Result<EpLaunch> start(const EpFlags& f, Env* env, serving::ReplicaOptions& options,
                                  bool long_idle);
    EpLaunch() = default;
    EpLaunch(EpLaunch&&) = default;
    EpLaunch& operator=(EpLaunch&&) = default;
    ~EpLaunch();  // kills and reaps the started ranks not reaped yet

    // A rank rank 0 started: it serves no requests of its own.
    bool started_rank() const { return rank_ > 0; }
    // A started rank's whole run: its peers' MoE exchanges until rank 0 ends the group.
    Status run_started_rank(serving::Replica& replica, Env* env);
    // Rank 0, after its engine is done: leaves the group (waiting for the other ranks to
    // be idle), then reaps them; UNAVAILABLE naming the first rank that failed.
    Status finish(serving::Replica& replica);

private:
    int rank_ = 0;
    std::vector<pid_t> pids_;  // rank 0: the started ranks, not yet reaped
};

}  // namespace dsi
