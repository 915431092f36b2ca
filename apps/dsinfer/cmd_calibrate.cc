// `dsinfer calibrate`: profile prefill chunks of a checkpoint at several (q, c) points,
// fit the quadratic prefill cost model (S-LB) and store it beside the checkpoint, where
// the engine picks it up (engine/calibrate.h, docs/engine.md "Calibration"); then the
// verify-cost curve of variable-length verification (step time against tokens per step).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "engine/calibrate.h"
#include "kernels/cpu_features.h"
#include "model/deepseek.h"
#include "replica_flags.h"
#include "serving/replica.h"

namespace dsi {
namespace {

struct CalibrateFlags {
    ReplicaFlags replica;  // --model, --threads, --weight-format, ...
    std::string out;       // default: beside the checkpoint (engine::cost_model_path_for)
    std::string q_values = "16,64,256,512";
    std::string c_values = "0,512,1536";
    int reps = 2;
    // Variable-length verification's step-cost curve (issue 24): "" = beside the
    // checkpoint (engine::verify_cost_path_for); "none" = skip it.
    std::string verify_out;
    std::string verify_tokens = "1,2,3,4,6,8,12,16,24,32,48,64,96,128,192";
    // Rows per sequence in a verify step (a decode and its drafts) and the context each
    // sequence has; 1 row per sequence times plain decode steps (the simulator's decode
    // step model, bench/sim_vs_live.sh).
    int64_t verify_tokens_per_seq = engine::VerifyCalibration{}.tokens_per_seq;
    int64_t verify_context = engine::VerifyCalibration{}.context;
};

Result<std::vector<int64_t>> parse_counts(const std::string& flag, const std::string& s) {
    std::vector<int64_t> v;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) {
        size_t used = 0;
        int64_t x = -1;
        try {
            x = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != item.size() || x < 0) {
            return invalid_argument(flag + ": '" + item + "' is not a count");
        }
        v.push_back(x);
    }
    if (v.empty()) return invalid_argument(flag + " is empty");
    return v;
}

int run_calibrate(const CalibrateFlags& f) {
    Env* env = Env::default_env();
    auto fail = [](const Status& s) {
        std::fprintf(stderr, "dsinfer calibrate: %s\n", s.to_string().c_str());
        return 1;
    };
    Result<std::vector<int64_t>> qs = parse_counts("--q", f.q_values);
    if (!qs.is_ok()) return fail(qs.status());
    Result<std::vector<int64_t>> cs = parse_counts("--c", f.c_values);
    if (!cs.is_ok()) return fail(cs.status());
    Result<serving::ReplicaOptions> options = to_replica_options(f.replica);
    if (!options.is_ok()) return fail(options.status());
    options->load_tokenizer = false;
    options->create_engine = false;
    Result<std::unique_ptr<serving::Replica>> replica =
        serving::open_replica(std::move(options).value(), env);
    if (!replica.is_ok()) return fail(replica.status());
    CausalLm* model = (*replica)->model();
    Result<std::vector<engine::CalibrationPoint>> pts =
        engine::profile_prefill(model, *qs, *cs, f.reps);
    if (!pts.is_ok()) return fail(pts.status());
    Result<engine::PrefillCostModel> fit = engine::fit_prefill_cost_model(*pts);
    if (!fit.is_ok()) return fail(fit.status());
    nlohmann::ordered_json info;
    info["threads"] = f.replica.threads > 0 ? f.replica.threads : env->num_cpus();
    info["weight_format"] = f.replica.weight_format;
    info["isa"] = std::string(kernels::isa_name(kernels::active_isa()));
    info["reps"] = f.reps;
    double worst = 0;
    for (const engine::CalibrationPoint& p : *pts) {
        const double pred = fit->cost_ns(p.q, p.c);
        worst = std::max(worst, std::abs(pred - p.ns) / p.ns);
        info["points"].push_back({{"q", p.q}, {"c", p.c}, {"ns", p.ns}, {"fit_ns", pred}});
        std::fprintf(stderr, "q %5lld c %5lld: %10.2f ms (fit %10.2f ms)\n",
                     static_cast<long long>(p.q), static_cast<long long>(p.c), p.ns / 1e6,
                     pred / 1e6);
    }
    info["max_rel_error"] = worst;
    // Where every replica of this checkpoint loads it from (serving/replica.h).
    const std::string out =
        f.out.empty() ? engine::cost_model_path_for((*replica)->model_path()) : f.out;
    Status w = env->write_file(out, engine::cost_model_to_json(*fit, info.dump()));
    if (!w.is_ok()) return fail(w);
    std::printf(
        "wrote %s: base %.0f ns, per_q %.0f ns, per_c %.2f ns, per_qc %.3f ns, per_qq %.3f "
        "ns (max error on the points %.1f%%)\n",
        out.c_str(), fit->base_ns, fit->per_q_ns, fit->per_c_ns, fit->per_qc_ns, fit->per_qq_ns,
        100 * worst);
    if (f.verify_out == "none") return 0;
    // The step time against the tokens a step verifies (spec/varlen.h), for
    // --enable-mtp-varlen. Models whose state cannot roll back (V4) do not speculate.
    if (model->kv_layout().state_floats > 0) {
        std::printf("verify-cost curve: skipped (%s does not speculate)\n",
                    model->config().architecture.c_str());
        return 0;
    }
    engine::VerifyCalibration grid;
    Result<std::vector<int64_t>> ns = parse_counts("--verify-tokens", f.verify_tokens);
    if (!ns.is_ok()) return fail(ns.status());
    grid.tokens = *ns;
    grid.tokens_per_seq = f.verify_tokens_per_seq;
    grid.context = f.verify_context;
    grid.reps = std::max(f.reps, 3);
    Result<spec::VerifyCostCurve> curve = engine::profile_verify_cost(model, grid);
    if (!curve.is_ok()) return fail(curve.status().with_context("--verify-tokens"));
    info = nlohmann::ordered_json();
    info["threads"] = f.replica.threads > 0 ? f.replica.threads : env->num_cpus();
    info["weight_format"] = f.replica.weight_format;
    info["isa"] = std::string(kernels::isa_name(kernels::active_isa()));
    info["tokens_per_seq"] = grid.tokens_per_seq;
    info["context"] = grid.context;
    info["reps"] = grid.reps;
    const std::string vout = f.verify_out.empty()
                                 ? engine::verify_cost_path_for((*replica)->model_path())
                                 : f.verify_out;
    w = env->write_file(vout, curve->to_json(info.dump()));
    if (!w.is_ok()) return fail(w);
    std::printf("wrote %s:", vout.c_str());
    for (const spec::VerifyCostPoint& p : curve->points()) {
        std::printf(" %lld tokens %.2f ms;", static_cast<long long>(p.tokens), p.ns / 1e6);
    }
    std::printf("\n");
    return 0;
}

}  // namespace

