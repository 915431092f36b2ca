// DSpark-style variable-length verification (SPEC S-SPEC, issue 24): each step verifies
// the prefix subset of every request's drafts that maximises expected output tokens per
// unit of step time.
//
// Three pure parts, used by the engine's worker (engine/worker.cc) and by tests and the
// simulator alike (no clock, no model):
//   - AcceptanceEstimator: the chance that draft j of a request is accepted given that
//     the drafts before it were, from the drafter's own probability of the token (the
//     MTP head's softmax; none for n-gram) recalibrated online against what
//     verification observed (per draft position and probability bin), with an
//     exploration bonus for bins seldom observed;
//   - VerifyCostCurve: step time as a function of the tokens a step runs, profiled on
//     the machine (engine/calibrate.h, `dsinfer calibrate`), piecewise linear;
//   - choose_verify_lengths: survival s(i, j) = product of the conditional estimates of
//     drafts 1..j of request i; all (i, j) slots sorted by survival (a request's
//     survivals never grow with j, so every top-N set is a prefix of each request's
//     drafts: cumulative product, global sort, top-N, remap); the N that maximises
//     (requests + sum of the top-N survivals) / time(base tokens + N) wins. N = 0 when no
//     draft pays, so speculation switches itself off where verifying costs more than it
//     yields.
//   - SpecGate: whether the engine speculates at all, per batch size, from the output
//     rate it measured in each mode (speculating runs the loop synchronously; not
//     speculating runs it asynchronously, which the cost curve cannot price): each mode
//     is measured in short probes, the faster one is held for a doubling number of steps.
// With the exact acceptance rule (spec/verify.h) the output does not depend on how many
// drafts are verified: only speed changes.
//
// Thread model: none of these is thread-safe; the worker owns the first three, the
// engine's host side the gate.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "spec/drafter.h"

namespace dsi::spec {

class AcceptanceEstimator {
public:
    static constexpr int kProbBins = 10;
    // Weight of the prior (the drafter's probability, or 0.5 without one) in
    // pseudo-observations; counts of a bin are halved once they reach kWindow, so the
    // estimate follows a drifting acceptance rate.
    static constexpr double kPriorWeight = 4.0;
    static constexpr double kWindow = 512.0;

    // Conditional acceptance estimate of the draft at position j (0-based) whose drafter
    // probability is `prob` (NaN or < 0: none). In [0, 1]. The prior of a bin is the
    // drafter's probability scaled by position j's observed calibration (accepted /
    // sum of the probabilities of the drafts observed there, shrunk towards 1); without
    // a probability, the estimate of position j - 1 (0.5 at j = 0).
    double estimate(int j, float prob) const;
    // What the verification choice uses: the estimate plus an exploration bonus while
    // position j (all bins) has fewer than kExploreObservations observations,
    // min(1, estimate + kExplore / sqrt(n_j + 1)); the estimate alone after that. A
    // position never tried gets +0.5, so it is tried before it is judged; deep positions
    // are tried only as often as the survival of the drafts before them makes them worth
    // it; the bonus ends, so a choice between near-certain drafts and a loaded step is
    // made on the estimates (an optimistic 1.0 would make every draft look free).
    static constexpr double kExplore = 0.5;
    static constexpr double kExploreObservations = 32;
    double optimistic(int j, float prob) const;
    // Verification outcome of one drafted token that was verified (every draft up to and
    // including the first rejected one).
    void observe(int j, float prob, bool accepted);

    // For tests and metrics: observations and acceptances held for (j, prob)'s bin.
    double observed(int j, float prob) const { return bin(j, prob).n; }

private:
    struct Bin {
        double n = 0;
        double accepted = 0;
    };
    static int bin_index(float prob);
    struct Position {
        double n = 0;              // observations at this position (every bin)
        double prob_sum = 0;       // sum of the drafter probabilities given with them
        double prob_accepted = 0;  // acceptances of the drafts that had one
    };
    static int position(int j);
    const Bin& bin(int j, float prob) const;
    Bin& bin(int j, float prob);
    // [position][probability bin; the last one: no probability]
    std::array<std::array<Bin, kProbBins + 1>, kMaxSpeculativeTokens> bins_{};
    std::array<Position, kMaxSpeculativeTokens> positions_{};
};

// Step time (ns) against the tokens a step runs (prefill chunks, decodes and their
// drafts together): points measured at increasing token counts, linear between them,
// extended by the last segment's slope past the last point and flat below the first.
struct VerifyCostPoint {
    int64_t tokens = 0;
    double ns = 0;
};
class VerifyCostCurve {
public:
    // INVALID_ARGUMENT unless there are >= 2 points, tokens strictly increase from >= 1,
    // and every time is finite and > 0.
    static Result<VerifyCostCurve> create(std::vector<VerifyCostPoint> points);
    double ns(int64_t tokens) const;
    std::span<const VerifyCostPoint> points() const { return points_; }

