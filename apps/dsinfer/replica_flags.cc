#include "replica_flags.h"

#include <limits>

#include "base/logging.h"
#include "spec/verify.h"

namespace dsi {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

Result<int64_t> mib_to_bytes(const char* flag, int64_t mib) {
    if (mib < 0 || mib > std::numeric_limits<int64_t>::max() / kMiB) {
        return invalid_argument(std::string(flag) + " must be in [0, 2^43), got " +
                                std::to_string(mib));
    }
    return mib * kMiB;
}

}  // namespace

void add_replica_flags(CLI::App& cmd, ReplicaFlags* f, ReplicaFlagSet set) {
    add_setting(cmd, "--model", f->model,
                "HF checkpoint directory or .gguf file (default: the trained default model "
                "dsinfer-default, unpacked under --cache-dir from the pack in --data-dir)");
    add_setting(cmd, "--model-id", f->model_id,
                "served model name (default: the checkpoint's directory or file name; "
                "docs/serving.md)");
    add_setting(cmd, "--tokenizer-dir", f->tokenizer_dir,
                "tokenizer.json + tokenizer_config.json (default: the checkpoint's directory)");
    add_setting(cmd, "--cache-dir", f->cache_dir,
                "where the default model is kept (default: ~/.cache/dsinfer)");
    add_setting(cmd, "--data-dir", f->data_dir,
                "dsinfer's data (tokenizer files; default: share/dsinfer beside the binary)");
    add_setting(cmd, "--threads", f->threads, "compute threads (0 = all cores)")
        ->check(CLI::NonNegativeNumber);
    add_setting(cmd, "--weight-format", f->weight_format,
                "weights repacked at load: auto | bf16 | q8_0 | ... | class=format list, e.g. "
                "experts=mxfp4 (DeepseekModel::Options)");
    add_setting(cmd, "--kv-dtype", f->kv_dtype,
                "KV cache dtype: f32 | bf16 | e4m3 (V2/V3: FP8 with one scale per 16 values; V4: "
                "584-byte FP8 rows and MXFP4 indexer keys as in the reference; V4 takes no bf16)")
        ->check(CLI::IsMember({"f32", "bf16", "e4m3"}));
    if (!set.engine) {
        return;
    }
    if (set.async) {
        add_setting(cmd, "--async", f->async, "overlap scheduling with compute (S-ASYNC)");
    }
    add_setting(cmd, "--prefix-cache", f->prefix_cache, "reuse KV of shared prompt prefixes");
    add_switch(cmd, "--batch-invariant", f->batch_invariant,
               "outputs independent of the batch (S-ENG-6; the only kernel path today)");
    add_setting(cmd, "--kv-cache-mb", f->kv_cache_mb, "KV block pool size (MiB)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    add_setting(cmd, "--swap-space-mb", f->swap_space_mb,
                "host memory for KV blocks of preempted sequences (MiB; 0: recompute them)")
        ->check(CLI::NonNegativeNumber);
    add_setting(cmd, "--swa-pool-mb", f->swa_pool_mb,
                "host memory for stored SWA states of a V4 model's prefixes (MiB; 0: no V4 "
                "prefix hits)")
        ->check(CLI::NonNegativeNumber);
    add_setting(cmd, "--max-model-len", f->max_model_len, "context length (0 = the model's)")
        ->check(CLI::NonNegativeNumber);
    add_setting(cmd, "--cost-model", f->cost_model,
                "prefill cost model JSON (default: the `dsinfer calibrate` fit beside the "
                "checkpoint, if any)");
    add_setting(cmd, "--speculative", f->speculative,
                "speculative decoding drafter: none | mtp (the checkpoint's MTP layer) | "
                "ngram (prompt lookup); output is unchanged (exact acceptance)");
    add_setting(cmd, "--num-speculative-tokens", f->num_speculative_tokens,
                "drafts verified per step, 1..16 (0 = 5)");
    add_setting(cmd, "--use-nextn-decode", f->use_nextn_decode,
                "K > 0: --speculative mtp --num-speculative-tokens K (S-ENG-10)");
    add_switch(cmd, "--enable-mtp-varlen", f->enable_mtp_varlen,
               "DSpark variable-length verification (S-SPEC): verify per step the drafts whose "
               "estimated acceptance pays for their cost on the --verify-cost curve");
    add_setting(cmd, "--spec-acceptance", f->spec_acceptance,
                "how drafts are accepted at temperature > 0: exact (the output without "
                "speculation, token for token) | rejection (lossless rejection sampling: the "
                "same distribution, the same tokens on every run with fixed k)");
    add_setting(cmd, "--spec-draft-vocab", f->spec_draft_vocab,
                "MTP draft vocabulary (FR-Spec): a dsinfer-draft-vocab-v1 JSON file | auto "
                "(draft_vocab.json beside the checkpoint, if any) | none");
    add_setting(cmd, "--verify-cost", f->verify_cost,
                "verify-cost curve JSON for --enable-mtp-varlen (default: "
                "dsinfer_verify_cost.json beside the checkpoint, profiled there on first use)");
    add_setting(cmd, "--max-running-seqs", f->max_running_seqs,
                "sequences in a step at most (scheduler)")
        ->check(CLI::PositiveNumber);
    add_setting(cmd, "--max-batched-tokens", f->max_batched_tokens,
                "tokens in a step at most (scheduler)")
        ->check(CLI::PositiveNumber);
    add_setting(cmd, "--step-budget-ms", f->step_budget_ms,
                "time budget of one step under the prefill cost model (S-LB)")
        ->check(CLI::PositiveNumber);
    add_setting(cmd, "--kv-store", f->kv_store,
                "KV block store below the pool: file:///path, redis://h:p,..., "
                "shm://NAME?slots=N&slot_bytes=B|file:///path (&fetcher=SOCKET) (S-KV-4..7)");
    add_setting(cmd, "--kv-store-write", f->kv_store_write, "write completed blocks to the store");
    add_setting(cmd, "--kv-store-match-timeout-ms", f->kv_store_match_timeout_ms,
                "deadline of the store's prefix match (metadata)")
        ->check(CLI::NonNegativeNumber);
    add_setting(cmd, "--kv-store-fetch-timeout-ms", f->kv_store_fetch_timeout_ms,
                "a store fetch later than this is a miss")
        ->check(CLI::NonNegativeNumber);
    add_setting(cmd, "--kv-store-write-queue-mb", f->kv_store_write_queue_mb,
                "write-behind queue budget (MiB; a full queue drops)")
        ->check(CLI::NonNegativeNumber);
    add_setting(cmd, "--kv-store-fetch-buffer-mb", f->kv_store_fetch_buffer_mb,
                "host buffers store fetches are read into (MiB; at least one block)")
        ->check(CLI::NonNegativeNumber);
    add_setting(cmd, "--yoco-prefill-truncation-mode", f->yoco_prefill_truncation_mode,
                "V4.1 prefill: compact (decoder layers replay only the prompt's last "
                "--yoco-prefill-keep-tokens, S-SWA) | off (decoder layers over the whole prompt)");
    add_setting(cmd, "--yoco-prefill-keep-tokens", f->yoco_prefill_keep_tokens,
                "V4.1 prefill: prompt tokens the decoder layers replay; at least the window "
                "(128) + the speculative drafts");
}

