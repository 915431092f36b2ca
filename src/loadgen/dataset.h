// Request sets for `dsinfer bench serve`:
//  - random: input/output lengths uniform in [len*(1-r), len*(1+r)] (r = range_ratio),
//    prompt text of random common words (about one token each in BPE vocabularies);
//  - multi-turn: conversations sharing one system prompt; turn t of a conversation is
//    sent after turn t-1 has been answered, with the whole history (user turns and the
//    server's actual replies) in front, so every turn after the first has a cached prefix;
//  - trace: replay of a sim/ trace (Mooncake JSONL, Azure CSV: tests/data/traces) with
//    its arrival times and lengths (scaled); Mooncake hash_ids become text blocks derived
//    from the id, so equal ids give equal prompt prefixes.
// Lengths are planned in words; the server's usage reports the real token counts.
// Thread model: value types and pure functions (make_dataset reads a file through Env).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"

namespace dsi::loadgen {

enum class DatasetKind { kRandom, kMultiTurn, kTrace };

struct DatasetSettings {
    DatasetKind kind = DatasetKind::kRandom;
    uint64_t seed = 1;
    int64_t num_requests = 100;  // random; trace: the first N (0: all)
    int32_t input_tokens = 256;  // random; multi-turn: per user turn
    int32_t output_tokens = 128;
    double range_ratio = 0.0;  // in [0, 1)
    // multi-turn
    int32_t num_conversations = 16;
    int32_t num_turns = 4;
    int32_t system_prefix_tokens = 512;  // shared by all conversations
    // trace
    std::string trace_path;
    double time_scale = 1.0;    // arrival times multiplied by this
    double length_scale = 1.0;  // input and output lengths multiplied by this
    int32_t max_input_tokens = 1 << 20;
    int32_t max_output_tokens = 1 << 16;

    Status validate() const;
};

struct PlannedRequest {
    int64_t arrival_ns = -1;    // trace replay time; -1: set by the run's request rate
    int32_t conversation = -1;  // multi-turn: turns of one conversation run in order
    int32_t turn = 0;
    std::string system;  // shared system prompt ("" none)
    std::string user;    // this turn's user text
    int32_t input_tokens = 0;  // planned, in words (system + user)
    int32_t output_tokens = 0;
};

struct Dataset {
    std::string name;
    std::vector<PlannedRequest> requests;  // multi-turn: turn-major order
    int32_t num_conversations = 0;
};

Result<Dataset> make_dataset(Env* env, const DatasetSettings& settings);

// `num_words` words picked by a generator keyed by `seed` (deterministic).
std::string synthetic_text(uint64_t seed, int32_t num_words);

}  // namespace dsi::loadgen
