#include "engine/dp_front.h"

#include <algorithm>
#include <span>
#include <utility>

#include "base/logging.h"

namespace dsi::engine {
namespace {

// Every rank idle while a request is on its way to a rank: poll again after this long.
constexpr int64_t kAllIdlePauseNs = 200'000;
// A front with no model waits this long at most for its ranks' events in one step.
constexpr int64_t kFrontWaitNs = 2'000'000;
// After a finish on another rank, how long the front waits for that rank's report of its
// freed KV blocks (settling()).
constexpr int64_t kSettleNs = 1'000'000'000;

}  // namespace

DpFront::DpFront(Engine* local, CausalLm* model, DpRankLink* link, Env* env, DpRouting routing)
    : local_(local), model_(model), link_(link), env_(env), routing_(std::move(routing)) {}

DpFront::DpFront(DpRankLink* link, RequestLimits limits, bool spread, Env* env, DpRouting routing)
    : link_(link),
      env_(env),
      first_piped_(0),
      limits_(limits),
      spread_(spread),
      routing_(std::move(routing)) {}

DpFront::~DpFront() = default;

void DpFront::learn_local(std::vector<kv::BlockKey> chain) {
    if (local_ == nullptr || !routing_.balance.prefix || chain.empty()) return;
    MutexLock lock(&local_keys_mu_);
    local_keys_.push_back(std::move(chain));
}

void DpFront::take_local_keys() {
    std::vector<std::vector<kv::BlockKey>> chains;
    {
        MutexLock lock(&local_keys_mu_);
        chains.swap(local_keys_);
    }
    for (const std::vector<kv::BlockKey>& chain : chains) balancer_.learn(0, chain);
}

Result<RequestId> DpFront::add_request(GenerateRequest request, StreamCallback callback) {
    DSI_RETURN_IF_ERROR(sync_link());
    take_local_keys();
    // A grammar travels as its portable form, the rank rebuilds the mask (run_dp_rank); a
    // KV export comes back with the finishing event (dp_wire "kv").
    if (local_ == nullptr && request.mask != nullptr && request.mask->portable_form().empty()) {
        return unimplemented("--ep: this request's token mask cannot be rebuilt on a rank");
    }
    // A grammar mask, n > 1 and a KV export keep their state in rank 0's process.
    const bool any_rank = local_ == nullptr ? spread_
                                            : !pipes_.empty() && request.sampling.n == 1 &&
                                                  request.mask == nullptr && !request.export_kv;
    Running run;
    const DpBalancer::Choice choice = pick_rank(any_rank, request);
    run.rank = choice.rank;
    run.callback = std::move(callback);
    run.live = request.sampling.n;
    const RequestId id = next_id_++;
    if (piped(run.rank)) {
        // The same checks the rank would make (same options): errors now, as one engine.
        if (local_ != nullptr) {
            DSI_RETURN_IF_ERROR(local_->validate_request(request));
        } else {
            RequestLimits limits = limits_;
            const int64_t blocks = reports_[static_cast<size_t>(run.rank)].kv_blocks;
            if (limits.num_pool_blocks < 0 && blocks > 0) limits.num_pool_blocks = blocks;
            DSI_RETURN_IF_ERROR(validate_request(request, limits));
        }
        ++remote_requests_;
        if (request.sampling.n > 1) {
            run.finished.assign(static_cast<size_t>(request.sampling.n), false);
        }
        remote_prompt_tokens_ += static_cast<int64_t>(request.prompt.size());
        run.request = request;
    }
    DSI_RETURN_IF_ERROR(start(id, run, std::move(request)));
    count_choice(choice);
    running_.emplace(id, std::move(run));
    return id;
}

std::vector<kv::BlockKey> DpFront::chain_of(const GenerateRequest& request) const {
    if (!routing_.balance.prefix) return {};
    const kv::BlockKey salt = kv::make_salt(routing_.model_id, request.cache_salt);
    if (request.resume_output.empty()) return kv::chain_keys(request.prompt, salt);
    std::vector<int32_t> tokens = request.prompt;
    tokens.insert(tokens.end(), request.resume_output.begin(), request.resume_output.end());
    return kv::chain_keys(tokens, salt);
}

DpBalancer::Choice DpFront::pick_rank(bool any_rank, const GenerateRequest& request) const {
    return balancer_.pick(any_rank, chain_of(request));
}

void DpFront::count_choice(const DpBalancer::Choice& c) {
    prefix_matched_tokens_ += c.matched_blocks * kv::kBlockTokens;
    if (c.reason == DpBalancer::Reason::kPrefix) ++prefix_routed_;
    if (c.reason == DpBalancer::Reason::kOverloaded) ++prefix_overloaded_;
}

void DpFront::learn_finished(Running& run) {
    if (run.chain.empty() && run.tail.empty()) return;
    // The last token's KV is never written (no step ran on it): the rank publishes the
    // full blocks before it.
    if (!run.tail.empty()) run.tail.pop_back();
    const size_t full = run.tail.size() / static_cast<size_t>(kv::kBlockTokens);
    for (size_t b = 0; b < full; ++b) {
        const std::span<const int32_t> block(run.tail.data() + b * kv::kBlockTokens,
                                             static_cast<size_t>(kv::kBlockTokens));
        run.chain.push_back(
            kv::chain_key(run.chain.empty() ? kv::BlockKey{} : run.chain.back(), block, run.salt));
    }
    balancer_.learn(run.rank, run.chain);
}

Status DpFront::start(RequestId id, Running& run, GenerateRequest request) {
    // A re-run continues after the tokens already delivered (S-DEPLOY: nothing twice).
    request.resume_output.insert(request.resume_output.end(), run.delivered.begin(),
                                 run.delivered.end());
    const int64_t kv_tokens =
        static_cast<int64_t>(request.prompt.size() + request.resume_output.size());
    // Prefix routing: the rank will publish these blocks (and the output's, at the end).
    run.chain.clear();
    run.tail.clear();
    std::vector<kv::BlockKey> prompt_chain;  // n > 1: the prompt's only (outputs differ)
    if (routing_.balance.prefix && request.sampling.n > 1) {
        prompt_chain = chain_of(request);
    } else if (routing_.balance.prefix) {
        run.salt = kv::make_salt(routing_.model_id, request.cache_salt);
        run.chain = chain_of(request);
        const size_t full = run.chain.size() * static_cast<size_t>(kv::kBlockTokens);
        for (size_t i = full; i < static_cast<size_t>(kv_tokens); ++i) {
            run.tail.push_back(i < request.prompt.size()
                                   ? request.prompt[i]
                                   : request.resume_output[i - request.prompt.size()]);
        }
    }
    if (!piped(run.rank)) {
        DSI_ASSIGN_OR_RETURN(run.local_id,
                             local_->add_request(std::move(request), local_callback(id)));
    } else {
        // A send to a rank that just died fails; the failover re-runs the request.
        Status s = pipe(run.rank).send(dp_wire::encode_request(id, request));
        if (!s.is_ok()) {
            DSI_LOG(kDebug) << "dp: rank " << run.rank << ": " << s.to_string();
        }
        ++num_remote_;
    }
    run.kv_tokens = kv_tokens;
    balancer_.on_start(run.rank, kv_tokens);
    balancer_.learn(run.rank, prompt_chain.empty() ? run.chain : prompt_chain);
    return Status::ok();
}

StreamCallback DpFront::local_callback(RequestId id) {
    return [this, id](const TokenEvent& ev) { deliver(id, ev); };
}

void DpFront::deliver(RequestId id, const TokenEvent& ev) {
    auto it = running_.find(id);
    if (it == running_.end()) return;
    Running& run = it->second;
    TokenEvent e = ev;
    e.request_id = id;
    if (ev.token >= 0) {
        balancer_.on_token(run.rank);
        ++run.kv_tokens;
        if (!run.chain.empty() || !run.tail.empty()) run.tail.push_back(ev.token);
        if (piped(run.rank)) {
            run.delivered.push_back(ev.token);
            ++remote_output_tokens_;
        }
    }
    if (ev.finished && static_cast<size_t>(ev.index) < run.finished.size()) {
        run.finished[static_cast<size_t>(ev.index)] = true;
    }
    if (!ev.finished || --run.live > 0) {
        if (run.callback) run.callback(e);
        return;
    }
    StreamCallback callback = std::move(run.callback);
    balancer_.on_finish(run.rank, run.kv_tokens);
    learn_finished(run);
    if (piped(run.rank)) {
        settle_until_ns_ = env_->now_ns() + kSettleNs;
        --num_remote_;
        ++remote_finished_;
        remote_cached_tokens_ += ev.cached_prompt_tokens;
    }
    running_.erase(it);
    if (callback) callback(e);
}

Status DpFront::abort(RequestId id) {
    auto it = running_.find(id);
    if (it == running_.end()) return not_found("request " + std::to_string(id) + " is not live");
    Running& run = it->second;
    if (!piped(run.rank)) return local_->abort(run.local_id);
    if (!run.abort_sent) {
        run.abort_sent = true;
        Status s = pipe(run.rank).send(dp_wire::encode_abort(id));
        if (!s.is_ok()) {
            DSI_LOG(kDebug) << "dp: rank " << run.rank << ": " << s.to_string();
        }
    }
    return Status::ok();
}

Status DpFront::sync_link() {
    DpRankLink::Ranks now = link_->current();
    if (now.generation == generation_) return Status::ok();
    const bool restarted = generation_ >= 0;
    std::vector<std::shared_ptr<comm::RankPipe>> old = std::move(pipes_);
    if (restarted) {
        // The old group's ranks have exited (the launcher reaped them before it started
        // the new ones): what they sent has all arrived. Relay it first.
        for (size_t i = 0; i < old.size(); ++i) {
            std::vector<std::string> messages;
            Result<bool> open = old[i]->receive(messages);
            if (!open.is_ok()) {
                DSI_LOG(kWarning) << "dp: rank " << i + 1 << ": " << open.status().to_string();
            }
            for (const std::string& text : messages) {
                Result<dp_wire::Message> m = dp_wire::decode(text);
                if (m.is_ok()) {
                    DSI_RETURN_IF_ERROR(on_message(static_cast<int>(i) + first_piped_, *m));
                }
            }
        }
    }
    generation_ = now.generation;
    pipes_ = std::move(now.pipes);
    const int ranks = num_ranks();
    reports_.assign(static_cast<size_t>(ranks), dp_wire::RankLoad{});
    counters_.assign(static_cast<size_t>(ranks), dp_wire::RankCounters{});
    if (!restarted) {
        balancer_ = DpBalancer(ranks, routing_.balance);
        if (local_ != nullptr) balancer_.set_pool_blocks(0, local_->stats().pool.num_blocks);
        return Status::ok();
    }
    ++failovers_;
    group_stats_.reset();  // the old group's; the new rank 0 reports its own
    balancer_.resize(ranks, /*keep_rank0=*/local_ != nullptr);
    // S-DEPLOY: every request that ran on a lost rank is re-run on the healthy ranks.
    std::vector<RequestId> rerun;
    for (const auto& [id, run] : running_) {
        if (piped(run.rank)) rerun.push_back(id);
    }
    for (RequestId id : rerun) {
        Running& run = running_.at(id);
        // Its rank is gone and the resized balancer has forgotten its load.
        run.kv_tokens = 0;
        --num_remote_;
        if (run.request.sampling.n > 1 && !run.delivered.empty()) {
            // Its completions cannot continue one by one: the unfinished ones end here.
            StreamCallback callback = std::move(run.callback);
            const std::vector<bool> finished = run.finished;
            ++remote_finished_;
            running_.erase(id);
            for (size_t i = 0; i < finished.size(); ++i) {
                if (finished[i] || !callback) continue;
                TokenEvent failed;
                failed.request_id = id;
                failed.index = static_cast<int32_t>(i);
                failed.finished = true;
                failed.reason = FinishReason::kError;
                callback(failed);
            }
            continue;
        }
        const bool all_delivered =
            static_cast<int64_t>(run.request.resume_output.size() + run.delivered.size()) >=
            run.request.sampling.max_tokens;
        if (run.abort_sent || all_delivered) {
            // Aborted, or its last token came and its finish did not: it ends here.
            TokenEvent done;
            done.request_id = id;
            done.finished = true;
            done.reason = run.abort_sent ? FinishReason::kAbort : FinishReason::kLength;
            StreamCallback callback = std::move(run.callback);
            ++remote_finished_;
            running_.erase(id);
            if (callback) callback(done);
            continue;
        }
        const DpBalancer::Choice choice =
            pick_rank(local_ == nullptr ? spread_ : !pipes_.empty(), run.request);
        run.rank = choice.rank;
        count_choice(choice);
        run.live = run.request.sampling.n;
        run.finished.assign(run.finished.size(), false);
        ++reruns_;
        if (!piped(run.rank)) ++remote_finished_;  // rank 0's engine counts it from now on
        DSI_RETURN_IF_ERROR(start(id, run, run.request));
    }
    DSI_LOG(kWarning) << "dp: the group restarted with " << ranks << " ranks; " << rerun.size()
                      << " requests of the lost ranks re-run";
    return Status::ok();
}

Status DpFront::on_message(int rank, dp_wire::Message& m) {
    switch (m.kind) {
        case dp_wire::Message::Kind::kEvent: {
            auto it = running_.find(m.id);
            if (it == running_.end() || it->second.rank != rank) return Status::ok();
            m.event.top_logprobs = m.top_logprobs;
            deliver(m.id, m.event);
            return Status::ok();
        }
        case dp_wire::Message::Kind::kError: {
            // Validated on rank 0 already; a rank refusing it anyway ends it as an error.
            DSI_LOG(kWarning) << "dp: rank " << rank << " refused request " << m.id << ": "
                              << m.error.to_string();
            auto it = running_.find(m.id);
            if (it == running_.end() || it->second.rank != rank) return Status::ok();
            TokenEvent done;
            done.finished = true;
            done.reason = FinishReason::kError;
            deliver(m.id, done);
            return Status::ok();
        }
        case dp_wire::Message::Kind::kLoad:
            if (static_cast<size_t>(rank) < reports_.size()) {
                reports_[static_cast<size_t>(rank)] = m.load;
                counters_[static_cast<size_t>(rank)] = m.counters;
                balancer_.set_pool_blocks(rank, m.load.kv_blocks);
            }
            if (m.ep) group_stats_ = std::move(m.ep);
            return Status::ok();
        default:
            return internal_error("dp: rank " + std::to_string(rank) + " sent a rank-0 message");
    }
}

Status DpFront::poll_pipes(bool* ended, bool* received) {
    for (size_t i = 0; i < pipes_.size(); ++i) {
        comm::RankPipe& p = *pipes_[i];
        if (!p.flush().is_ok()) *ended = true;  // a dead rank is the failover's business
        std::vector<std::string> messages;
        DSI_ASSIGN_OR_RETURN(bool open, p.receive(messages));
        if (!open) *ended = true;
        if (!messages.empty()) *received = true;
        for (const std::string& text : messages) {
            DSI_ASSIGN_OR_RETURN(dp_wire::Message m, dp_wire::decode(text));
            DSI_RETURN_IF_ERROR(on_message(static_cast<int>(i) + first_piped_, m));
        }
    }
    return Status::ok();
}

bool DpFront::settling() const {
    const std::span<const DpBalancer::RankLoad> loads = balancer_.loads();
    const bool freeing = settle_until_ns_ > 0 && env_->now_ns() < settle_until_ns_;
    for (size_t r = static_cast<size_t>(first_piped_); r < reports_.size() && r < loads.size();
         ++r) {
        if (reports_[r].running_seqs != loads[r].running_seqs) return true;
        if (freeing && reports_[r].running_seqs == 0 && reports_[r].kv_blocks_used > 0) {
            return true;
        }
    }
    return false;
}

bool DpFront::ranks_ready() const {
    // Before the first step() has synced with the link there are no reports at all.
    if (reports_.empty() || reports_.size() < static_cast<size_t>(num_ranks())) return false;
    // A rank's pool always has blocks: kv_blocks stays 0 only until its first report.
    for (size_t r = static_cast<size_t>(first_piped_); r < reports_.size(); ++r) {
        if (reports_[r].kv_blocks <= 0) return false;
    }
    return true;
}

Status DpFront::step() {
    DSI_RETURN_IF_ERROR(sync_link());
    take_local_keys();
    bool ended = false, received = false;
    DSI_RETURN_IF_ERROR(poll_pipes(&ended, &received));
    if (local_ == nullptr) {
        DSI_RETURN_IF_ERROR(check_front_ranks(ended));
        if (link_->restarting()) {
            // The old pipes have ended (always readable): pause instead of spinning; the
            // caller's loop goes on (the server's /metrics and queued requests).
            env_->sleep_ns(kFrontWaitNs);
        } else if (!received) {
            comm::RankPipe::wait_any_readable(pipes_, kFrontWaitNs);
        }
        return Status::ok();
    }
    if (local_->has_work()) return local_->step();
    if (num_remote_ == 0 && !settling()) return Status::ok();
    // Requests run elsewhere: join the peers' forward passes (their MoE layers need this
    // rank's experts), or wait a little when nobody stepped.
    DSI_ASSIGN_OR_RETURN(CausalLm::GroupStep s, model_->group_idle_step(/*leaving=*/false));
    switch (s) {
        case CausalLm::GroupStep::kAllIdle:
            env_->sleep_ns(kAllIdlePauseNs);
            return Status::ok();
        case CausalLm::GroupStep::kJoinedPeers:
        case CausalLm::GroupStep::kNotGrouped:  // the group shrank to rank 0: re-run here next
            return Status::ok();
        case CausalLm::GroupStep::kStopped:
            break;
    }
    return internal_error("dp: the group stopped with " + std::to_string(num_remote_) +
                          " requests on other ranks");
}

Status DpFront::check_front_ranks(bool pipe_ended) {
    // S-DEPLOY: a lost rank — rank 0 included — restarts the group; its requests are
    // re-run at once (sync_link).
    DSI_ASSIGN_OR_RETURN(bool restarted, link_->check_ranks(pipe_ended));
    if (restarted) return sync_link();
    return Status::ok();
}

Status DpFront::idle_check() {
    if (local_ != nullptr) return Status::ok();
    DSI_RETURN_IF_ERROR(sync_link());
    bool ended = false, received = false;
    DSI_RETURN_IF_ERROR(poll_pipes(&ended, &received));
    return check_front_ranks(ended);
}

int DpFront::rank_of(RequestId id) const {
    auto it = running_.find(id);
    return it == running_.end() ? -1 : it->second.rank;
}

Status DpFront::reset_ranks(bool async) {
    DSI_RETURN_IF_ERROR(sync_link());
    if (!running_.empty()) {
        return failed_precondition("dp: reset_ranks while " + std::to_string(running_.size()) +
                                   " requests run");
    }
    for (const std::shared_ptr<comm::RankPipe>& p : pipes_) {
        DSI_RETURN_IF_ERROR(p->send(dp_wire::encode_reset(async)));
    }
    // Fresh engines, empty prefix caches (rank 0's caller resets `local` likewise).
    for (int r = 0; r < balancer_.num_ranks(); ++r) balancer_.forget(r);
    return Status::ok();
}

bool DpFront::has_work() const {
    return (local_ != nullptr && local_->has_work()) || num_remote_ > 0 || settling();
}

EngineStats DpFront::stats() const {
    EngineStats s;
    if (local_ != nullptr) {
        s = local_->stats();
    } else {
        // A front: the group's numbers come from rank 0's reports; the ranks now and the
        // restarts are the front's own.
        ExpertParallelStats& ep = s.expert_parallel.emplace();
        if (group_stats_) ep = *group_stats_;
        ep.num_ranks = num_ranks();
        ep.failovers = failovers_;
        ep.restarting = link_->restarting();
        for (size_t r = 0; r < reports_.size(); ++r) {
            s.num_live_seqs += reports_[r].running_seqs;
            s.pool.num_used += reports_[r].kv_blocks_used;
            s.pool.num_blocks += reports_[r].kv_blocks;
        }
    }
    s.num_requests += remote_requests_;
    s.num_finished += remote_finished_;
    s.prompt_tokens += remote_prompt_tokens_;
    s.cached_prompt_tokens += remote_cached_tokens_;
    s.output_tokens += remote_output_tokens_;
    s.dp_reruns = reruns_;
    s.dp_prefix_routed = prefix_routed_;
    s.dp_prefix_matched_tokens = prefix_matched_tokens_;
    s.dp_prefix_overloaded = prefix_overloaded_;
    // The ranks' engine steps: summed (each rank steps its own engine).
    for (size_t r = static_cast<size_t>(first_piped_); r < counters_.size(); ++r) {
        s.steps += counters_[r].steps;
        s.forward_ns += counters_[r].forward_ns;
        s.host_gap_ns += counters_[r].host_gap_ns;
    }
    if (!spread_) return s;  // --ep-attention rank0: no per-rank spread to show
    const std::span<const DpBalancer::RankLoad> loads = balancer_.loads();
    s.dp_ranks.resize(loads.size());
    for (size_t r = 0; r < loads.size(); ++r) {
        EngineStats::DpRank& d = s.dp_ranks[r];
        d.requests = loads[r].requests;
        d.prefix_blocks = balancer_.num_blocks(static_cast<int>(r));
        if (!piped(static_cast<int>(r))) {
            d.running_seqs = s.num_live_seqs;
            d.kv_blocks_used = s.pool.num_used;
            d.kv_blocks = s.pool.num_blocks;
        } else if (r < reports_.size()) {
            d.running_seqs = reports_[r].running_seqs;
            d.kv_blocks_used = reports_[r].kv_blocks_used;
            d.kv_blocks = reports_[r].kv_blocks;
        }
    }
    return s;
}

Status run_dp_rank(Engine& first_engine, CausalLm& model, comm::RankPipe& pipe, Env* env,
                   const ResetEngine& reset_engine, bool report_group_stats,
                   grammar::PortableMaskBuilder* masks) {
    (void)env;
    Engine* engine = &first_engine;
    struct Local {
        RequestId id = 0;  // this engine's
        int32_t live = 1;  // completions not finished (n)
    };
    std::unordered_map<RequestId, Local> engine_id;  // by front id
    // Requests whose mask is being rebuilt (off this thread: the group keeps stepping).
    struct Building {
        RequestId front_id = 0;
        GenerateRequest request;
        std::unique_ptr<grammar::CompileHandle> handle;
    };
    std::vector<Building> building;
    bool ended = false;  // rank 0 sent the end, or is gone
    auto send = [&](const std::string& message) {
        if (!pipe.send(message).is_ok()) ended = true;  // rank 0 is gone
    };
    auto add = [&](RequestId front_id, GenerateRequest request) {
        const int32_t n = request.sampling.n;
        Result<RequestId> id =
            engine->add_request(std::move(request), [&, front_id](const TokenEvent& ev) {
                send(dp_wire::encode_event(front_id, ev));
                auto it = engine_id.find(front_id);
                if (ev.finished && it != engine_id.end() && --it->second.live <= 0) {
                    engine_id.erase(it);
                }
            });
        if (id.is_ok()) {
            engine_id[front_id] = {*id, n};
        } else {
            send(dp_wire::encode_error(front_id, id.status()));
        }
    };
    // Adds the requests whose masks are built (in any order: a request's tokens do not
    // depend on its neighbours); a grammar that does not rebuild fails its request.
    auto add_built = [&] {
        bool added = false;
        for (size_t i = 0; i < building.size();) {
            Building& b = building[i];
            if (!b.handle->ready()) {
                ++i;
                continue;
            }
            grammar::CompileResult built = b.handle->poll();
            if (built.is_ok()) {
                b.request.mask = grammar::PortableMaskBuilder::provider(std::move(built).value());
                add(b.front_id, std::move(b.request));
            } else {
                send(dp_wire::encode_error(b.front_id, built.status()));
            }
            building.erase(building.begin() + static_cast<std::ptrdiff_t>(i));
            added = true;
        }
        return added;
    };
    dp_wire::RankLoad reported{-1, -1, -1};
    int64_t reported_steps = -1;  // report_group_stats: the group steps last reported
    bool changed = true;          // report the load at the start
    for (;;) {
        std::vector<std::string> messages;
        DSI_ASSIGN_OR_RETURN(bool open, pipe.receive(messages));
        if (!open) ended = true;
        changed = changed || !messages.empty();
        for (const std::string& text : messages) {
            DSI_ASSIGN_OR_RETURN(dp_wire::Message m, dp_wire::decode(text));
            const RequestId front_id = m.id;
            switch (m.kind) {
                case dp_wire::Message::Kind::kRequest: {
                    if (!m.has_mask) {
                        add(front_id, std::move(m.request));
                        break;
                    }
                    // S-SO: the grammar the front compiled, rebuilt here over this rank's
                    // vocabulary: the rank samples, so the mask applies here every step.
                    Result<std::unique_ptr<grammar::CompileHandle>> handle =
                        masks != nullptr
                            ? masks->submit(m.mask_form)
                            : unimplemented("this --ep rank cannot rebuild grammar masks");
                    if (!handle.is_ok()) {
                        send(dp_wire::encode_error(front_id, handle.status()));
                        break;
                    }
                    building.push_back({front_id, std::move(m.request), std::move(handle).value()});
                    break;
                }
                case dp_wire::Message::Kind::kAbort: {
                    auto it = engine_id.find(front_id);
                    if (it != engine_id.end()) {
                        const RequestId id = it->second.id;  // the abort's callback erases it
                        (void)engine->abort(id);
                    }
                    auto b = std::find_if(building.begin(), building.end(), [&](const Building& x) {
                        return x.front_id == front_id;
                    });
                    if (b != building.end()) {
                        // Not in the engine yet: its finish is this rank's to send.
                        building.erase(b);
                        TokenEvent aborted;
                        aborted.finished = true;
                        aborted.reason = FinishReason::kAbort;
                        send(dp_wire::encode_event(front_id, aborted));
                    }
                    break;
                }
                case dp_wire::Message::Kind::kEnd:
                    ended = true;
                    break;
                case dp_wire::Message::Kind::kReset: {
                    if (!engine_id.empty() || !building.empty() || !reset_engine) {
                        return internal_error(!reset_engine
                                                  ? "dp: rank 0 sent a reset this rank cannot do"
                                                  : "dp: rank 0 sent a reset while " +
                                                        std::to_string(engine_id.size()) +
                                                        " requests run here");
                    }
                    DSI_ASSIGN_OR_RETURN(engine, reset_engine(m.async));
                    reported = {-1, -1, -1};
                    break;
                }
                default:
                    return internal_error("dp: rank 0 sent a rank message");
            }
        }
        if (!building.empty() && add_built()) changed = true;
        // The load goes out before this rank may wait in an idle step: rank 0 keeps
        // stepping until every rank's report matches what it knows runs there.
        if (changed) {
            const EngineStats st = engine->stats();
            const dp_wire::RankLoad load{st.num_live_seqs, st.pool.num_used, st.pool.num_blocks};
            const dp_wire::RankCounters counters{st.steps, st.forward_ns, st.host_gap_ns};
            std::optional<ExpertParallelStats> group;
            if (report_group_stats) group = model.expert_parallel_stats(1);
            const bool group_changed = group && group->steps != reported_steps;
            if (!(load == reported) || group_changed) {
                send(dp_wire::encode_load(load, counters, group ? &*group : nullptr));
                reported = load;
                if (group) reported_steps = group->steps;
            }
            changed = false;
        }
        if (!pipe.flush().is_ok()) ended = true;
        if (engine->has_work()) {
            DSI_RETURN_IF_ERROR(engine->step());
            changed = true;
            continue;
        }
        // (A request whose mask is still building keeps this rank in the group.)
        DSI_ASSIGN_OR_RETURN(CausalLm::GroupStep step,
                             model.group_idle_step(ended && building.empty()));
        switch (step) {
            case CausalLm::GroupStep::kNotGrouped:
                // The group shrank to this rank (a failover): it runs its requests alone.
                if (ended) return Status::ok();
                pipe.wait_readable(kAllIdlePauseNs);
                break;
            case CausalLm::GroupStep::kStopped:
                return Status::ok();
            case CausalLm::GroupStep::kAllIdle:
                pipe.wait_readable(kAllIdlePauseNs);
                break;
            case CausalLm::GroupStep::kJoinedPeers:
                changed = changed || report_group_stats;  // the group stepped
                break;
        }
    }
}

}  // namespace dsi::engine
