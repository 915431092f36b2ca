// The engine's host side: request lifecycle, the step loop (S-ASYNC) and post-processing.
// The device side (forward + sampling) is engine/worker.h; the KV tiers (pool, prefix
// pins, store fetches, write-behind, host swap) are kv/tiered_cache.h; the batching
// policy is engine/scheduler.h. One step: collect views -> schedule -> apply -> build
// plan -> submit (schedule_and_submit), then wait for the previous step and
// post-process it.
#include "engine/engine.h"

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>

#include "base/check.h"
#include "base/logging.h"
#include "engine/calibrate.h"
#include "engine/step_plan.h"
#include "engine/worker.h"
#include "kv/tiered_cache.h"
#include "model/deepseek.h"
#include "model/draft_vocab.h"
#include "sampling/stop.h"
#include "spec/mtp.h"
#include "spec/ngram.h"
#include "tokenizer/tokenizer.h"

namespace dsi::engine {
namespace {

// Dtype code of the engine's KV rows in the store's block header: the cache dtype
// (kernels::KvDtype) + 1, i.e. 1 f32, 2 bf16, 3 e4m3.
constexpr uint32_t kStoreDtypeF32 = 1;

// The host's view of one completion. Its KV (blocks, pins, store fetch, swap slots)
// lives in the TieredCache under the same id.
struct Sequence {
    int64_t id = 0;  // also the arrival order
    RequestId request_id = 0;
    int32_t index = 0;
    uint64_t seed = 0;
    std::shared_ptr<const RequestShared> req;
    int64_t deadline_ns = 0;
    std::vector<int32_t> tokens;  // prompt + generated tokens the host knows
    int64_t num_prompt = 0;
    int64_t num_cached_prompt = -1;  // prefix-cache hit tokens at first admission
    int64_t prefill_target = 0;      // tokens to compute before decoding, this epoch
    int64_t num_computed = 0;        // KV rows computed or in flight
    int64_t num_confirmed = 0;       // KV rows whose step has completed
    int64_t decoder_begin = 0;       // CED compact prefill: the decoder runs from here, this epoch
    kvstore::TrafficClass traffic = kvstore::TrafficClass::kChatbot;  // the request's
    int64_t num_sampled = 0;         // output tokens known or in flight
    uint32_t epoch = 0;
    bool running = false;
    bool init_sent = false;
    bool gated = false;           // completion > 0 waiting for completion 0's prefill
    bool export_kv = false;       // GenerateRequest::export_kv (completion 0 of n = 1)
    std::vector<int32_t> drafts;  // speculation: proposed after the last step
    int64_t mtp_pending_rows = 0;  // MTP catch-up deferred on the worker (last result)
    int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0, spec_verify_steps = 0;
    std::unique_ptr<IncrementalDecoder> decoder;
    std::unique_ptr<StopMatcher> stop;

    int64_t num_output() const { return static_cast<int64_t>(tokens.size()) - num_prompt; }
};

struct RequestState {
    std::shared_ptr<const RequestShared> req;
    StreamCallback callback;
    std::vector<int64_t> seq_ids;
    int32_t num_live = 0;
};

// What the scheduler is shown this step.
struct Views {
    std::vector<SeqView> running;
    std::vector<SeqView> waiting;
    std::vector<int64_t> expired;  // waiting sequences past their deadline not in `waiting`
};

}  // namespace

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::kNone:
            return "none";
        case FinishReason::kStop:
            return "stop";
        case FinishReason::kLength:
            return "length";
        case FinishReason::kAbort:
            return "abort";
        case FinishReason::kDeadline:
            return "deadline";
        case FinishReason::kError:
            return "error";
    }
    return "?";
}

struct Engine::Impl {
    CausalLm* model;
    EngineOptions options;
    Env* env;
    Scheduler scheduler;
    // Declared before the worker: the worker (which copies into the pool) stops first.
    std::unique_ptr<kv::TieredCache> cache;
    Worker worker;
    int64_t vocab = 0;
    int32_t eos = -1;
    int64_t max_model_len = 0;

    std::map<int64_t, Sequence> seqs;  // by id = arrival order
    std::vector<int64_t> running;      // admission order
    std::unordered_map<RequestId, RequestState> requests;
    std::vector<int64_t> pending_release;
    RequestId next_request = 1;
    int64_t next_seq = 1;
    int in_flight = 0;
    int in_flight_speculative = 0;  // of which plans that draft or verify drafts
    int64_t submitted_steps = 0;    // plans handed to the worker
    int64_t completed_steps = 0;    // their results taken
    bool landing_attached = false;  // options.kv_landing serves this engine's pool
    int64_t landings_published = 0;  // landings held when serve_landing last ran
    int64_t prev_end_ns = 0;
    // DSpark (speculative.varlen): whether to speculate at the current batch size, from
    // the measured rates of both loop modes (spec/varlen.h).
    spec::SpecGate gate;
    Status fatal;
    EngineStats stats;
    bool yoco_compact = false;  // CED compact prefill and bounded replay (EngineOptions)

    Impl(CausalLm* m, EngineOptions o, Env* e, std::unique_ptr<kv::TieredCache> c)
        : model(m),
          options(std::move(o)),
          env(e),
          scheduler(options.scheduler, e),
          cache(std::move(c)),
          worker(m, cache->pool(), options.record_logits, options.swap_in_layer_delay_us,
                 options.drafter, options.drafter ? options.speculative.k() : 0,
                 options.verify_cost,
                 options.speculative.rejection ? spec::Acceptance::kRejection
                                               : spec::Acceptance::kExact),
          gate(options.spec_gate) {
        vocab = model->config().vocab_size;
        eos = static_cast<int32_t>(model->config().eos_token_id);
        max_model_len = options.max_model_len > 0 ? options.max_model_len
                                                  : model->config().max_position_embeddings;
        yoco_compact = model->kv_layout().swa_bounded_replay &&
                       options.yoco_prefill.mode == kv::YocoTruncationMode::kCompact;
        if (options.async) worker.start();
    }

