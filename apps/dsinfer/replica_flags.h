// The one flag registration of a replica (serving/replica.h): `serve`, `generate`,
// `bench offline` and `calibrate` register the same flags, with the same names, units
// (sizes in MiB: --kv-cache-mb, --swap-space-mb, ...) and DSINFER_* environment
// variables, and turn them into serving::ReplicaOptions the same way.
#pragma once

#include <string>

#include "base/settings.h"
#include "base/status.h"
#include "serving/replica.h"

namespace dsi {

// Raw flag values; to_replica_options() converts units and validates.
struct ReplicaFlags {
    // Checkpoint and data.
    std::string model;  // "" = the embedded default model
    std::string model_id;
    std::string tokenizer_dir;
    std::string cache_dir;
    std::string data_dir;
    // Model.
    int threads = 0;
    std::string weight_format = "auto";
    std::string kv_dtype = "f32";
    // Engine.
    bool async = true;
    bool prefix_cache = true;
    bool batch_invariant = true;
    int64_t kv_cache_mb = 2048;
    int64_t kv_cache_bytes = -1;  // deprecated spelling of --kv-cache-mb (serve); -1: unset
    int64_t swap_space_mb = 1024;
    int64_t swa_pool_mb = 1024;  // V4's SWA state pool (docs/swa_cache.md)
    int64_t max_model_len = 0;
    std::string cost_model;  // "" = beside the checkpoint
    // Speculative decoding (spec/drafter.h, issue 24).
    std::string speculative = "none";
    int num_speculative_tokens = 0;  // 0: the default k (5)
    int use_nextn_decode = 0;        // K > 0: --speculative mtp --num-speculative-tokens K
    bool enable_mtp_varlen = false;  // DSpark variable-length verification (S-SPEC)
    std::string spec_acceptance = "exact";  // exact | rejection (spec/verify.h)
    std::string spec_draft_vocab = "auto";  // PATH | auto (beside the checkpoint) | none
    std::string verify_cost;                // "" = beside the checkpoint
    // Scheduler (engine::SchedulerConfig).
    int64_t max_running_seqs = 64;
    int64_t max_batched_tokens = 8192;
    double step_budget_ms = 2000;
    // KV store tier.
    std::string kv_store;
    bool kv_store_write = true;
    int64_t kv_store_match_timeout_ms = 200;
    int64_t kv_store_fetch_timeout_ms = 5000;
    int64_t kv_store_write_queue_mb = 256;
    int64_t kv_store_fetch_buffer_mb = 256;
    // V4.1 decoder bounded replay (kv/yoco_prefill.h).
    std::string yoco_prefill_truncation_mode = "compact";
    int64_t yoco_prefill_keep_tokens = kv::kDefaultYocoKeepTokens;
};

// Which flags a command takes: every command takes the checkpoint and model flags;
// `engine` adds engine, scheduler and store flags; `async` the --async switch (bench
// offline measures both settings itself).
struct ReplicaFlagSet {
    bool engine = true;
    bool async = true;
};

// Registers the flags on `cmd`; each flag's default is the value in *f when called
// (a command may change a default first, e.g. bench offline's --threads 2).
// REQUIRES: f outlives cmd's parsing.
void add_replica_flags(CLI::App& cmd, ReplicaFlags* f, ReplicaFlagSet set = {});

// INVALID_ARGUMENT naming the flag for values out of range.
Result<serving::ReplicaOptions> to_replica_options(const ReplicaFlags& f);

}  // namespace dsi