    // {"format": "dsinfer-verify-cost-v1", "points": [{"tokens": n, "ns": t}, ...],
    //  "fit": {...informational}}.
    std::string to_json(std::string_view info_json) const;
    // INVALID_ARGUMENT naming the problem (not JSON, wrong format, bad points).
    static Result<VerifyCostCurve> from_json(std::string_view text);

private:
    std::vector<VerifyCostPoint> points_;
};

// One request of a step that may verify drafts: the conditional acceptance estimate of
// each proposed draft, in order.
struct VarlenRequest {
    std::span<const double> accept;
};

struct VarlenChoice {
    std::vector<int> lengths;       // drafts to verify, per request
    int64_t verified = 0;           // their sum (N)
    double expected_accepted = 0;   // sum of the chosen survivals
    // (sampled + expected_accepted) / (time(base + N) + draft_ns)
    double tokens_per_ns = 0;
    // Speculating at all beats not drafting: tokens_per_ns > sampled / time(base).
    bool pays = false;
};

// `base_tokens`: the tokens the step runs without any draft (>= requests.size(): each
// request's own input token, plus other sequences' prefill chunks and decodes);
// `sampled`: the sequences that emit a token this step (the requests and any other
// decodes); `draft_ns`: what drafting costs a step (it moves the best N up, and decides
// `pays`). REQUIRES: every estimate in [0, 1].
VarlenChoice choose_verify_lengths(std::span<const VarlenRequest> requests, int64_t base_tokens,
                                   int64_t sampled, const VerifyCostCurve& cost,
                                   double draft_ns = 0);

// What the cost curve predicts speculating gains at `batch` decoding sequences, each
// with the same draft survivals (`survival[j]`: the chance drafts 1..j+1 are all
// accepted, non-increasing): the best common draft length n >= 1,
//   ((batch + batch * sum_{j<n} survival[j]) / time(batch * (1 + n))) / (batch / time(batch)).
// Drafting and the synchronous loop are left out (they only add to speculating's time),
// so below 1 verifying cannot pay at this batch. 0 when there is nothing to predict from
// (no survivals, batch <= 0).
double predict_speedup(const VerifyCostCurve& cost, std::span<const double> survival,
                       int64_t batch);

// Survivals for predict_speedup from verification counts (EngineStats::spec_drafted_at,
// spec_accepted_at: items that verified a draft at position j, and that accepted it),
// `max_drafts` positions: survival[j] = (accepted[j] + kSurvivalPrior * prior) /
// (drafted[j] + kSurvivalPrior), never above survival[j - 1], where the prior is 1 at
// position 0 and after it survival[j - 1] times the conditional acceptance at j - 1.
// Optimistic while little is seen (all 1 with nothing seen: the prediction is then the
// curve's bound for drafts always accepted), so a prediction below 1 is never an
// artefact of few observations.
static constexpr double kSurvivalPrior = 4.0;
std::vector<double> observed_survival(std::span<const int64_t> drafted,
                                      std::span<const int64_t> accepted, int max_drafts);

// What switching speculation on costs now, and what the sequences can still gain from
// it (SpecGate::speculate). A switch first runs the MTP catch-up that plain steps
// deferred (every decoding sequence's rows since it last drafted, prompts included);
// it pays only if the output still to come, sped up, saves more than that:
//   remaining_tokens * token_ns * gain >= catchup_ns,
// token_ns: the bucket's measured plain time per token (else `plain_token_ns`, the
// curve's), gain: 1 - min_predicted / predicted (what the prediction leaves after the
// drafting and synchronous-loop costs that min_predicted stands for; not a measured
// gain, which could stop the re-probing of a bucket for good after one noisy probe).
// Nothing to catch up (catchup_ns <= 0), no prediction, or remaining_tokens < 0
// (unknown): the switch is not priced.
struct SwitchPrice {
    double catchup_ns = 0;          // deferred catch-up rows x the drafter's cost per row
    int64_t remaining_tokens = -1;  // sum over decoding sequences of max_tokens - output
    double plain_token_ns = 0;      // without speculating, time per output token (curve)
};

// Speculate or not, decided per batch-size bucket (decoding sequences: 1, 2, 3-4, 5-8,
// ..., 2^k+1 - 2^(k+1)) from measured output rates: tokens emitted per ns of wall time
// between consecutive step results, which includes drafting, sampling and the host's
// planning (overlapped in the asynchronous loop, not in the synchronous one). A bucket
// starts with a probe of each mode (not speculating first) — or, when its neighbouring
// buckets measured a clear speed-up or loss (beyond kPriorMargin), by holding the mode
// they favour — then holds the faster mode for
// `min_hold` steps, doubling up to `max_hold` each time a probe of the other mode
// confirms the choice (back to `min_hold` when it does not), and at least long enough
// that a probe of the slower mode costs at most `max_probe_cost` of the hold's time
// (probe_steps * its step time * (1 - slower / faster) / (hold * the faster mode's step
// time)). The cost curve's prediction (predict_speedup) bounds what is tried: where it is
// below `min_predicted` a bucket that does not speculate never probes speculating (it holds not
// speculating for `min_hold` steps at a time and asks again; a new bucket starts so, even
// against its neighbours' prior). A predicted gain decides nothing (the prediction
// leaves drafting and the synchronous loop out), and a measured gain outranks a
// predicted loss (the curve may be wrong; the measurement is what the loop does). A mode's rate is
// that of its latest run, recent steps weighted most (kDecay). The first step of each run of a mode
// is not measured (it carries the switch: drafts not yet proposed, or the loop refilling).
// Switching on is priced (SwitchPrice): where the catch-up it runs first costs more than
// the remaining output can gain, the gate does not switch on (a bucket holds not
// speculating for `min_hold` steps and asks again), even where a measured gain would
// have it speculate: at the tail of a round the remaining tokens are few. Pure: no
// clock; the engine passes measured periods. Not thread-safe.
class SpecGate {
public:
    struct Options {
        int probe_steps = 4;  // steps of a probe run (the first is not measured)
        int min_hold = 8;
        int max_hold = 512;
        double max_probe_cost = 0.02;
        // Speculating is probed only where the cost curve predicts at least this speed-up
        // (predict_speedup; none given: no bound). The prediction leaves out drafting,
        // the synchronous loop and the MTP catch-up of a switch (~5-10 % of a step each
        // at 16-64 sequences on the default model), so a smaller predicted gain cannot
        // pay for them. A switch's catch-up is also priced on its own (SwitchPrice), with
        // the gain 1 - min_predicted / predicted.
        double min_predicted = 1.15;
        bool measure = true;  // false: always speculate
    };
    SpecGate() : SpecGate(Options{}) {}
    explicit SpecGate(Options o) : o_(o) {}

