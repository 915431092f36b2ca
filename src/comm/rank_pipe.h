// RankPipe: a message channel between rank 0 of an expert-parallel group and one of the
// ranks it started (issue 19, attention data parallelism: docs/comm.md "Attention data
// parallelism across the ranks"). Rank 0 sends the rank its requests and aborts; the
// rank streams its token events and load back. One AF_UNIX stream socket (socketpair)
// per rank: the child's end is inherited through fork + exec.
//
// Framing: each message is a 4-byte little-endian length, then that many bytes. Nothing
// ever blocks: send() queues and writes what the socket takes now, flush() writes more,
// receive() reads what has arrived and returns the complete messages. A rank that is
// busy in a collective step therefore never stalls rank 0 (and the reverse), which would
// deadlock the lockstep: both sides read their pipe between steps. A peer that died
// shows as end of stream (receive) or UNAVAILABLE (send / flush); writes use
// MSG_NOSIGNAL, so a dead peer raises no SIGPIPE.
//
// Thread model: one RankPipe is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsi::comm {

class RankPipe {
public:
    // Largest message accepted either way (a longer length prefix is a broken stream).
    static constexpr uint32_t kMaxMessageBytes = 64u << 20;

    // A connected pair: `parent` stays in rank 0 (close-on-exec), `child_fd` is the end a
    // started rank inherits (close-on-exec too: the child clears the flag after fork, see
    // inherit_in_child; rank 0 closes its copy after the fork). INTERNAL on a failed
    // system call.
    struct Pair {
        std::unique_ptr<RankPipe> parent;
        int child_fd = -1;
    };
    static Result<Pair> create_pair();
    // In a forked child before exec: keeps `fd` open across exec. Async-signal-safe.
    static bool inherit_in_child(int fd);
    // Takes ownership of a connected socket (the started rank: the fd from its flags);
    // makes it non-blocking. INVALID_ARGUMENT when `fd` is not an open socket.
    static Result<std::unique_ptr<RankPipe>> adopt(int fd);

    ~RankPipe();
    RankPipe(const RankPipe&) = delete;
    RankPipe& operator=(const RankPipe&) = delete;

    int fd() const { return fd_; }
    // Queues one message and writes what the socket takes now. UNAVAILABLE once the peer
    // is gone (the message is dropped).
    Status send(std::string_view message);
    // Writes queued bytes the socket takes now. UNAVAILABLE once the peer is gone.
    Status flush();
    bool has_pending_output() const { return out_pos_ < out_.size(); }
    // Appends every complete message that has arrived to `messages`. Returns false once
    // the peer closed its end (and every complete message before that was returned; a
    // message cut by the peer's death is dropped). INTERNAL on a malformed length.
    Result<bool> receive(std::vector<std::string>& messages);
    // Waits up to `timeout_ns` for input (or the peer closing). For idle loops.
    void wait_readable(int64_t timeout_ns) const;
    // The same over several pipes: returns when any has input (or closed), or after
    // `timeout_ns` (a front waiting for its ranks' events).
    static void wait_any_readable(std::span<const std::shared_ptr<RankPipe>> pipes,
                                  int64_t timeout_ns);

private:
    explicit RankPipe(int fd) : fd_(fd) {}
    int fd_ = -1;
    bool eof_ = false;
    std::string out_;
    size_t out_pos_ = 0;
    std::string in_;
};

}  // namespace dsi::comm