    // Whether the next plan speculates: always with fixed-length speculation; with
    // variable-length verification when the gate measured that it pays at this batch.
    bool speculate_next() {
        if (options.drafter == nullptr) return false;
        if (options.verify_cost == nullptr) return true;
        // A step that may also run prefill chunks (a running sequence still prefilling,
        // or one waiting to be admitted) cannot be measured: it gets the bucket's mode
        // without counting as a probe step.
        int64_t decoding = 0;
        bool prefill = seqs.size() > running.size();
        int64_t pending_rows = 0;
        spec::SwitchPrice price;
        price.remaining_tokens = 0;
        for (int64_t id : running) {
            const Sequence& s = seqs.at(id);
            const bool decodes = s.num_computed >= s.prefill_target;
            decoding += decodes ? 1 : 0;
            prefill |= !decodes;
            pending_rows += s.mtp_pending_rows;
            if (decodes) price.remaining_tokens += s.req->sampling.max_tokens - s.num_sampled;
        }
        // What the curve predicts at this batch from the acceptance seen so far: where
        // verifying cannot pay, the gate does not even probe it.
        const std::vector<double> survival = spec::observed_survival(
            stats.spec_drafted_at, stats.spec_accepted_at, options.speculative.k());
        const double predicted = spec::predict_speedup(*options.verify_cost, survival, decoding);
        // What a switch on costs now: the rows plain steps deferred, at the cost per row
        // the deferred catch-ups took so far (none measured yet: not priced).
        if (stats.spec_deferred_catchup_rows > 0 && decoding > 0) {
            price.catchup_ns = static_cast<double>(pending_rows) *
                               static_cast<double>(stats.spec_deferred_catchup_ns) /
                               static_cast<double>(stats.spec_deferred_catchup_rows);
            price.plain_token_ns =
                options.verify_cost->ns(decoding) / static_cast<double>(decoding);
        }
        const bool on = gate.speculate(decoding, !prefill, predicted, price);
        stats.spec_gate_priced_out = gate.priced_out();
        return on;
    }

    // Schedules one step; false if there is nothing to run.
    Result<bool> schedule_and_submit() {
        const bool speculate = speculate_next();
        if (!speculate) {
            for (int64_t id : running) seqs.at(id).drafts.clear();  // not verified
        }
        Views v = collect_views();
        ScheduleDecision d =
            scheduler.schedule(v.running, v.waiting, cache->num_available_blocks());
        d.expired.insert(d.expired.end(), v.expired.begin(), v.expired.end());
        apply(d, v.waiting);
        if (d.scheduled.empty()) return false;
        DSI_ASSIGN_OR_RETURN(StepPlan plan, build_plan(d));
        plan.draft = speculate;
        const bool verifies = std::any_of(plan.items.begin(), plan.items.end(),
                                          [](const StepItem& it) { return !it.drafts.empty(); });
        // Drafts exist only after a speculative step's result, which nothing overtakes.
        DSI_CHECK(!verifies || in_flight == 0);
        in_flight_speculative += plan.draft || verifies ? 1 : 0;
        worker.submit(std::move(plan));
        cache->end_plan();
        ++in_flight;
        ++submitted_steps;
        return true;
    }

    // Hand-over landings (engine/kv_landing.h): the receiver's asks, served between steps.
    void serve_landing() {
        if (!landing_attached) return;
        KvLanding& l = *options.kv_landing;
        // Nothing held, nothing asked, and the counters published since the last change.
        const int64_t held = cache->num_landings();
        if (held == 0 && landings_published == 0 && !l.has_asks()) return;
        landings_published = held;
        l.serve(*cache, env->now_ns(), submitted_steps, completed_steps,
                !cache->has_pending_saves());
        l.expire(*cache, env->now_ns());
    }

    // The running sequences, and the head of the waiting queue with what admission
    // would find in the cache tiers.
    Views collect_views() {
        Views v;
        for (int64_t id : running) v.running.push_back(running_view(seqs.at(id)));
        // FIFO admission stops at max_running_seqs, so only the head of the queue needs
        // a prefix lookup; deeper sequences are only checked for their deadline.
        const size_t max_views = static_cast<size_t>(options.scheduler.max_running_seqs) + 1;
        const int64_t now = env->now_ns();
        for (auto& [id, s] : seqs) {
            if (s.running || s.gated) continue;
            const bool expired = s.deadline_ns > 0 && now >= s.deadline_ns;
            if (cache->fetching(id)) {
                // S-KV-5: waiting on the store; not in the queue meanwhile.
                if (expired) {
                    v.expired.push_back(id);
                    continue;
                }
                if (!cache->poll_fetch(id)) continue;
            }
            if (v.waiting.size() >= max_views) {
                if (expired) v.expired.push_back(id);
                continue;
            }
            std::optional<kv::AdmissionPeek> p = cache->peek_admission(id, s.tokens);
            if (!p) continue;  // a store fetch started: it waits outside the queue
            SeqView w;
            w.id = id;
            w.num_tokens = static_cast<int64_t>(s.tokens.size());
            w.deadline_ns = s.deadline_ns;
            w.num_cached_tokens = p->num_cached_tokens;
            w.num_cached_unreferenced_blocks = p->num_cached_unreferenced_blocks;
            w.num_swapped_blocks = p->num_swapped_blocks;
            v.waiting.push_back(w);
        }
        return v;
    }

    // S-SWA, CED compact prefill: the decoder replays the prompt's last keep tokens, or
    // from the first position this epoch computes (0: every layer over every token).
    int64_t decoder_begin_from(const Sequence& s, int64_t first_computed) const {
        if (!yoco_compact) return 0;
        return std::max(s.prefill_target - options.yoco_prefill.keep_tokens, first_computed);
    }

    SeqView running_view(const Sequence& s) const {
        SeqView v;
        v.id = s.id;
        v.num_tokens = s.prefill_target;
        v.num_computed = s.num_computed;
        v.num_blocks = cache->num_blocks(s.id);
        v.num_exclusive_blocks = cache->num_exclusive_blocks(s.id);
        v.decoding = s.num_computed >= s.prefill_target;
        if (v.decoding) v.decode_tokens = 1 + num_drafts_to_verify(s);
        v.can_run = !v.decoding || s.num_sampled < s.req->sampling.max_tokens;
        v.deadline_ns = s.deadline_ns;
        return v;
    }

