// Bootstrap of a UCX EP group (ucx_group.h): plain TCP sockets with deadlines, used once
// while the group forms (exchange_worker_addresses, at the end). Rank 0 listens on the coordinator
// address; every other rank connects and sends one frame; rank 0 answers each with one frame.
// Frames are [u32 little-endian length][bytes]. Not used on the data path.
//
// Thread model: free functions, blocking the caller until their deadline (steady clock, ns).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/ucx_group.h"

namespace dsi::comm::internal {

struct HostPort {
    std::string host;
    int port = 0;
};

// "host:port", "[v6]:port". INVALID_ARGUMENT on anything else or a port outside 1..65535
// (`allow_zero`: 0 too).
Result<HostPort> parse_host_port(const std::string& text, bool allow_zero = false);

// A listening socket bound to `at` (SO_REUSEADDR). ALREADY_EXISTS when the port is taken,
// UNAVAILABLE when the address is not local, INVALID_ARGUMENT when it does not resolve.
// Returns the fd.
Result<int> listen_on(const HostPort& at);
// The port a bound socket listens on.
Result<int> bound_port(int fd);
// Connects to `to`, retrying a refused connection every 20 ms until `deadline_ns`
// (the coordinator may not listen yet). DEADLINE_EXCEEDED then; INVALID_ARGUMENT when
// the host does not resolve; UNAVAILABLE once `abandoned` says so (polled between tries).
Result<int> connect_with_retry(const HostPort& to, int64_t deadline_ns,
                               const std::function<bool()>& abandoned = {});
Status send_frame(int fd, const std::vector<uint8_t>& bytes, int64_t deadline_ns);
// UNAVAILABLE when the peer closes first, DEADLINE_EXCEEDED at the deadline,
// INVALID_ARGUMENT on a frame longer than `max_bytes`.
Result<std::vector<uint8_t>> recv_frame(int fd, int64_t deadline_ns, size_t max_bytes);

// One frame ([u32 little-endian length][bytes]) put together from bytes as they come, for
// a reader that must not block on one peer (the coordinator reads every joining
// connection at once: a stray client that connects and says nothing must not hold the
// group's formation up). Pure: the caller reads into space() and reports what it read.
class FrameAssembler {
public:
    explicit FrameAssembler(size_t max_bytes) : max_bytes_(max_bytes) {}
    // Where the next received bytes go: never empty before done().
    std::span<uint8_t> space();
    // `n` (<= space().size()) bytes were written into space(). INVALID_ARGUMENT when the
    // header announces a frame longer than max_bytes (the assembler is then stuck).
    Status received(size_t n);
    bool done() const { return in_body_ && body_done_ == body_.size(); }
    // The frame's bytes. REQUIRES: done(). The assembler is empty again after it.
    std::vector<uint8_t> take();

private:
    size_t max_bytes_;
    std::array<uint8_t, 4> header_{};
    size_t header_done_ = 0;
    bool in_body_ = false;
    std::vector<uint8_t> body_;
    size_t body_done_ = 0;
};

// Little-endian encoding of the frames' fields.
class FrameWriter {
public:
    void u32(uint32_t v);
    void i64(int64_t v);
    void bytes(const void* p, size_t n);  // length-prefixed (u32)
    std::vector<uint8_t>& data() { return data_; }

private:
    std::vector<uint8_t> data_;
};

class FrameReader {
public:
    explicit FrameReader(const std::vector<uint8_t>& data) : data_(data) {}
    // false once a read ran past the end (every later read fails too).
    bool u32(uint32_t& v);
    bool i64(int64_t& v);
    bool bytes(std::vector<uint8_t>& out);
    // Every read succeeded and took the frame to its end.
    bool at_end() const { return ok_ && pos_ == data_.size(); }

private:
    bool take(void* p, size_t n);
    const std::vector<uint8_t>& data_;
    size_t pos_ = 0;
    bool ok_ = true;
};

// The formation's messages, apart from the sockets (fuzzed: tests/fuzz/fuzz_bootstrap.cc).
// A rank's join frame: magic, version, its rank, the shape's six sizes (ranks, hidden,
// top_k, max tokens per rank, slots per rank, receive capacity), its worker address.
struct JoinMessage {
    uint32_t version = 0;
    uint32_t rank = 0;
    std::vector<int64_t> shape;  // the six sizes, in that order
    std::vector<uint8_t> address;
};
std::vector<uint8_t> encode_join(int rank, const MoeShape& shape,
                                 const std::vector<uint8_t>& address);
// INVALID_ARGUMENT for a frame that is not a whole join frame (short, trailing bytes,
// another magic). A frame of another version carries only its version and rank (the
// coordinator names the mismatch).
Result<JoinMessage> decode_join(const std::vector<uint8_t>& frame);
// Rank 0's answer: the worker address table (`addresses` [num_ranks]) or an error.
std::vector<uint8_t> encode_table(const std::vector<std::vector<uint8_t>>& addresses);
std::vector<uint8_t> encode_error(const Status& error);
// The table of `num_ranks` addresses, the coordinator's error as it sent it, or
// INTERNAL for an answer that is neither (short, trailing bytes, a code that is no
// StatusCode, a table with a message or of another size). `coordinator` names rank 0 in errors.
Result<std::vector<std::vector<uint8_t>>> decode_answer(const std::vector<uint8_t>& frame,
                                                        int num_ranks,
                                                        const std::string& coordinator);

// The group's formation (ucx_group.h "Bootstrap"): rank 0 (o.rank == 0) listens on `at`,
// accepts every other rank's join frame (rank, MoeShape, worker address), checks it and
// answers each with the table of all worker addresses [num_ranks] (`own` at [o.rank]) or
// the error every rank then returns; the others connect, join and read the answer.
// Errors as create_ucx_communicator's.
Result<std::vector<std::vector<uint8_t>>> exchange_worker_addresses(const UcxGroupOptions& o,
                                                                    const HostPort& at,
                                                                    std::vector<uint8_t> own,
                                                                    int64_t deadline_ns);

}  // namespace dsi::comm::internal
