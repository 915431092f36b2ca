// The engine's SWA-state announcements (issue 18, SPEC S-KV-8): what its SwaStatePool
// holds, read by the routers' SWA directory (cluster/swa_directory.h).
//
//   GET /internal/v1/swa_states?since=N     (an engine started with --role, API keys
//   as for /v1/; 404 on an engine that keeps no SWA states)
//   200 {"incarnation": "I", "next": "M", "snapshot": bool, "fetch_address": "host:port",
//        "added": [["key", position], ...], "removed": [...]}
// key: the chain key, 32 hex digits (engine_rpc.h chain_key_hex); incarnation and cursors are
// decimal strings (64 bits survive every JSON reader). `since` = 0 (or a cursor the
// pool's change log no longer reaches, or one of another incarnation) gives a snapshot
// of every key: a router that restarts, or sees the engine restart, starts from 0.
//
// Thread model: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kv/swa_pool.h"
#include "server/engine_rpc.h"

namespace dsi::server {

// The path: kSwaStatesPath (engine_rpc.h).

struct SwaAnnouncementReply {
    uint64_t incarnation = 0;
    // Where other engines pull its states (serving/swa_fetch.h); "" when it serves none.
    std::string fetch_address;
    kv::SwaPoolChanges changes;
};

std::string encode_swa_announcement(const SwaAnnouncementReply& reply);
// INVALID_ARGUMENT naming the field for a malformed body.
Result<SwaAnnouncementReply> decode_swa_announcement(std::string_view body);

// Router to router (GET /internal/v1/swa_lookup?q=KEY.POS,KEY.POS...): the holders of
// states in the answering router's part of the directory. Answer:
//   {"held": [["key", position, ["engine", ...]], ...]}   (only states it knows holders of)
inline constexpr size_t kMaxSwaLookupStates = 64;
std::string encode_swa_lookup_target(std::span<const kv::SwaStateKey> keys);
// INVALID_ARGUMENT for a malformed query or more than kMaxSwaLookupStates states.
Result<std::vector<kv::SwaStateKey>> decode_swa_lookup_target(std::string_view target);
struct SwaLookupHeld {
    kv::SwaStateKey key;
    std::vector<std::string> engines;
};
std::string encode_swa_lookup_answer(const std::vector<SwaLookupHeld>& held);
Result<std::vector<SwaLookupHeld>> decode_swa_lookup_answer(std::string_view body);

// The `since` of a request target's query ("...?since=N"); 0 when absent or malformed.
uint64_t swa_announcement_since(std::string_view target);

}  // namespace dsi::server
