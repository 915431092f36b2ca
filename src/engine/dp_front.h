// Attention data parallelism over the ranks of an --ep group (issue 19 deliverable 1;
// docs/comm.md "Attention data parallelism across the ranks").
//
// Each rank of an expert-parallel group runs its own engine::Engine — its own scheduler,
// block pool (KV) and attention for its own sequences — and every forward pass of any
// rank is a collective in which the MoE layers exchange all ranks' rows
// (model/expert_parallel.h; a rank without tokens joins with zero rows). Requests reach
// the ranks through rank 0:
//   - DpFront (rank 0) is the StepEngine the server / `generate` drive. add_request picks
//     a rank with DpBalancer (engine/dp_balance.h: the rank holding the longest prefix of
//     the prompt in its prefix cache unless too loaded, else the least loaded; it learns
//     each request's chain keys at its start and finish): rank 0 runs it in its own engine,
//     another rank gets it over its comm::RankPipe (engine/dp_wire.h). Each rank streams
//     its token events back over the pipe; step() relays them to the callbacks, steps
//     rank 0's engine when it has work, and otherwise joins the peers' forward passes
//     (CausalLm::group_idle_step) while any request runs elsewhere.
//   - run_dp_rank is the loop of the other ranks: between steps it reads its pipe (new
//     requests, aborts, the end), steps its engine or joins its peers' passes, and sends
//     events and its load (running sequences, KV blocks in use) back.
// Results do not depend on the rank: the kernels are batch invariant, the MoE combine
// sums a token's experts in fixed k order on its home rank, sampling is keyed by (seed,
// position); a request's tokens and logprobs are bitwise those one process gives.
//
// A front with no model (`serve` / `generate --ep N`, docs/comm.md "Rank 0's death"):
// the process the user started holds no weights; every rank, rank 0 included, is a
// started process with a pipe, and DpFront (constructed without a local engine) sends
// every request over one. Any rank may then die without taking the requests with it.
//
// EP failover (S-DEPLOY). With a front: a pipe that ends or a rank process that exits
// makes the front ask the link to restart the group (DpRankLink::check_ranks: the
// launcher reaps the old ranks, sizes the new group with the healthy ones and starts it:
// a new generation); without one (bench offline), rank 0's model restarts the group when a
// rank dies. Either way the ranks of the old group are gone with their sequences. At its
// next step DpFront reads what the old pipes still hold (events sent before the end),
// then re-runs every request that was on a lost rank: as a continuation
// (GenerateRequest::resume_output = the tokens already delivered), so the tokens that
// follow are those the first run would have given and nothing is sent twice or lost.
// With rank 0 here, requests that keep state in its process (a grammar mask, n > 1, KV
// export) run there; so do all requests when the group has one rank. A front sends a
// grammar mask as its portable form (the serialised grammar; the rank rebuilds it:
// run_dp_rank; a mask without one is UNIMPLEMENTED) and gets a KV export back with the
// finishing event (dp_wire), for the serving process's hand-over sender; an n > 1
// request goes to one rank and is re-run only while none of its tokens was delivered
// (else its completions end with kError).
//
// Thread model: DpFront is used by one owner thread (Engine's contract); the link may be
// changed by the thread that runs rank 0's forward passes (the failover), hence its
// lock. run_dp_rank runs on the rank's main thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/env.h"
#include "base/mutex.h"
#include "base/status.h"
#include "comm/rank_pipe.h"
#include "engine/dp_balance.h"
#include "engine/dp_wire.h"
#include "engine/engine.h"
#include "grammar/mask_provider.h"
#include "model/causal_lm.h"