void register_calibrate_command(CLI::App& app) {
    auto f = std::make_shared<CalibrateFlags>();
    CLI::App* c = app.add_subcommand(
        "calibrate",
        "fit the prefill cost model of a checkpoint (stored beside it for the engine)");
    add_replica_flags(*c, &f->replica, {.engine = false});
    add_setting(*c, "--out", f->out, "output JSON (default: beside the checkpoint)");
    add_setting(*c, "--q", f->q_values, "chunk sizes (new tokens) to time, comma list");
    add_setting(*c, "--c", f->c_values, "computed prefix lengths to time, comma list");
    add_setting(*c, "--reps", f->reps, "timed runs per point (best kept)");
    add_setting(*c, "--verify-out", f->verify_out,
                "verify-cost curve JSON for --enable-mtp-varlen (default: beside the "
                "checkpoint; none = skip)");
    add_setting(*c, "--verify-tokens", f->verify_tokens,
                "step sizes (tokens verified per step) to time for the verify-cost curve");
    add_setting(*c, "--verify-tokens-per-seq", f->verify_tokens_per_seq,
                "rows per sequence in a timed step (a decode and its drafts; 1 = plain "
                "decode steps of n sequences)");
    add_setting(*c, "--verify-context", f->verify_context,
                "computed tokens of each sequence before a timed step");
    c->callback([f] {
        if (int rc = run_calibrate(*f); rc != 0) throw CLI::RuntimeError(rc);
    });
}

}  // namespace dsi