    // Drafts the next decode step verifies: never past max_tokens (the step emits up to
    // drafts + 1 tokens). Exact because a step that verifies drafts runs alone.
    int64_t num_drafts_to_verify(const Sequence& s) const {
        const int64_t room = s.req->sampling.max_tokens - s.num_output() - 1;
        return std::clamp<int64_t>(room, 0, static_cast<int64_t>(s.drafts.size()));
    }

    // Applies the decision to the host's sequences: expiries, preemptions, admissions.
    // Every admitted hit is pinned here, before build_plan allocates anything, so an
    // allocation cannot evict it.
    void apply(const ScheduleDecision& d, std::span<const SeqView> waiting) {
        for (int64_t id : d.expired) finish(seqs.at(id), FinishReason::kDeadline, true);
        for (int64_t id : d.preempted) preempt(seqs.at(id));
        for (const ScheduledSeq& sc : d.scheduled) {
            if (!sc.admit) continue;
            Sequence& s = seqs.at(sc.id);
            auto w = std::find_if(waiting.begin(), waiting.end(),
                                  [&](const SeqView& x) { return x.id == sc.id; });
            DSI_CHECK(w != waiting.end());
            const bool swapped = cache->swapped_out(s.id);
            s.num_computed = s.num_confirmed = cache->admit(s.id, w->num_cached_tokens);
            s.prefill_target = static_cast<int64_t>(s.tokens.size());
            s.decoder_begin = decoder_begin_from(s, s.num_computed);
            s.num_sampled = s.num_output();
            s.running = true;
            running.push_back(s.id);
            if (swapped) continue;  // resumed: its prompt was counted at first admission
            stats.prompt_tokens += s.prefill_target;
            stats.cached_prompt_tokens += s.num_computed;
            if (s.num_cached_prompt < 0) s.num_cached_prompt = s.num_computed;
        }
    }

    // The step's plan: blocks allocated (restored rows first), one item per scheduled
    // sequence, and the saves and releases queued since the last plan.
    Result<StepPlan> build_plan(const ScheduleDecision& d) {
        StepPlan plan;
        plan.release = std::move(pending_release);
        pending_release.clear();
        plan.save = cache->take_saves();
        for (const ScheduledSeq& sc : d.scheduled) {
            Sequence& s = seqs.at(sc.id);
            StepItem it;
            if (sc.admit && cache->swapped_out(s.id)) {
                DSI_ASSIGN_OR_RETURN(it.restore, cache->restore(s.id));
            }
            DSI_RETURN_IF_ERROR(cache->grow(s.id, sc.num_new_blocks));
            it.seq_id = s.id;
            it.epoch = s.epoch;
            it.start_pos = s.num_computed;
            // SWA state cache: a prefill chunk ends at the store position, the slot is
            // copied after a step that ends there, a hit's state restored before its first.
            kv::SwaStepPlan swa =
                cache->plan_swa_step(s.id, s.num_computed, s.num_computed + sc.num_new_tokens);
            it.swa_restore = std::move(swa.restore);
            it.swa_capture_position = swa.capture_position;
            if (swa.replay_begin > 0) {
                // S-SWA: the first step re-runs the unit before the hit (bounded replay).
                const auto b = s.tokens.begin();
                it.replay.assign(b + swa.replay_begin, b + s.num_computed);
                it.replay_context.assign(b + std::max<int64_t>(0, swa.replay_begin - 16),
                                         b + swa.replay_begin);
                s.decoder_begin = decoder_begin_from(s, swa.replay_begin);
                stats.computed_prefill_tokens += s.num_computed - swa.replay_begin;
            }
            int64_t num_new = sc.num_new_tokens;
            if (s.num_computed >= s.prefill_target) {
                it.sample = true;  // decode (+ drafts to verify)
                const auto n = static_cast<size_t>(sc.num_new_tokens - 1);
                DSI_CHECK_LE(n, s.drafts.size());
                it.drafts.assign(s.drafts.begin(),
                                 s.drafts.begin() + static_cast<std::ptrdiff_t>(n));
                s.drafts.clear();
            } else {
                num_new = swa.end - s.num_computed;
                it.tokens.assign(s.tokens.begin() + s.num_computed,
                                 s.tokens.begin() + s.num_computed + num_new);
                it.sample = s.num_computed + num_new == s.prefill_target;
                stats.computed_prefill_tokens += num_new;
                it.decoder_begin = s.decoder_begin;
                if (s.decoder_begin > 0) {
                    const int64_t skipped =
                        std::clamp<int64_t>(s.decoder_begin - s.num_computed, 0, num_new);
                    stats.yoco_decoder_skipped_tokens += skipped;
                    stats.yoco_decoder_tokens += num_new - skipped;
                    EngineStats::YocoClass& yc =
                        stats.yoco_by_class[static_cast<size_t>(s.traffic)];
                    yc.decoder_skipped_tokens += skipped;
                    yc.decoder_tokens += num_new - skipped;
                }
            }
            if (it.sample) ++s.num_sampled;
            s.num_computed += num_new;
            DSI_CHECK_LE(s.num_computed, cache->num_blocks(s.id) * kv::kBlockTokens);
            it.cache = cache->table(s.id);
            it.swap_in = cache->take_swap_in(s.id);
            if (!s.init_sent) {
                it.init = true;
                it.req = s.req;
                it.seed = s.seed;
                it.output.assign(s.tokens.begin() + s.num_prompt, s.tokens.end());
                s.init_sent = true;
            }
            plan.items.push_back(std::move(it));
        }
        return plan;
    }

    void emit(Sequence& s, TokenEvent& ev) {
        ev.cached_prompt_tokens = std::max<int64_t>(s.num_cached_prompt, 0);
        ev.spec_draft_tokens = s.spec_draft_tokens;
        ev.spec_accepted_tokens = s.spec_accepted_tokens;
        ev.spec_verify_steps = s.spec_verify_steps;
        auto it = requests.find(s.request_id);
        if (it != requests.end() && it->second.callback) it->second.callback(ev);
    }

