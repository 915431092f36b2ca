// Reads the RESP2 replies of a pipeline straight from a socket, so a bulk string lands
// in the caller's memory: no hiredis read buffer (16 KiB per read there), no reply
// object, no copy out of it. The Redis backend reads its chunk GETs this way.
// Thread model: a function over one socket; the caller owns the socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace dsi::kvstore::internal {

// One reply of the pipeline, in order.
struct RespTarget {
    enum class Got : uint8_t { kNothing, kFilled, kOtherBulk };
    // A bulk reply of exactly 8 + dst.size() bytes: its first 8 bytes go to `prefix`,
    // the rest to dst. Empty: any reply is read and dropped (HSET's integer, ...).
    std::span<uint8_t> dst;
    uint64_t prefix = 0;
    // kFilled: such a bulk arrived; kOtherBulk: a bulk of another size (dropped);
    // kNothing: nil, an error, a status or an integer. dst may be written either way.
    Got got = Got::kNothing;
};

// Reads targets.size() replies from `fd` (blocking; the socket's SO_RCVTIMEO bounds
// each wait). False — the connection is then unusable — on EOF, a timeout, a malformed
// reply (unknown type, bad length, missing CRLF, a line over 4 KiB, an array), a bulk
// over `max_bulk_bytes`, or bytes beyond the last reply.
bool read_resp_replies(int fd, std::span<RespTarget> targets, size_t max_bulk_bytes);

}  // namespace dsi::kvstore::internal
