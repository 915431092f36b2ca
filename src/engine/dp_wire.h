// The messages between the DpFront (the --ep front, or rank 0 itself) and the ranks of its
// --ep group (attention data parallelism, issue 19; engine/dp_front.h). One object per
// comm::RankPipe message, in MessagePack (nlohmann::json::to_msgpack: bytes of text travel
// as they are, floats as IEEE doubles, so logprobs arrive bitwise and -inf survives), its
// kind in "t":
//   front -> rank r    "req"   {id, request}   run this request (front id)
//                      "abort" {id}            abort it (its finish event follows)
//                      "end"   {}              no more requests: leave when idle
//                      "reset" {async}         start a fresh engine (empty prefix cache,
//                                              the async step loop on or off); sent only
//                                              while no request runs there (benchmarks)
//   rank r -> front    "ev"    {id, event[, kv]}  one TokenEvent of request id; kv: the
//                                              finishing event's KV export (export_kv:
//                                              the blocks, layers as bin), which the
//                                              front's hand-over sender sends on
//                      "err"   {id, code, msg} add_request refused it (nothing ran)
//                      "load"  {running, used, blocks[, ep]}  the rank's sequences and
//                                              KV blocks in use, sent when they change;
//                                              `ep`: the group's ExpertParallelStats
//                                              (rank 0 of a front with no model, after
//                                              every group step: /metrics)
// Every GenerateRequest field travels: deadline_ns as is (Env clocks are CLOCK_MONOTONIC,
// one per host); a grammar mask as its portable form (TokenMaskProvider::portable_form:
// the serialised grammar, in "mask" as MessagePack bin), which the rank rebuilds
// (Message::mask_form; run_dp_rank). With rank 0 in the front's process (bench offline)
// DpFront keeps masked and exporting requests on rank 0's own engine. A field added to
// GenerateRequest or SamplingParams must be added here: dp_front_test round-trips a
// request with every field set.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace dsi::engine::dp_wire {

struct RankLoad {
    int64_t running_seqs = 0;
    int64_t kv_blocks_used = 0;
    int64_t kv_blocks = 0;
    bool operator==(const RankLoad&) const = default;
};

// A rank's engine counters so far (EngineStats' steps, forward_ns, host_gap_ns): they
// ride on every load report, which is sent when the load changes -- the last one, when
// the rank's last sequence ends, carries the counters of every step it ran. A front
// with no engine of its own sums them over the ranks (generate's step summary).
struct RankCounters {
    int64_t steps = 0;
    int64_t forward_ns = 0;
    int64_t host_gap_ns = 0;
    bool operator==(const RankCounters&) const = default;
};

// A decoded message. `event.top_logprobs` points into `top_logprobs`.
struct Message {
    enum class Kind { kRequest, kAbort, kEnd, kReset, kEvent, kError, kLoad } kind = Kind::kEnd;
    RequestId id = 0;
    GenerateRequest request;  // its mask is null: see mask_form
    // kRequest with a mask (has_mask): its portable form, for the rank to rebuild.
    bool has_mask = false;
    std::string mask_form;
    TokenEvent event;
    std::vector<std::pair<int32_t, float>> top_logprobs;
    Status error;
    RankLoad load;
    RankCounters counters;                  // kLoad
    std::optional<ExpertParallelStats> ep;  // kLoad
    bool async = true;                      // kReset
};

std::string encode_request(RequestId id, const GenerateRequest& request);
std::string encode_abort(RequestId id);
std::string encode_end();
std::string encode_reset(bool async);
std::string encode_event(RequestId id, const TokenEvent& event);
std::string encode_error(RequestId id, const Status& error);
std::string encode_load(const RankLoad& load, const RankCounters& counters = {},
                        const ExpertParallelStats* ep = nullptr);
// INVALID_ARGUMENT on a message that is not one of the above.
Result<Message> decode(const std::string& text);

}  // namespace dsi::engine::dp_wire