namespace dsi::engine {

// The pipes to the group's ranks, as the launcher (apps/) keeps them.
class DpRankLink {
public:
    struct Ranks {
        int64_t generation = 0;  // bumped at every group restart
        // Rank r's pipe at [r - 1] (a front's rank r at [r]). shared_ptr: the launcher
        // and the front both hold the pipes of a generation; the front still reads the
        // old ones after a restart.
        std::vector<std::shared_ptr<comm::RankPipe>> pipes;
    };
    virtual ~DpRankLink() = default;
    // Any thread.
    virtual Ranks current() const = 0;
    // A front's step (its thread): whether a rank is lost — `pipe_ended` (a pipe reached
    // its end), or a rank process that exited. If so the link restarts the group with the
    // healthy ranks (a new generation; true), or fails with UNAVAILABLE naming the rank
    // (failover off, or no healthy rank). false: every rank is running.
    // A restart may take long (the old ranks' reap waits up to the attach timeout): a
    // link may run it in the background, check_ranks returning false until it is done;
    // meanwhile this is true (the front's thread, as check_ranks).
    virtual Result<bool> check_ranks(bool pipe_ended) {
        (void)pipe_ended;
        return false;
    }
    virtual bool restarting() const { return false; }
};

// How DpFront picks ranks (`--ep-dp-routing`, `--ep-dp-balance-*`: apps/ ep_launch).
struct DpRouting {
    DpBalancer::Options balance;
    // The ranks' EngineOptions::model_id: the prompts' chain keys are salted with it (and
    // each request's cache_salt) as the ranks' prefix index salts theirs.
    std::string model_id = "model";
};

class DpFront final : public StepEngine {
public:
    // REQUIRES: `local` runs over `model` (rank 0 of the group), everything outlives the
    // front, and nobody else uses `local`.
    DpFront(Engine* local, CausalLm* model, DpRankLink* link, Env* env, DpRouting routing = {});
    // A front with no model: every rank (rank 0 included) behind a pipe of `link`.
    // `limits`: the checks the ranks' engines make (num_pool_blocks -1: taken from the
    // ranks' load reports once they arrive). `spread`: requests over all ranks (the
    // balancer), or all on rank 0 (--ep-attention rank0; no per-rank stats then).
    DpFront(DpRankLink* link, RequestLimits limits, bool spread, Env* env, DpRouting routing = {});
    ~DpFront() override;

    Result<RequestId> add_request(GenerateRequest request, StreamCallback callback) override;
    // A request on another rank: the abort is sent there; its finish event (kAbort)
    // arrives in a later step(). NOT_FOUND if unknown or finished.
    Status abort(RequestId id) override;
    Status step() override;
    // Also while a rank's load report still lags what runs there (settling()).
    bool has_work() const override;
    EngineStats stats() const override;
    // A front with no model: reads the pipes and asks the link whether every rank runs
    // (a rank that died while idle restarts the group now). With rank 0 here: nothing
    // (its group steps find a lost peer).
    Status idle_check() override;
    // Every rank with a pipe has sent its first load report: its model is loaded, its
    // group attached and its engine runs. `generate --ep` steps the front until then
    // before it starts its clock (the ranks load in parallel after the front starts them).
    bool ranks_ready() const;
    // The rank running request `id` now; -1 once it finished (logs, tests).
    int rank_of(RequestId id) const;
    // Benchmarks (`bench offline --ep N`): every other rank starts a fresh engine (empty
    // prefix cache, the async step loop on or off) before the requests that follow, as
    // rank 0's caller does with `local`; the balancer forgets every rank's prefixes.
    // FAILED_PRECONDITION while a request runs.
    Status reset_ranks(bool async);
    // Rank 0 (here) holds the blocks of `chain` now -- a KV hand-over its inbox put into
    // its pool or store tier (`serve --ep N --ep-front off --role decode`): the prefix
    // rule sends the continuation there. Any thread; taken in at the next add_request or
    // step. A no-op for a front with no model, or without the prefix rule.
    void learn_local(std::vector<kv::BlockKey> chain) DSI_EXCLUDES(local_keys_mu_);

private:
    struct Running {
        int rank = 0;
        RequestId local_id = 0;   // rank 0's engine id (rank == 0)
        GenerateRequest request;  // as added (another rank: for a re-run)
        StreamCallback callback;
        int32_t live = 1;                // completions not finished (n)
        std::vector<int32_t> delivered;  // tokens relayed (another rank)
        std::vector<bool> finished;      // per completion (n > 1 on another rank)
        int64_t kv_tokens = 0;           // counted in the balancer
        bool abort_sent = false;
        // Prefix routing (n == 1): the chain keys of the tokens run so far, and the tokens
        // after its last full block (output appended as it comes): the balancer learns
        // prompt + output at the finish, as the rank publishes them.
        std::vector<kv::BlockKey> chain;
        std::vector<int32_t> tail;
        kv::BlockKey salt;
    };
    // The full-block chain keys of prompt + resume_output as the ranks key them (empty
    // without the prefix rule).
    std::vector<kv::BlockKey> chain_of(const GenerateRequest& request) const;
    // A request ends on run.rank: the balancer learns its tokens' chain.
    void learn_finished(Running& run);
    // The balancer's choice for `request`; count_choice adds a started one to the stats.
    DpBalancer::Choice pick_rank(bool any_rank, const GenerateRequest& request) const;
    void count_choice(const DpBalancer::Choice& c);
    // Relays the events of a restarted group's old ranks, then re-runs their requests.
    Status sync_link();
    // Relays every pipe's events; `ended`: a pipe reached its end (a rank died).
    Status poll_pipes(bool* ended, bool* received);
    // A front: asks the link whether a rank died (`pipe_ended`: a pipe reached its end)
    // and, if the group restarted, re-runs the lost requests.
    Status check_front_ranks(bool pipe_ended);
    bool piped(int rank) const { return rank >= first_piped_; }
    comm::RankPipe& pipe(int rank) { return *pipes_[static_cast<size_t>(rank - first_piped_)]; }
    int num_ranks() const { return static_cast<int>(pipes_.size()) + first_piped_; }
    Status on_message(int rank, dp_wire::Message& m);
    // Runs `request` (run.request or the added one) on run.rank, continuing after the
    // tokens already delivered.
    Status start(RequestId id, Running& run, GenerateRequest request);
    // To the caller's callback; the last finish ends the request.
    void deliver(RequestId id, const TokenEvent& ev);
    StreamCallback local_callback(RequestId id);
    // A rank's last load report does not show the sequences rank 0 knows run there yet
    // (a finish or a start not reported): keep stepping (and joining the group, where a
    // dead rank is seen) until it does, so /metrics shows every rank's KV as it is.
    // Also, for a short while after a finish on another rank, while a rank that runs
    // nothing still reports KV blocks in use (an async engine frees them a step later).
    bool settling() const;