    // Ends a sequence: frees its KV now; its worker state goes with the next plan.
    void finish(Sequence& s, FinishReason reason, bool send_event) {
        if (send_event) {
            TokenEvent ev;
            ev.request_id = s.request_id;
            ev.index = s.index;
            ev.finished = true;
            ev.reason = reason;
            emit(s, ev);
        }
        cache->remove(s.id);
        if (s.running) std::erase(running, s.id);
        if (s.init_sent) pending_release.push_back(s.id);
        auto rit = requests.find(s.request_id);
        if (rit != requests.end() && --rit->second.num_live == 0) {
            requests.erase(rit);
            ++stats.num_finished;
        }
        seqs.erase(s.id);
    }

    void preempt(Sequence& s) {
        // Swap when the host space allows, else recompute (docs/engine.md). Rows
        // [0, num_computed) are complete once the steps already submitted have run and
        // belong to tokens the host knows; one token is kept back (its logits start
        // the output again, as for a prefix hit).
        const int64_t rows =
            std::min<int64_t>(s.num_computed, static_cast<int64_t>(s.tokens.size()) - 1);
        cache->preempt(s.id, rows);
        std::erase(running, s.id);
        s.running = false;
        s.num_computed = s.num_confirmed = 0;
        s.num_sampled = s.num_output();  // in-flight samples are recomputed
        s.init_sent = false;
        s.drafts.clear();  // proposed from rows the new epoch recomputes or restores
        s.mtp_pending_rows = 0;  // the worker drops them
        ++s.epoch;
        ++stats.preemptions;
    }

    void post_process(StepResult& r) {
        ++stats.steps;
        if (r.swap_in_blocks > 0) {
            ++stats.swap_in_count;
            stats.swap_in_sum_ns += r.swap_in_ns;
            stats.swap_in_wait_ns += r.swap_in_wait_ns;
            stats.swap_in_overlapped += r.swap_in_overlapped;
            stats.store_bytes_read += r.swap_in_bytes;
        }
        stats.forward_ns += r.end_ns - r.start_ns;
        if (prev_end_ns > 0) stats.host_gap_ns += std::max<int64_t>(0, r.start_ns - prev_end_ns);
        if (r.speculative) --in_flight_speculative;
        stats.spec_draft_ns += r.draft_ns;
        stats.spec_catchup_rows += r.draft_catchup_rows;
        stats.spec_deferred_catchup_rows += r.deferred_catchup_rows;
        stats.spec_deferred_catchup_ns += r.deferred_catchup_ns;
        if (prev_end_ns > 0) observe_rate(r, r.end_ns - prev_end_ns);
        prev_end_ns = r.end_ns;
        if (!r.status.is_ok()) {
            fatal = r.status.with_context("forward pass");
            return;
        }
        bool step_verified = false;
        StepRecord record;
        if (options.on_step) {
            record.start_ns = r.start_ns;
            record.end_ns = r.end_ns;
            record.cpu_ns = r.cpu_ns;
            record.items.reserve(r.items.size());
        }
        for (ItemResult& ir : r.items) {
            auto sit = seqs.find(ir.seq_id);
            if (sit == seqs.end() || sit->second.epoch != ir.epoch) {
                // Ended or preempted: its rows ran, the context is no longer known.
                if (options.on_step) record.items.push_back({ir.num_tokens, 0});
                continue;
            }
            Sequence& s = sit->second;
            const int64_t step_begin = s.num_confirmed;
            if (options.on_step) record.items.push_back({ir.num_tokens, step_begin});
            s.num_confirmed += ir.num_kept;
            if (ir.num_kept < ir.num_tokens) {
                // Speculation: the rejected drafts' rows are rolled back, and blocks that
                // held only them go back to the pool (nothing is in flight: sync loop).
                s.num_computed -= ir.num_tokens - ir.num_kept;
                cache->truncate(s.id, s.num_computed);
            }
            count_speculation(ir);
            if (ir.num_drafts > 0) {
                s.spec_draft_tokens += ir.num_drafts;
                s.spec_accepted_tokens += ir.num_accepted;
                ++s.spec_verify_steps;
            }
            step_verified |= ir.num_drafts > 0;
            s.drafts = std::move(ir.next_drafts);
            s.mtp_pending_rows = ir.mtp_pending_rows;
            // Publish blocks whose rows are all computed and whose tokens are known (with
            // speculation the accepted drafts' rows are computed: their tokens count).
            const size_t known = s.tokens.size();
            for (int32_t j = 0; j < ir.num_accepted; ++j) s.tokens.push_back(ir.tokens[j].token);
            const int64_t full =
                std::min<int64_t>(s.num_confirmed, static_cast<int64_t>(s.tokens.size())) /
                kv::kBlockTokens;
            cache->publish(s.id, s.tokens, full);
            // S-KV-9: the step's slot copy, if it took one (state-slot layouts have no
            // speculation, so the step's rows are [step_begin, num_confirmed)).
            cache->on_swa_step(s.id, s.tokens, step_begin, s.num_confirmed,
                               std::move(ir.swa_state));
            s.tokens.resize(known);  // handle_token appends them with their events
            if (!ir.sampled) continue;
            // One token was counted in flight; the accepted drafts come on top.
            s.num_sampled += static_cast<int64_t>(ir.tokens.size()) - 1;
            const size_t V = ir.logits.empty() ? 0 : static_cast<size_t>(vocab);
            for (size_t j = 0; j < ir.tokens.size(); ++j) {
                std::span<const float> row;
                if (V > 0) row = std::span<const float>(ir.logits).subspan(j * V, V);
                if (handle_token(s, ir.tokens[j], row)) break;  // finished: s is gone
            }
        }
        stats.spec_steps += step_verified ? 1 : 0;
        if (options.on_step) options.on_step(record);
    }

    // The gate's measurement: output tokens over the time since the previous result, of
    // steps that only decoded (prefill chunks would price the mode by the prompts).
    void observe_rate(const StepResult& r, int64_t period_ns) {
        int64_t tokens = 0;
        for (const ItemResult& ir : r.items) {
            if (!ir.sampled || ir.num_tokens != 1 + ir.num_drafts) return;
            for (const SampledToken& t : ir.tokens) tokens += t.token >= 0 ? 1 : 0;
        }
        if (r.items.empty()) return;
        const size_t mode = r.speculative ? 1 : 0;
        ++stats.spec_gate_steps[mode];
        stats.spec_gate_ns[mode] += period_ns;
        stats.spec_gate_tokens[mode] += tokens;
        if (options.verify_cost == nullptr) return;
        gate.observe(r.speculative, static_cast<int64_t>(r.items.size()), tokens, period_ns);
    }

