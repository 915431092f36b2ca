#include "engine/worker.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/clock.h"

namespace dsi::engine {

Worker::Worker(CausalLm* model, kv::BlockPool* pool, bool record_logits,
               int64_t swap_in_layer_delay_us, std::shared_ptr<spec::Drafter> drafter, int spec_k,
               std::shared_ptr<const spec::VerifyCostCurve> varlen_cost, spec::Acceptance rule)
    : model_(model),
      pool_(pool),
      record_logits_(record_logits),
      swap_in_layer_delay_us_(swap_in_layer_delay_us),
      vocab_(model->config().vocab_size),
      eos_(static_cast<int32_t>(model->config().eos_token_id)),
      state_bytes_(model->kv_layout().state_floats * static_cast<int64_t>(sizeof(float))),
      drafter_(std::move(drafter)),
      spec_k_(spec_k),
      varlen_cost_(std::move(varlen_cost)),
      rule_(rule),
      varlen_k_(spec_k) {
    const int64_t row_bytes = model->config().hidden_size * static_cast<int64_t>(sizeof(float));
    max_pending_rows_ = std::max<int64_t>(256, kMaxPendingBytes / std::max<int64_t>(row_bytes, 1));
}

Worker::~Worker() { stop(); }

void Worker::start() {
    thread_ = std::thread([this] { loop(); });
}

void Worker::stop() {
    if (!thread_.joinable()) return;
    {
        MutexLock l(&mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void Worker::submit(StepPlan plan) {
    if (!thread_.joinable()) {
        StepResult r = execute(plan);
        MutexLock l(&mu_);
        done_.push_back(std::move(r));
        return;
    }
    {
        MutexLock l(&mu_);
        todo_.push_back(std::move(plan));
    }
    cv_.notify_all();
}

StepResult Worker::wait() {
    MutexLock l(&mu_);
    // No deadline: a step always ends (the forward pass has no unbounded wait; a
    // swap-in layer wait aborts after 60 s, kv/paged_kv_cache.h).
    while (done_.empty()) cv_.wait(&mu_);
    StepResult r = std::move(done_.front());
    done_.pop_front();
    return r;
}

void Worker::loop() {
    while (true) {
        StepPlan plan;
        {
            MutexLock l(&mu_);
            while (!stop_ && todo_.empty()) cv_.wait(&mu_);
            if (todo_.empty()) return;  // stop_ and drained
            plan = std::move(todo_.front());
            todo_.pop_front();
        }
        StepResult r = execute(plan);
        {
            MutexLock l(&mu_);
            done_.push_back(std::move(r));
        }
        cv_.notify_all();
    }
}

StepResult Worker::execute(StepPlan& plan) {
    StepResult r;
    r.start_ns = steady_clock_ns();
    const int64_t cpu_start_ns = thread_cpu_ns();
    for (int64_t id : plan.release) seqs_.erase(id);
    // Preemption by swapping: save the victims' rows before anything in this step
    // can overwrite their blocks, then restore the resumed sequences' rows.
    for (const kv::HostCopy& c : plan.save) kv::copy_block_to_host(*pool_, c);
    for (StepItem& it : plan.items) {
        for (const kv::HostCopy& c : it.restore) kv::copy_block_from_host(*pool_, c);
        if (it.swa_restore != nullptr) {
            // A stored SWA state (its slot bytes, then the seal) resumes the sequence.
            DSI_CHECK(it.cache.state() != nullptr &&
                      it.swa_restore->bytes.size() >= static_cast<size_t>(state_bytes_));
            std::memcpy(it.cache.state(), it.swa_restore->bytes.data(),
                        static_cast<size_t>(state_bytes_));
            it.swa_restore.reset();
        }
    }
    steps_.clear();
    inputs_.resize(plan.items.size());
    for (size_t i = 0; i < plan.items.size(); ++i) {
        StepItem& it = plan.items[i];
        if (it.init) {
            WorkerSeq ws;
            ws.req = it.req;
            ws.params = it.req->sampling;
            ws.params.seed = it.seed;
            ws.output = std::move(it.output);
            ws.epoch = it.epoch;
            seqs_[it.seq_id] = std::move(ws);
        }
        WorkerSeq& ws = seqs_.at(it.seq_id);
        DSI_CHECK_EQ(ws.epoch, it.epoch);
        std::span<const int32_t> toks = it.tokens;
        if (toks.empty()) {
            // S-ASYNC: the decode input is the token this worker sampled last; it
            // never goes through the host. (A token of -1 ended the sequence; the
            // host drops this result.)
            // With speculation the drafts follow it (verified in one pass).
            inputs_[i].assign(1, std::max(ws.last, 0));
            inputs_[i].insert(inputs_[i].end(), it.drafts.begin(), it.drafts.end());
            toks = inputs_[i];
        }
        SequenceStep st{toks, it.start_pos, &it.cache, !it.drafts.empty()};
        if (!it.replay.empty()) {
            // S-SWA: the replayed unit first, then the step's own tokens.
            inputs_[i].assign(it.replay.begin(), it.replay.end());
            inputs_[i].insert(inputs_[i].end(), toks.begin(), toks.end());
            st.tokens = inputs_[i];
            st.start_pos = it.start_pos - static_cast<int64_t>(it.replay.size());
            st.replay_end = it.start_pos;
            st.context = it.replay_context;
        }
        st.decoder_begin = it.decoder_begin;
        steps_.push_back(st);
    }
    // S-KV-6: copy fetched blocks layer by layer on a swap-in thread while the
    // forward pass runs; attention on those rows waits for its layer.
    kv::LayerGate gate;
    std::thread swapper;
    int64_t swap_start_ns = 0;
    std::atomic<int64_t> swap_end_ns{0};
    bool any_swap = false;
    for (StepItem& it : plan.items) {
        if (it.swap_in.blocks.empty()) continue;
        any_swap = true;
        it.cache.set_gate(&gate, it.swap_in.begin_pos, it.swap_in.end_pos());
        r.swap_in_blocks += static_cast<int64_t>(it.swap_in.blocks.size());
    }
    if (any_swap) {
        swap_start_ns = steady_clock_ns();
        if (pool_->groups().size() > 1) {
            // Several cache groups (V4): the model reads them through entry(), which the
            // gate does not guard; copy every layer before the forward pass.
            swap_in_layers(plan, gate);
            swap_end_ns.store(steady_clock_ns(), std::memory_order_release);
        } else {
            swapper = std::thread([&] {
                swap_in_layers(plan, gate);
                swap_end_ns.store(steady_clock_ns(), std::memory_order_release);
            });
            // Counted: this forward pass starts before the last layer has arrived.
            if (gate.ready() < pool_->groups()[0].num_layers) {
                for (const StepItem& it : plan.items) {
                    r.swap_in_overlapped += !it.swap_in.blocks.empty();
                }
            }
        }
    }
    r.status = model_->forward_batch(steps_, out_);
    if (any_swap) {
        if (swapper.joinable()) swapper.join();
        r.swap_in_ns = swap_end_ns.load(std::memory_order_acquire) - swap_start_ns;
        r.swap_in_wait_ns = gate.wait_ns();
        for (const StepItem& it : plan.items) {
            for (const kv::SwapIn& sw : it.swap_in.blocks)
                r.swap_in_bytes += static_cast<int64_t>(sw.data->payload().size());
        }
    }
    if (r.status.is_ok()) {
        for (size_t i = 0; i < plan.items.size(); ++i) {
            r.items.push_back(sample_item(plan.items[i], i));
            StepItem& it = plan.items[i];
            if (it.swa_capture_position > 0) {
                // S-KV-9: the slot right after the step that ends at the store position
                // (before any later step writes it): exact, lateness 0.
                const auto* src = reinterpret_cast<const uint8_t*>(it.cache.state());
                r.items.back().swa_state.assign(src, src + state_bytes_);
            }
        }
        if (drafter_ != nullptr) r.status = draft(plan, r);
        r.speculative = plan.draft || std::any_of(plan.items.begin(), plan.items.end(),
                                                  [](const StepItem& it) { return !it.drafts.empty(); });
    }
    r.end_ns = steady_clock_ns();
    const int64_t cpu_end_ns = thread_cpu_ns();
    r.cpu_ns = cpu_start_ns >= 0 && cpu_end_ns >= 0 ? cpu_end_ns - cpu_start_ns : -1;
    return r;
}

ItemResult Worker::sample_item(StepItem& it, size_t i) {
    ItemResult ir;
    ir.seq_id = it.seq_id;
    ir.epoch = it.epoch;
    ir.num_tokens = static_cast<int64_t>(steps_[i].tokens.size() - it.replay.size());
    ir.num_kept = ir.num_tokens;
    if (!it.sample) return ir;
    WorkerSeq& ws = seqs_.at(it.seq_id);
    const size_t num_rows = it.drafts.size() + 1;
    std::span<const float> rows(out_.logits.data() + out_.logit_row[i] * vocab_,
                                num_rows * static_cast<size_t>(vocab_));
    // Row j predicts the token at start_pos + num_tokens - drafts + j. Without drafts
    // this is the plain sampling of one position.
    spec::VerifyInput in{rows,
                         vocab_,
                         it.drafts,
                         static_cast<uint64_t>(it.start_pos + ir.num_tokens) - it.drafts.size(),
                         ws.req->prompt,
                         eos_,
                         ws.req->mask.get(),
                         rule_};
    spec::verify_exact(sampler_, in, ws.params, ws.output, verified_);
    if (varlen_cost_ != nullptr && !it.drafts.empty()) observe_acceptance(it, ws, verified_);
    ir.sampled = true;
    ir.num_drafts = static_cast<int32_t>(it.drafts.size());
    ir.num_accepted = verified_.accepted;
    // Rows kept: the prompt/input rows and one per emitted token after the first (each
    // accepted draft that another token follows). Rows of rejected drafts — and of a
    // matched draft that ended the sequence — are rolled back (rewritten later).
    ir.num_kept = ir.num_tokens - ir.num_drafts + static_cast<int64_t>(verified_.tokens.size()) - 1;
    ws.last = verified_.tokens.back().token;
    if (record_logits_) {
        ir.logits.assign(
            rows.begin(),
            rows.begin() + static_cast<std::ptrdiff_t>(verified_.tokens.size()) * vocab_);
    }
    ir.tokens = std::move(verified_.tokens);
    return ir;
}

Status Worker::draft(StepPlan& plan, StepResult& r) {
    const bool hidden = drafter_->uses_hidden();
    // Not drafting this step: the MTP drafter's catch-up (its KV rows, k = 0) is
    // deferred (WorkerSeq::pending_hidden), so that its cache is whole when drafting
    // resumes.
    if (!plan.draft && !hidden) return Status::ok();
    const int64_t H = model_->config().hidden_size;
    draft_in_.clear();
    draft_k_.clear();
    draft_item_.clear();
    catchup_in_.clear();
    int64_t hidden_offset = 0;  // the item's first row in the step's hidden states
    for (size_t i = 0; i < plan.items.size(); ++i) {
        StepItem& it = plan.items[i];
        ItemResult& ir = r.items[i];
        const int64_t offset = hidden_offset;
        hidden_offset += ir.num_tokens;
        if (!hidden && !it.sample) continue;
        if (ir.sampled && ir.tokens.back().token < 0) continue;  // ended
        WorkerSeq& ws = seqs_.at(it.seq_id);
        spec::DraftInput in;
        in.prompt = ws.req->prompt;
        in.output = ws.output;
        if (hidden) {
            const std::span<const float> rows =
                std::span<const float>(out_.hidden)
                    .subspan(static_cast<size_t>(offset * H), static_cast<size_t>(ir.num_kept * H));
            const bool defer = !plan.draft && ws.pending_rows + ir.num_kept < max_pending_rows_;
            if (defer) {
                if (ws.pending_rows == 0) ws.pending_pos = it.start_pos;
                DSI_CHECK_EQ(ws.pending_pos + ws.pending_rows, it.start_pos);
                ws.pending_hidden.insert(ws.pending_hidden.end(), rows.begin(), rows.end());
                ws.pending_rows += ir.num_kept;
                ir.mtp_pending_rows = ws.pending_rows;
                continue;
            }
            if (ws.pending_rows > 0) {
                // The deferred rows first, in a call of their own (KV rows only): its
                // time is what a switch of the gate costs per row.
                DSI_CHECK_EQ(ws.pending_pos + ws.pending_rows, it.start_pos);
                spec::DraftInput up = in;
                up.hidden = ws.pending_hidden;  // cleared after the drafter ran
                up.hidden_pos = ws.pending_pos;
                up.cache = &it.cache;
                catchup_in_.push_back(up);
            }
            in.hidden = rows;
            in.hidden_pos = it.start_pos;
            in.cache = &it.cache;
        }
        draft_in_.push_back(in);
        int k = it.sample && plan.draft ? spec_k_ : 0;
        if (varlen_cost_ != nullptr && k > 0) k = varlen_k_;
        draft_k_.push_back(k);
        draft_item_.push_back(i);
    }
    if (!catchup_in_.empty()) {
        catchup_k_.assign(catchup_in_.size(), 0);
        catchup_out_.resize(catchup_in_.size());
        const int64_t t0 = steady_clock_ns();
        DSI_RETURN_IF_ERROR(drafter_->propose_batch(catchup_in_, catchup_k_, catchup_out_, {}));
        r.deferred_catchup_ns = steady_clock_ns() - t0;
        for (const spec::DraftInput& in : catchup_in_) {
            r.deferred_catchup_rows +=
                static_cast<int64_t>(in.hidden.size()) / std::max<int64_t>(H, 1);
        }
        r.draft_ns += r.deferred_catchup_ns;
        r.draft_catchup_rows += r.deferred_catchup_rows;
        for (size_t d = 0; d < draft_item_.size(); ++d) {
            WorkerSeq& ws = seqs_.at(plan.items[draft_item_[d]].seq_id);
            ws.pending_hidden.clear();
            ws.pending_rows = 0;
        }
    }
    if (draft_in_.empty()) return Status::ok();
    draft_out_.resize(draft_in_.size());
    draft_probs_.resize(varlen_cost_ != nullptr ? draft_in_.size() : 0);
    const int64_t t0 = steady_clock_ns();
    DSI_RETURN_IF_ERROR(drafter_->propose_batch(draft_in_, draft_k_, draft_out_, draft_probs_));
    const int64_t ns = steady_clock_ns() - t0;
    r.draft_ns += ns;
    for (const spec::DraftInput& in : draft_in_) {
        r.draft_catchup_rows += static_cast<int64_t>(in.hidden.size()) / std::max<int64_t>(H, 1);
    }
    const bool drafted = std::any_of(draft_k_.begin(), draft_k_.end(), [](int k) { return k > 0; });
    // What a speculating step's drafting costs (the deferred catch-up is not part of it:
    // counting it would make every draft look cheap next to it — DSpark verified ~55
    // drafts a step at 64 sequences after a switch).
    if (varlen_cost_ != nullptr && drafted) {
        draft_ns_ = draft_ns_ == 0 ? static_cast<double>(ns)
                                   : 0.8 * draft_ns_ + 0.2 * static_cast<double>(ns);
    }
    if (!drafted) return Status::ok();
    for (size_t d = 0; d < draft_item_.size(); ++d) {
        const WorkerSeq& ws = seqs_.at(plan.items[draft_item_[d]].seq_id);
        if (ws.req->mask != nullptr) cut_forbidden_drafts(ws, draft_out_[d]);
    }
    if (varlen_cost_ != nullptr) choose_lengths(plan, r);
    for (size_t d = 0; d < draft_item_.size(); ++d) {
        r.items[draft_item_[d]].next_drafts = std::move(draft_out_[d]);
    }
    return Status::ok();
}

void Worker::observe_acceptance(const StepItem& it, const WorkerSeq& ws, const spec::Verified& v) {
    // Every draft up to the first rejected one was verified; drafts after a token that
    // ended the sequence were not. A draft without a recorded probability (none
    // proposed by this worker, e.g. after a restart of the sequence) counts as none.
    auto prob = [&](size_t j) {
        return j < ws.draft_probs.size() ? ws.draft_probs[j] : std::nanf("");
    };
    const size_t accepted = static_cast<size_t>(v.accepted);
    for (size_t j = 0; j < accepted; ++j) estimator_.observe(static_cast<int>(j), prob(j), true);
    if (accepted < it.drafts.size() && v.tokens.size() == accepted + 1 &&
        v.tokens.back().token != it.drafts[accepted]) {
        estimator_.observe(static_cast<int>(accepted), prob(accepted), false);
    }
}

int64_t Worker::choose_lengths(const StepPlan& plan, StepResult& r) {
    // The next step is assumed to decode the sequences this one sampled (S-SPEC: the
    // decision uses the latest confidences; the loop is synchronous with speculation,
    // so it is taken right here). The curve prices rows with logits (profiled with a
    // logits row per token), so prefill chunks, which have none, are left out: they
    // cost the same whatever is verified beside them.
    int64_t sampled = 0;
    for (const StepItem& it : plan.items) sampled += it.sample ? 1 : 0;
    const int64_t base = sampled;
    draft_accept_.resize(draft_item_.size());
    varlen_in_.clear();
    for (size_t d = 0; d < draft_item_.size(); ++d) {
        std::vector<double>& acc = draft_accept_[d];
        acc.clear();
        for (size_t j = 0; j < draft_out_[d].size(); ++j) {
            const float p = j < draft_probs_[d].size() ? draft_probs_[d][j] : std::nanf("");
            acc.push_back(estimator_.optimistic(static_cast<int>(j), p));
        }
        varlen_in_.push_back({acc});
    }
    const int64_t base_tokens = std::max<int64_t>(base, static_cast<int64_t>(draft_item_.size()));
    spec::VarlenChoice choice = spec::choose_verify_lengths(
        varlen_in_, base_tokens, std::max<int64_t>(sampled, 1), *varlen_cost_, draft_ns_);
    const bool pays = choice.pays;
    if (!pays) {
        // Speculating does not pay on the curve even with the best N: the drafts in hand
        // are spent, so verify only those that pay for their own rows (none where a
        // verified row costs what a decoded one does, i.e. at large batches). N chosen
        // with the drafting cost would make a step that speculates anyway (a probe of
        // the gate) verify dozens of drafts to spread that cost.
        choice = spec::choose_verify_lengths(varlen_in_, base_tokens, std::max<int64_t>(sampled, 1),
                                             *varlen_cost_, 0);
    }
    int64_t cut = 0;
    int longest = 0;
    for (int len : choice.lengths) longest = std::max(longest, len);
    varlen_k_ = std::min(spec_k_, longest + 1);
    const bool any_drafts = std::any_of(draft_out_.begin(), draft_out_.end(),
                                        [](const std::vector<int32_t>& d) { return !d.empty(); });
    if (any_drafts && !pays) {
        // Drafting and verifying cost more than they yield on the curve: draft one token
        // next time (the cheapest probe). Whether speculating pays at all, with the
        // loop's own costs, the engine's SpecGate measures (S-SPEC: off where it does
        // not pay).
        varlen_k_ = 1;
    }
    for (size_t d = 0; d < draft_item_.size(); ++d) {
        const size_t keep = static_cast<size_t>(choice.lengths[d]);
        std::vector<int32_t>& drafts = draft_out_[d];
        const int32_t n = static_cast<int32_t>(drafts.size() - std::min(keep, drafts.size()));
        r.items[draft_item_[d]].drafts_cut = n;
        cut += n;
        drafts.resize(std::min(keep, drafts.size()));
        std::vector<float>& probs = draft_probs_[d];
        probs.resize(std::min(probs.size(), drafts.size()));
        seqs_.at(plan.items[draft_item_[d]].seq_id).draft_probs = probs;
    }
    return cut;
}

void Worker::cut_forbidden_drafts(const WorkerSeq& ws, std::vector<int32_t>& drafts) {
    // Structured output: a draft the grammar forbids after the output and the drafts
    // before it would be rejected; it and everything after it are never proposed.
    draft_context_ = ws.output;
    for (size_t j = 0; j < drafts.size(); ++j) {
        draft_mask_.reset(vocab_, true);
        ws.req->mask->fill(draft_context_, draft_mask_);
        if (!draft_mask_.allowed(drafts[j])) {
            drafts.resize(j);
            return;
        }
        draft_context_.push_back(drafts[j]);
    }
}

void Worker::swap_in_layers(StepPlan& plan, kv::LayerGate& gate) {
    const int64_t num_layers = kv::num_store_layers(*pool_);  // what the store holds
    for (int64_t l = 0; l < num_layers; ++l) {
        if (swap_in_layer_delay_us_ > 0)
            std::this_thread::sleep_for(std::chrono::microseconds(swap_in_layer_delay_us_));
        for (StepItem& it : plan.items) {
            for (const kv::SwapIn& sw : it.swap_in.blocks) kv::copy_fetched_layer(*pool_, sw, l);
        }
        gate.set_ready(l + 1);
    }
}

}  // namespace dsi::engine