    // Whether the next planned step speculates, with `batch` decoding sequences; counts
    // a planned step of that bucket. A step that cannot be measured (`measurable` false:
    // it also runs prefill chunks) gets the mode the bucket holds after its probes (not
    // speculating before them) and counts nothing; so does batch 0 (not speculating).
    // `predicted`: the cost curve's speed-up of speculating at this batch
    // (predict_speedup; <= 0: none); below Options::min_predicted no probe speculates.
    // `price`: what switching on costs now and may gain (not priced by default); a switch
    // that does not pay is not made, by a probe, a hold or a prefill step.
    bool speculate(int64_t batch, bool measurable = true, double predicted = 0,
                   const SwitchPrice& price = {});
    // Whether switching on at `batch` pays for its catch-up (SwitchPrice), with the
    // bucket's measured rates; true where it is not priced.
    bool switch_pays(int64_t batch, double predicted, const SwitchPrice& price) const;
    // A measured step: planned in mode `speculated`, `batch` decoding sequences (a step
    // that also ran prefill chunks is not passed), `tokens` emitted, `period_ns` since
    // the previous step's result. Steps of a mode the bucket has left are ignored.
    void observe(bool speculated, int64_t batch, int64_t tokens, int64_t period_ns);

    static int bucket(int64_t batch);
    // Weight of a run's earlier steps in its rate, per later step.
    static constexpr double kDecay = 0.8;
    // A new bucket takes its neighbours' measured speed-up as a prior when it is
    // further than this from 1.
    static constexpr double kPriorMargin = 0.15;
    static constexpr int kBuckets = 16;
    // For tests, metrics and benchmarks: the bucket's latest measured rate of a mode
    // (tokens per ns; 0 before it was measured) and its current mode.
    double rate(int64_t batch, bool speculated) const;
    bool mode(int64_t batch) const { return buckets_[static_cast<size_t>(bucket(batch))].on; }
    int64_t switches() const { return switches_; }
    // Decisions against switching on because the catch-up would not pay (SwitchPrice).
    int64_t priced_out() const { return priced_out_; }
    // Planned steps that were probes of speculating (true) or not speculating (false).
    int64_t probe_steps(bool speculated) const { return probe_steps_[speculated ? 1 : 0]; }

private:
    struct Bucket {
        bool on = true;          // current mode: speculate
        bool probing = true;     // the current run is a probe (else a hold)
        bool started = false;    // a run was planned (speculate() called) in this bucket
        int left = 0;            // planned steps left in the run
        int hold = 0;            // length of the next hold
        bool fresh = true;       // the run's first observation is still to come
        double run_tokens = 0, run_ns = 0, run_steps = 0;
        double rate[2] = {0, 0};     // [off, on], tokens per ns, 0: never measured
        double step_ns[2] = {0, 0};  // [off, on], time per step
        bool winner_on = true;
        bool has_winner = false;
        // rate on / rate off, measured (after probes) or taken from neighbours; 0: none.
        double speedup = 0;
    };
    void start_run(Bucket& b, bool on, bool probing, int steps);
    void start_bucket(int index, double predicted);
    // `may_probe_on`: false where the prediction says speculating cannot pay.
    void decide(Bucket& b, bool may_probe_on);

    Options o_;
    std::array<Bucket, kBuckets> buckets_{};
    int64_t switches_ = 0;
    int64_t priced_out_ = 0;
    // Within speculate(): whether a run of speculation may start (SwitchPrice).
    bool may_switch_on_ = true;
    std::array<int64_t, 2> probe_steps_{};
};

}  // namespace dsi::spec
