// The SWA fetch's two messages (swa_fetch.h, "On the wire") as pure functions: what the
// puller sends and what the holder answers, built and checked apart from the sockets so
// the checks can be tested and fuzzed alone (tests/fuzz/fuzz_swa_fetch.cc). A library of
// its own (dsi_serving_wire: transfer/'s frame codec and kv/'s plain types only).
//
// Thread model: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kv/swa_pool.h"
#include "transfer/frame.h"

namespace dsi::serving {

inline constexpr std::string_view kSwaFetchSection = "swa_fetch";
// A fetch request's frame payload is at most this (the state chunk's prefix and 32 bytes).
inline constexpr uint64_t kMaxSwaFetchRequestBytes = 1024;

// The request's payload (a State frame's): the "swa_fetch" chunk naming `key`.
std::vector<uint8_t> encode_swa_fetch_request(const kv::SwaStateKey& key);
// The key a request frame asks for. INVALID_ARGUMENT for another frame type, section,
// size or version.
Result<kv::SwaStateKey> decode_swa_fetch_request(const transfer::FrameView& frame);

// The answer to a request for `want` of a model whose stored state is `state_bytes`
// (seal included): the state (its seal not checked here: kv::swa_sealed_ok), the
// holder's Failure as its code (NOT_FOUND: not held), INVALID_ARGUMENT for another frame
// type, section, size, version, traffic class or key. `from` names the holder in errors.
Result<kv::SwaState> decode_swa_fetch_answer(const transfer::FrameView& frame,
                                             const kv::SwaStateKey& want, uint64_t state_bytes,
                                             std::string_view from);

}  // namespace dsi::serving