    void count_speculation(const ItemResult& ir) {
        stats.spec_varlen_cut_tokens += ir.drafts_cut;
        if (ir.num_drafts == 0) return;
        ++stats.spec_verify_steps;
        stats.spec_draft_tokens += ir.num_drafts;
        stats.spec_accepted_tokens += ir.num_accepted;
        for (int32_t j = 0; j < ir.num_drafts; ++j) {
            ++stats.spec_drafted_at[static_cast<size_t>(j)];
            stats.spec_accepted_at[static_cast<size_t>(j)] += j < ir.num_accepted;
        }
    }

    // Emits one sampled token; true if it finished the sequence (which is then erased).
    bool handle_token(Sequence& s, const SampledToken& st, std::span<const float> logits) {
        const int32_t tok = st.token;
        const SamplingParams& p = s.req->sampling;
        TokenEvent ev;
        ev.request_id = s.request_id;
        ev.index = s.index;
        ev.token = tok;
        ev.logprob = st.logprob;
        ev.top_logprobs = st.top_logprobs;
        ev.logits = logits;
        FinishReason reason = FinishReason::kNone;
        if (tok < 0) {
            reason = FinishReason::kError;  // the mask allowed nothing
        } else {
            s.tokens.push_back(tok);
            ++stats.output_tokens;
            if (s.decoder) {
                std::string piece = s.decoder->push(tok);
                if (s.stop) {
                    StopMatcher::Piece sp = s.stop->push(piece);
                    ev.text = std::move(sp.text);
                    if (sp.stopped) reason = FinishReason::kStop;
                } else {
                    ev.text = std::move(piece);
                }
            }
            if (reason == FinishReason::kNone) {
                const bool is_stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(),
                                                  tok) != p.stop_token_ids.end();
                if ((tok == eos && !p.ignore_eos) || is_stop_id) {
                    reason = FinishReason::kStop;
                } else if (s.num_output() >= p.max_tokens) {
                    reason = FinishReason::kLength;
                }
            }
            // A length finish flushes the text held back (a partial character, a
            // possible stop-string prefix) -- unless the generation goes on on another
            // engine (export_kv), whose continuation holds that text and releases it.
            const bool continues_elsewhere = s.export_kv && reason == FinishReason::kLength;
            if (reason != FinishReason::kNone && reason != FinishReason::kStop && s.decoder &&
                !continues_elsewhere) {
                std::string rest = s.decoder->flush();
                if (s.stop) rest = s.stop->push(rest).text + s.stop->flush();
                ev.text += rest;
            } else if (reason == FinishReason::kStop && s.decoder && !s.stop) {
                ev.text += s.decoder->flush();
            }
        }
        // Completion 0's prefill is done: its prompt blocks are published, let the
        // siblings in (they hit them in the prefix index).
        if (s.index == 0) {
            auto rit = requests.find(s.request_id);
            if (rit != requests.end()) {
                for (int64_t sid : rit->second.seq_ids) {
                    auto it = seqs.find(sid);
                    if (it != seqs.end()) it->second.gated = false;
                }
            }
        }
        ev.finished = reason != FinishReason::kNone;
        ev.reason = reason;
        if (s.export_kv && (reason == FinishReason::kLength || reason == FinishReason::kStop)) {
            // Its blocks are published (the step result came first) and still held.
            ev.kv_export = cache->export_blocks(s.id, s.tokens, s.num_confirmed);
            if (ev.kv_export) {
                ++stats.kv_exports;
                stats.kv_export_bytes += static_cast<int64_t>(ev.kv_export->bytes());
            }
        }
        emit(s, ev);
        if (ev.finished) finish(s, reason, false);
        return ev.finished;
    }
};

namespace {

// Checks the speculative settings and creates their drafter (none when off). Steps that
// speculate run synchronously (EngineOptions::speculative).
Status make_drafter(CausalLm* model, const KvLayout& layout, Env* env, EngineOptions& options) {
    spec::SpecConfig c = options.speculative;
    if (options.drafter != nullptr) c.method = spec::Method::kNgram;  // only k is checked
    // MTP drafting is wired for V2/V3 (DeepseekModel) only.
    auto* v3 = dynamic_cast<DeepseekModel*>(model);
    const bool has_mtp = v3 != nullptr && v3->kv_num_layers() > v3->config().num_hidden_layers;
    DSI_RETURN_IF_ERROR(spec::validate(c, has_mtp).with_context("speculative decoding"));
    if (c.enabled() && layout.state_floats > 0) {
        // Rejected drafts would advance the per-sequence state (V4's window ring and
        // compressors), which has no rollback yet.
        return failed_precondition(
            "speculative decoding: this model keeps per-sequence state that cannot be rolled "
            "back yet (" +
            model->config().architecture + ")");
    }
    if (options.drafter == nullptr && c.method == spec::Method::kMtp) {
        std::shared_ptr<const MtpDraftHead> head;
        if (!c.draft_vocab_path.empty()) {
            const std::string& path = c.draft_vocab_path;
            Result<std::string> text = env->read_file(path);
            if (!text.is_ok()) return text.status().with_context("draft vocabulary " + path);
            Result<std::vector<int32_t>> ids = parse_draft_vocab(*text, model->config().vocab_size);
            if (!ids.is_ok()) return ids.status().with_context(path);
            DSI_ASSIGN_OR_RETURN(head, v3->make_mtp_draft_head(*ids));
        }
        options.drafter = std::make_shared<spec::MtpDrafter>(v3, std::move(head));
    } else if (options.drafter == nullptr && c.method == spec::Method::kNgram) {
        options.drafter = std::make_shared<spec::NgramDrafter>(c.ngram_max, c.ngram_min);
    }
    if (c.varlen && options.verify_cost == nullptr) {
        // No curve from `dsinfer calibrate`: a quick one of this model, in memory.
        VerifyCalibration quick;
        quick.reps = 2;
        DSI_ASSIGN_OR_RETURN(spec::VerifyCostCurve curve, profile_verify_cost(model, quick));
        options.verify_cost = std::make_shared<const spec::VerifyCostCurve>(std::move(curve));
    }
    if (!c.varlen) options.verify_cost = nullptr;
    return Status::ok();
}

}  // namespace