    Engine* local_ = nullptr;  // null: a front with no model
    CausalLm* model_ = nullptr;
    DpRankLink* link_;
    Env* env_;
    int first_piped_ = 1;   // the first rank behind a pipe: 0 for a front
    RequestLimits limits_;  // a front's request checks
    bool spread_ = true;
    // Until when settling() waits for freed KV blocks (a finish on another rank).
    int64_t settle_until_ns_ = 0;
    int64_t failovers_ = 0;                           // a front's group restarts
    std::optional<ExpertParallelStats> group_stats_;  // a front's, from rank 0's reports
    int64_t generation_ = -1;
    std::vector<std::shared_ptr<comm::RankPipe>> pipes_;
    std::vector<dp_wire::RankLoad> reports_;  // [num ranks], index 0 unused
    std::vector<dp_wire::RankCounters> counters_;  // [num ranks], as reports_
    DpRouting routing_;
    DpBalancer balancer_{1};
    // learn_local's chains, for the owner thread (take_local_keys).
    void take_local_keys() DSI_EXCLUDES(local_keys_mu_);
    Mutex local_keys_mu_;
    std::vector<std::vector<kv::BlockKey>> local_keys_ DSI_GUARDED_BY(local_keys_mu_);
    // Prefix routing (stats): requests the longest match moved off the load rule's pick,
    // its full-block tokens predicted on the chosen ranks, and the matches passed over
    // for load (the matched rank was too loaded).
    int64_t prefix_routed_ = 0, prefix_matched_tokens_ = 0, prefix_overloaded_ = 0;
    RequestId next_id_ = 1;
    std::unordered_map<RequestId, Running> running_;
    int64_t num_remote_ = 0;  // running on other ranks
    // Totals of the other ranks' requests (rank 0's engine counts its own).
    int64_t remote_requests_ = 0, remote_finished_ = 0, remote_prompt_tokens_ = 0,
            remote_cached_tokens_ = 0, remote_output_tokens_ = 0, reruns_ = 0;
};

// Replaces a rank's engine with a fresh one over the same model (DpFront::reset_ranks);
// returns it. The old one is gone when it returns.
using ResetEngine = std::function<Result<Engine*>(bool async)>;

// The loop of rank r > 0 of a data-parallel group: runs the requests its pipe brings
// until rank 0 sends the end (or is gone) and every rank has left. Errors: the group's
// (UNAVAILABLE when a peer died), a broken pipe message (INTERNAL; also a reset while a
// request runs, or without `reset_engine`). REQUIRES: `engine` runs over `model`.
// `report_group_stats` (rank 0 of a front's group): its load reports carry the group's
// ExpertParallelStats after every group step (the front has no model to ask). A rank
// whose group shrank to itself (no group) runs its requests alone.
// `masks`: rebuilds the grammar masks requests bring (dp_wire "mask": the grammar the
// front compiled, serialised) over this rank's vocabulary, off this thread: the request
// enters the engine once its mask is built, and the rank samples under it every step
// (S-SO; a continuation's mask replays the grammar over its resume_output). nullptr:
// such requests fail (UNIMPLEMENTED, back to the front).
Status run_dp_rank(Engine& engine, CausalLm& model, comm::RankPipe& pipe, Env* env,
                   const ResetEngine& reset_engine = nullptr, bool report_group_stats = false,
                   grammar::PortableMaskBuilder* masks = nullptr);

}  // namespace dsi::engine
