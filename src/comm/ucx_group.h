// UcxMoeCommunicator: the MoE all-to-all (moe_comm.h) between processes on any hosts,
// over UCX (issue 19 deliverable 2; docs/comm.md "Between hosts: UCX" has the protocol).
// Built when CMake finds Debian's libucx-dev (as transfer/'s UCX transport); without it
// create_ucx_communicator returns UNIMPLEMENTED.
//
//  - Bootstrap: rank 0 listens on the coordinator "host:port" (a plain TCP socket); the
//    other ranks connect (retrying until the attach deadline) and send their rank, their
//    MoeShape and their UCX worker address; rank 0 checks every shape against its own
//    (FAILED_PRECONDITION "group layout differs: hidden 64 here, 32 at rank 0" on every
//    rank), then sends every rank the table of all worker addresses and closes the
//    sockets. Each rank then creates an endpoint to every peer (peer error handling on)
//    and the group does one all_gather to wire them up before create() returns.
//  - Data: tagged messages, one per (source, destination) that has rows, with I/O vectors
//    on both sides, so no side packs or unpacks: dispatch sends each (token, k) row
//    straight from the caller's hidden rows and receives it straight into its row of the
//    receive order (the vector lists the row ranges of each slot for that source), its
//    origins in the same message; combine sends each served row straight from the
//    expert outputs and the home rank receives it into a staging row per (token, k).
//    The counts of layout(), all_gather and barrier are small all-to-all messages. Tags
//    carry (kind, source rank, collective sequence number), so a rank that runs ahead
//    never mixes calls; receiving is the completion, so no step needs an extra barrier.
//  - Waiting: the calling thread progresses the worker (no thread is spawned); it spins
//    briefly, then sleeps on the worker's event fd in slices of at most 5 ms. A peer
//    whose endpoint fails (its process died: the TCP connection resets) -> UNAVAILABLE
//    "rank 2 is gone"; a silent peer -> DEADLINE_EXCEEDED at the op deadline. After any
//    error the communicator is broken, as ShmMoeCommunicator; a misuse on this rank closes
//    its endpoints so its peers fail at once.
//  - Defaults when the user has not set them: UCX_TLS=tcp, UCX_LOG_LEVEL=error (set on
//    the ucp config, not in the environment).
//
// Thread model: one communicator per rank, used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/moe_comm.h"

namespace dsi::comm {

struct UcxGroupOptions {
    // Rank 0 listens here, the others connect: "host:port" (IPv4 / IPv6 in brackets / a
    // name). Rank 0 binds the host's address ("0.0.0.0:P" listens on every interface).
    std::string coordinator;
    int rank = 0;
    MoeShape shape;
    int64_t attach_timeout_ms = 10'000;  // for the coordinator to answer and all to join
    int64_t op_timeout_ms = 10'000;      // every collective step's deadline
    // Polled while the group forms (rank 0's wait for the joins, the others' wait for rank
    // 0 to listen): true gives UNAVAILABLE at once (as ShmOptions::abandoned).
    std::function<bool()> abandoned;
    // Test hook: called on this rank after dispatch() posted its sends and before it
    // waits for them (the fault tests kill the rank here). Empty in production.
    std::function<void(uint64_t call)> before_dispatch_wait;
};

// True when this build has UCX (libucx-dev found at configure time).
bool ucx_available();

// Returns once every rank has joined and every endpoint is wired up. INVALID_ARGUMENT
// (bad rank, shape or coordinator address), FAILED_PRECONDITION (a rank's shape differs
// from rank 0's), ALREADY_EXISTS (two ranks claim one rank number; rank 0: the port is
// taken), UNAVAILABLE (rank 0 cannot listen on the address, a rank left while joining),
// DEADLINE_EXCEEDED (the coordinator never answered, or a rank never came), UNIMPLEMENTED
// (no UCX in this build).
Result<std::unique_ptr<MoeCommunicator>> create_ucx_communicator(const UcxGroupOptions& options);

// INVALID_ARGUMENT unless `coordinator` reads as "host:port" / "[v6]:port" (not resolved).
Status check_coordinator_address(const std::string& coordinator);

// A TCP port on `host` that is free now (bind to port 0, read it, close): for a launcher
// that picks the coordinator's port. Another process may take it before rank 0 binds it
// (rank 0 then fails with UNAVAILABLE).
Result<int> pick_free_port(const std::string& host);

}  // namespace dsi::comm