uint64_t StoreBlockShape::block_bytes() const {
    uint64_t n = 0;
    for (uint64_t b : layer_block_bytes) n += b;
    return n;
}

std::optional<StoreBlockShape> store_block_shape(const CausalLm& model,
                                                 kv::YocoTruncationMode yoco) {
    const KvLayout layout = model.kv_layout();
    const bool with_state = layout.state_floats > 0;
    if (with_state ? !layout.state_snapshot_resumes : !layout.prefix_reusable) {
        return std::nullopt;
    }
    StoreBlockShape s;
    for (const KvGroupLayout& g : layout.groups) {  // TieredCache's store layers
        const int64_t entries = kv::kBlockTokens / g.tokens_per_entry;
        const auto bytes = static_cast<uint64_t>(entries * g.floats_per_entry) * sizeof(float);
        s.layer_block_bytes.insert(s.layer_block_bytes.end(), static_cast<size_t>(g.num_layers),
                                   bytes);
    }
    s.dtype = kStoreDtypeF32 + static_cast<uint32_t>(model.kv_dtype());
    if (with_state) {
        uint64_t floats = static_cast<uint64_t>(layout.state_floats);
        if (layout.swa_bounded_replay && yoco == kv::YocoTruncationMode::kCompact) {
            floats = 0;  // the tiered cache packs these ranges of the slot (swa_pack)
            for (const auto& [b, e] : layout.swa_stored_ranges) {
                floats += static_cast<uint64_t>(e - b);
            }
        }
        s.swa_state_bytes = floats * sizeof(float) + kv::kSwaSealBytes;
    }
    return s;
}

Result<std::unique_ptr<Engine>> Engine::create(CausalLm* model, EngineOptions options, Env* env) {
    DSI_CHECK(model != nullptr && env != nullptr);
    if (!options.cost_model_path.empty()) {
        // S-LB: the fit of `dsinfer calibrate`, when there is one; else a conservative
        // CPU estimate from the model's sizes (engine/calibrate.h, issue 22 D3).
        DSI_ASSIGN_OR_RETURN(std::optional<PrefillCostModel> fitted,
                             load_cost_model(env, options.cost_model_path));
        options.scheduler.cost =
            fitted ? *fitted
                   : conservative_cpu_cost_model(prefill_shape(model->config()),
                                                 kernels::active_isa());
        if (!fitted) {
            // The conservative estimate assumes a slow CPU; on a large checkpoint it can
            // leave room for a few tokens a step (prefill one token at a time, one sequence
            // admitted while another decodes). Say so: the fit takes a minute.
            const int64_t tokens = options.scheduler.cost.max_chunk_tokens(
                options.scheduler.step_budget_ns, 0, options.scheduler.max_batched_tokens);
            if (tokens < 256) {
                DSI_LOG(kWarning) << "no prefill cost fit at " << options.cost_model_path
                                  << "; the conservative estimate allows " << tokens
                                  << " prompt tokens a step: run `dsinfer calibrate --model "
                                     "<checkpoint>` once for full batches";
            }
        }
    }
    DSI_RETURN_IF_ERROR(options.scheduler.validate());
    const KvLayout layout = model->kv_layout();
    if (layout.state_snapshot_resumes && layout.state_floats > 0) {
        // Prefixes through the SWA state cache (docs/swa_cache.md): blocks (every cache
        // group) go through the store tier, the state stays in this process's pool; a
        // preempted sequence recomputes (swapping does not carry the state slot).
        options.swap_space_bytes = 0;
    } else if (!layout.prefix_reusable) {
        // Never offer a hit the model cannot honour (docs/engine.md, "Models with state").
        if (options.prefix_cache || options.kv_store != nullptr || !options.kv_store_uri.empty() ||
            options.swap_space_bytes > 0) {
            DSI_LOG(kInfo) << "prefix caching, the KV store and preemption by swapping are off: "
                           << layout.not_reusable_reason;
        }
        options.prefix_cache = false;
        options.kv_store = nullptr;
        options.kv_store_uri.clear();
        options.swap_space_bytes = 0;
    }
    if (layout.swa_bounded_replay) {
        // S-SWA: the kept tail covers the window and every draft a step can roll back.
        const int64_t rollback =
            options.speculative.enabled() || options.drafter ? options.speculative.k() : 0;
        DSI_RETURN_IF_ERROR(kv::validate_yoco_prefill(options.yoco_prefill, rollback)
                                .with_context("--yoco-prefill-keep-tokens"));
    }
    DSI_RETURN_IF_ERROR(make_drafter(model, layout, env, options));
    kv::TieredCacheOptions co;
    for (const KvGroupLayout& g : layout.groups) {
        co.groups.push_back(
            kv::CacheGroupSpec{g.name, g.num_layers, g.tokens_per_entry, g.floats_per_entry});
    }
    int64_t block_bytes = 0;
    for (const kv::CacheGroupSpec& g : co.groups) {
        block_bytes += g.block_floats() * static_cast<int64_t>(sizeof(float));
    }
    int64_t budget = options.kv_cache_bytes;
    if (layout.state_floats > 0) {
        // One state slot per running sequence, within half of the KV budget.
        const int64_t slot_bytes = layout.state_floats * static_cast<int64_t>(sizeof(float));
        const int64_t fit = options.kv_cache_bytes / 2 / slot_bytes;
        if (fit < 1) {
            return invalid_argument("kv cache of " + std::to_string(options.kv_cache_bytes) +
                                    " bytes holds no two per-sequence state slots of " +
                                    std::to_string(slot_bytes) + " bytes");
        }
        co.state_floats = layout.state_floats;
        co.num_state_slots = std::min(options.scheduler.max_running_seqs, fit);
        if (co.num_state_slots < options.scheduler.max_running_seqs) {
            DSI_LOG(kInfo) << "max_running_seqs " << options.scheduler.max_running_seqs << " -> "
                           << co.num_state_slots << ": the state slots of " << slot_bytes
                           << " bytes that fit in half of the KV cache";
            options.scheduler.max_running_seqs = co.num_state_slots;
        }
        budget -= co.num_state_slots * slot_bytes;
    }
    co.num_blocks = options.num_kv_blocks;
    if (co.num_blocks <= 0) {
        co.num_blocks = budget / block_bytes;
        if (co.num_blocks < 1) {
            return invalid_argument("kv cache of " + std::to_string(options.kv_cache_bytes) +
                                    " bytes holds no block of " + std::to_string(block_bytes) +
                                    " bytes");
        }
    }
    co.prefix_cache = options.prefix_cache;
    co.swa_pool = options.swa_pool;
    co.swa_pool_bytes = options.swa_pool_bytes;
    if (layout.swa_bounded_replay &&
        options.yoco_prefill.mode == kv::YocoTruncationMode::kCompact) {
        co.swa_bounded_replay = true;
        co.swa_stored_ranges = layout.swa_stored_ranges;
    }
    co.swap_space_bytes = options.swap_space_bytes;
    co.store = options.kv_store;
    co.store_uri = options.kv_store_uri;
    co.model_id = options.model_id;
    co.store_dtype = kStoreDtypeF32 + static_cast<uint32_t>(model->kv_dtype());
    co.match_timeout_ms = options.kv_store_match_timeout_ms;
    co.fetch_timeout_ms = options.kv_store_fetch_timeout_ms;
    co.write_queue_bytes = options.kv_store_write_queue_bytes;
    co.fetch_buffer_bytes = options.kv_store_fetch_buffer_bytes;
    co.store_write = options.kv_store_write;
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<kv::TieredCache> cache,
                         kv::TieredCache::create(std::move(co)));
    auto impl = std::make_unique<Impl>(model, std::move(options), env, std::move(cache));
    if (impl->options.kv_landing != nullptr) {
        if (!impl->cache->landing_supported()) {
            DSI_LOG(kInfo) << "kv hand-overs land in the store tier: this cache layout has no "
                              "pool landings (state slots, or prefix caching off)";
        } else if (!impl->options.kv_landing->attach()) {
            DSI_LOG(kWarning) << "kv landing: another engine is attached; this one takes none";
        } else {
            impl->landing_attached = true;
        }
    }
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() {
    // The receiver's asks fail from now on; its writes into the pool end first.
    if (impl_ && impl_->landing_attached) impl_->options.kv_landing->detach();
}