Result<serving::ReplicaOptions> to_replica_options(const ReplicaFlags& f) {
    serving::ReplicaOptions o;
    o.model_path = f.model;
    o.model_id = f.model_id;
    o.tokenizer_dir = f.tokenizer_dir;
    o.cache_dir = f.cache_dir;
    o.data_dir = f.data_dir;
    o.num_threads = f.threads;
    o.weight_format = f.weight_format;
    o.kv_dtype = f.kv_dtype;
    o.kv_store_uri = f.kv_store;
    engine::EngineOptions& e = o.engine;
    e.async = f.async;
    e.prefix_cache = f.prefix_cache;
    e.batch_invariant = f.batch_invariant;
    DSI_ASSIGN_OR_RETURN(e.kv_cache_bytes, mib_to_bytes("--kv-cache-mb", f.kv_cache_mb));
    if (f.kv_cache_bytes >= 0) {
        DSI_LOG(kWarning) << "--kv-cache-bytes is deprecated; use --kv-cache-mb";
        e.kv_cache_bytes = f.kv_cache_bytes;
    }
    DSI_ASSIGN_OR_RETURN(e.swap_space_bytes, mib_to_bytes("--swap-space-mb", f.swap_space_mb));
    DSI_ASSIGN_OR_RETURN(e.swa_pool_bytes, mib_to_bytes("--swa-pool-mb", f.swa_pool_mb));
    e.max_model_len = f.max_model_len;
    e.cost_model_path = f.cost_model;
    Result<spec::Method> method = spec::parse_method(f.speculative);
    if (!method.is_ok()) return method.status().with_context("--speculative");
    e.speculative.method = *method;
    e.speculative.num_tokens = f.num_speculative_tokens;
    if (f.use_nextn_decode != 0) {
        if (e.speculative.method == spec::Method::kNgram) {
            return invalid_argument("--use-nextn-decode (MTP) conflicts with --speculative ngram");
        }
        e.speculative.method = spec::Method::kMtp;
        e.speculative.num_tokens = f.use_nextn_decode;
    }
    if (e.speculative.num_tokens < 0 || e.speculative.num_tokens > spec::kMaxSpeculativeTokens) {
        return invalid_argument("--num-speculative-tokens must be in [1, " +
                                std::to_string(spec::kMaxSpeculativeTokens) + "] (0 = 5), got " +
                                std::to_string(e.speculative.num_tokens));
    }
    if (e.speculative.num_tokens > 0 && !e.speculative.enabled()) {
        return invalid_argument("--num-speculative-tokens needs --speculative mtp or ngram");
    }
    e.speculative.varlen = f.enable_mtp_varlen;
    Result<spec::Acceptance> rule = spec::parse_acceptance(f.spec_acceptance);
    if (!rule.is_ok()) return rule.status().with_context("--spec-acceptance");
    e.speculative.rejection = *rule == spec::Acceptance::kRejection;
    if (e.speculative.rejection && !e.speculative.enabled()) {
        return invalid_argument("--spec-acceptance rejection needs --speculative mtp or ngram");
    }
    if (e.speculative.varlen && !e.speculative.enabled()) {
        return invalid_argument("--enable-mtp-varlen needs --speculative mtp or ngram");
    }
    const bool vocab_file = f.spec_draft_vocab != "auto" && f.spec_draft_vocab != "none" &&
                            !f.spec_draft_vocab.empty();
    if (vocab_file && e.speculative.method != spec::Method::kMtp) {
        return invalid_argument("--spec-draft-vocab " + f.spec_draft_vocab +
                                " needs --speculative mtp");
    }
    o.draft_vocab = f.spec_draft_vocab;
    o.verify_cost_path = f.verify_cost;
    e.scheduler.max_running_seqs = f.max_running_seqs;
    e.scheduler.max_batched_tokens = f.max_batched_tokens;
    e.scheduler.step_budget_ns = f.step_budget_ms * 1e6;
    e.kv_store_write = f.kv_store_write;
    e.kv_store_match_timeout_ms = f.kv_store_match_timeout_ms;
    e.kv_store_fetch_timeout_ms = f.kv_store_fetch_timeout_ms;
    DSI_ASSIGN_OR_RETURN(e.kv_store_write_queue_bytes,
                         mib_to_bytes("--kv-store-write-queue-mb", f.kv_store_write_queue_mb));
    DSI_ASSIGN_OR_RETURN(e.kv_store_fetch_buffer_bytes,
                         mib_to_bytes("--kv-store-fetch-buffer-mb", f.kv_store_fetch_buffer_mb));
    Result<kv::YocoTruncationMode> yoco =
        kv::parse_yoco_truncation_mode(f.yoco_prefill_truncation_mode);
    if (!yoco.is_ok()) return yoco.status().with_context("--yoco-prefill-truncation-mode");
    o.yoco_prefill.mode = *yoco;
    o.yoco_prefill.keep_tokens = f.yoco_prefill_keep_tokens;
    e.yoco_prefill = o.yoco_prefill;
    // S-SWA: the kept tail covers the window. The rollback part (rejected drafts) is
    // checked by Engine::create once a V4.1 model (KvLayout::swa_bounded_replay) is
    // known to be served: these settings mean nothing to other models, so speculation
    // there must not be refused because of them.
    DSI_RETURN_IF_ERROR(kv::validate_yoco_prefill(o.yoco_prefill, /*max_rollback_tokens=*/0)
                            .with_context("--yoco-prefill-keep-tokens"));
    return o;
}

}  // namespace dsi