RequestLimits Engine::request_limits() const {
    const Impl& m = *impl_;
    return {m.vocab, m.max_model_len, m.cache->num_pool_blocks(), m.options.tokenizer != nullptr};
}

Status Engine::validate_request(const GenerateRequest& request) const {
    return engine::validate_request(request, request_limits());
}

Status validate_request(const GenerateRequest& request, const RequestLimits& limits) {
    if (request.prompt.empty()) return invalid_argument("prompt is empty");
    for (int32_t t : request.prompt) {
        if (t < 0 || t >= limits.vocab) {
            return invalid_argument("prompt token id " + std::to_string(t) +
                                    " outside the vocabulary");
        }
    }
    DSI_RETURN_IF_ERROR(validate_sampling(request.sampling, limits.vocab));
    if (!request.sampling.stop.empty() && !limits.has_tokenizer) {
        return invalid_argument("stop strings need the engine to have a tokenizer");
    }
    if (request.deadline_ns < 0) return invalid_argument("deadline must be >= 0");
    if (!request.resume_output.empty()) {
        if (request.sampling.n != 1) return invalid_argument("resume_output needs n = 1");
        if (static_cast<int64_t>(request.resume_output.size()) >= request.sampling.max_tokens) {
            return invalid_argument("resume_output must be shorter than max_tokens");
        }
        for (int32_t t : request.resume_output) {
            if (t < 0 || t >= limits.vocab) {
                return invalid_argument("resume_output token id " + std::to_string(t) +
                                        " outside the vocabulary");
            }
        }
    }
    const int64_t len = static_cast<int64_t>(request.prompt.size()) + request.sampling.max_tokens;
    if (len > limits.max_model_len) {
        return out_of_range("prompt (" + std::to_string(request.prompt.size()) +
                            " tokens) + max_tokens (" +
                            std::to_string(request.sampling.max_tokens) +
                            ") exceeds the model length " + std::to_string(limits.max_model_len));
    }
    if (limits.num_pool_blocks >= 0 && blocks_for_tokens(len) > limits.num_pool_blocks) {
        return resource_exhausted("request needs " + std::to_string(blocks_for_tokens(len)) +
                                  " KV blocks; the pool has " +
                                  std::to_string(limits.num_pool_blocks));
    }
    return Status::ok();
}

Result<RequestId> Engine::add_request(GenerateRequest request, StreamCallback callback) {
    Impl& m = *impl_;
    DSI_RETURN_IF_ERROR(validate_request(request));
    const RequestId rid = m.next_request++;
    auto shared = std::make_shared<RequestShared>();
    shared->prompt = std::move(request.prompt);
    shared->sampling = std::move(request.sampling);
    shared->mask = std::move(request.mask);
    RequestState rs;
    rs.req = shared;
    rs.callback = std::move(callback);
    const kv::BlockKey salt = kv::make_salt(m.options.model_id, request.cache_salt);
    const kvstore::TrafficClass traffic =
        request.agent_traffic ? kvstore::TrafficClass::kAgent : kvstore::TrafficClass::kChatbot;
    for (int32_t i = 0; i < shared->sampling.n; ++i) {
        Sequence s;
        s.id = m.next_seq++;
        s.request_id = rid;
        s.index = i;
        s.seed = derive_seed(shared->sampling.seed, i);
        s.req = shared;
        s.deadline_ns = request.deadline_ns;
        s.tokens = shared->prompt;
        s.num_prompt = static_cast<int64_t>(s.tokens.size());
        s.traffic = traffic;
        s.gated = i > 0 && m.options.prefix_cache;
        s.export_kv = request.export_kv && shared->sampling.n == 1;
        if (m.options.tokenizer) {
            s.decoder = std::make_unique<IncrementalDecoder>(*m.options.tokenizer);
            if (!shared->sampling.stop.empty())
                s.stop = std::make_unique<StopMatcher>(shared->sampling.stop);
        }
        // A continuation: the tokens so far are output the host knows, as after a
        // recompute preemption. The text they made was sent by the first engine; what it
        // still held back (a partial character, a possible stop-string prefix) stays
        // held here and goes out with the next tokens, as it would have there.
        for (int32_t t : request.resume_output) {
            s.tokens.push_back(t);
            if (s.decoder) {
                std::string piece = s.decoder->push(t);
                if (s.stop) (void)s.stop->push(piece);
            }
        }
        m.cache->add(s.id, salt, traffic, !request.resume_output.empty());
        rs.seq_ids.push_back(s.id);
        m.seqs.emplace(s.id, std::move(s));
    }
    rs.num_live = shared->sampling.n;
    m.requests.emplace(rid, std::move(rs));
    ++m.stats.num_requests;
    return rid;
}

Status Engine::abort(RequestId id) {
    Impl& m = *impl_;
    auto it = m.requests.find(id);
    if (it == m.requests.end()) return not_found("request " + std::to_string(id) + " is not live");
    const std::vector<int64_t> ids = it->second.seq_ids;
    for (int64_t sid : ids) {
        auto sit = m.seqs.find(sid);
        if (sit != m.seqs.end()) m.finish(sit->second, FinishReason::kAbort, true);
    }
    return Status::ok();
}

Status Engine::step() {
    Impl& m = *impl_;
    DSI_RETURN_IF_ERROR(m.fatal);
    // A speculative plan runs alone: the next plan's positions depend on its drafts.
    const int max_in_flight = m.options.async && m.in_flight_speculative == 0 ? 2 : 1;
    bool submitted = false;
    if (m.in_flight < max_in_flight) {
        DSI_ASSIGN_OR_RETURN(submitted, m.schedule_and_submit());
    }
    m.serve_landing();
    if (m.in_flight > 0 && (m.in_flight == max_in_flight || !submitted)) {
        StepResult r = m.worker.wait();
        --m.in_flight;
        ++m.completed_steps;
        m.post_process(r);
        if (m.landing_attached) m.options.kv_landing->grant_ready(*m.cache, m.completed_steps);
    } else if (!submitted && m.in_flight == 0 && m.cache->num_fetching() > 0) {
        // Only store fetches are pending: wait (briefly, with a deadline) for one.
        m.cache->wait_for_fetch(2);
    }
    if (!has_work()) m.prev_end_ns = 0;  // idle: the next gap is not the host's
    return m.fatal;
}

Status Engine::run() {
    while (has_work()) {
        const int64_t before_steps = impl_->stats.steps;
        const size_t before_seqs = impl_->seqs.size();
        const int before_in_flight = impl_->in_flight;
        DSI_RETURN_IF_ERROR(step());
        // A pending store fetch always ends (done or past its deadline): not a stall.
        if (impl_->stats.steps == before_steps && impl_->seqs.size() == before_seqs &&
            impl_->in_flight == before_in_flight && impl_->cache->num_fetching() == 0) {
            return internal_error("engine made no progress with " + std::to_string(before_seqs) +
                                  " sequences left");
        }
    }
    return Status::ok();
}

bool Engine::has_work() const {
    return !impl_->seqs.empty() || impl_->in_flight > 0 ||
           (impl_->landing_attached && impl_->options.kv_landing->has_asks());
}

Status Engine::idle_check() {
    impl_->serve_landing();
    return Status::ok();
}

EngineStats Engine::stats() const {
    EngineStats s = impl_->stats;
    s.num_live_seqs = static_cast<int64_t>(impl_->seqs.size());
    s.spec_gate_switches = impl_->gate.switches();
    s.spec_gate_probe_steps = {impl_->gate.probe_steps(false), impl_->gate.probe_steps(true)};
    const kv::TieredCacheStats c = impl_->cache->stats();
    s.pool = c.pool;
    s.preemptions_swapped = c.preemptions_swapped;
    s.swapped_out_blocks = c.swapped_out_blocks;
    s.swapped_in_blocks = c.swapped_in_blocks;
    s.swap_slots_held = c.swap_slots_held;
    s.state_slots = impl_->cache->num_state_slots();
    s.expert_parallel = impl_->model->expert_parallel_stats(1);
    s.state_slots_in_use = c.state_slots_in_use;
    s.store_lookups = c.store_lookups;
    s.store_hit_blocks = c.store_hit_blocks;
    s.store_miss_blocks = c.store_miss_blocks;
    s.store_hit_tokens = c.store_hit_tokens;
    s.store_blocks_offered = c.store_blocks_offered;
    s.store_blocks_dropped = c.store_blocks_dropped;
    s.store_blocks_written = c.store_blocks_written;
    s.store_puts_dropped = c.store_puts_dropped;
    s.store_bytes_offered = c.store_bytes_offered;
    s.fetch_count = c.fetch_count;
    s.fetch_sum_ns = c.fetch_sum_ns;
    s.fetch_max_ns = c.fetch_max_ns;
    s.fetch_buffers_allocated = c.fetch_buffers_allocated;
    s.fetch_buffers_in_use = c.fetch_buffers_in_use;
    s.fetch_buffer_leases = c.fetch_buffer_leases;
    s.swa = c.swa;
    s.swa_captures = c.swa_captures;
    s.swa_states_stored = c.swa_states_stored;
    s.swa_states_restored = c.swa_states_restored;
    s.swa_states_rejected = c.swa_states_rejected;
    s.swa_fallback_tokens = c.swa_fallback_tokens;
    return s;
}

Status Engine::check_invariants() const {
    const Impl& m = *impl_;
    for (const auto& [id, s] : m.seqs) {
        if (s.running != (std::find(m.running.begin(), m.running.end(), id) != m.running.end())) {
            return internal_error("sequence " + std::to_string(id) + " running state mismatch");
        }
    }
    return m.cache->check_invariants();
}

}  // namespace dsi::engine
