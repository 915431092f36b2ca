// Expert parallelism of every model family (DeepseekModel V2/V3, DeepseekV4Model,
// DeepseekV41Model; load_causal_lm) across forked rank processes (issue 19): each rank
// runs its own batch (attention data parallelism), with only its share of the routed
// experts loaded, and every rank's logits are bitwise those of one process running the
// same batch — for EP 2 and 4, V2 and V3 routing, V4's hash layers, V4.1's encoder-only
// pass, with redundant replicas, with forward passes cut into several MoE rounds, ranks
// stepping different numbers of times and a rank with no tokens at all. Bad input: ranks
// vs experts, a rank that cannot attach, a rank that dies mid-run (an error on its peers,
// never a hang).
#include "model/expert_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "cluster/eplb_live.h"
#include "comm/shm_group.h"
#include "comm/test_ranks.h"
#include "model/causal_lm.h"
#include "model/deepseek.h"
#include "model/deepseek_v41.h"
#include "model/synthetic.h"

namespace dsi {
namespace {

using comm::run_ranks;
using comm::SharedArray;

constexpr uint64_t kSeed = 1234;
constexpr int kMaxRanks = 4;
constexpr int kMaxSteps = 4;      // one prefill + up to 3 decode steps per rank
constexpr int kMaxLogitRows = 4;  // logits rows per step (one per sequence)

ModelConfig config_of(const std::string& preset) {
    ModelConfig c = synthetic_preset(preset).value();
    c.vocab_size = 512;
    if (c.is_v41()) {
        c.v41.dspark_noise_token_id = 500;
        c.v41.image_token_id = 501;
    }
    return c;
}

// The synthetic weights of a preset (generated once, before any rank forks), copied per
// model.
std::unique_ptr<WeightSource> weights_of(const std::string& preset) {
    static std::map<std::string, std::unique_ptr<MemoryWeightSource>> made;
    std::unique_ptr<MemoryWeightSource>& base = made[preset];
    if (base == nullptr) {
        const ModelConfig c = config_of(preset);
        base =
            c.v4_layout() ? synthetic_v4_memory_model(c, kSeed) : synthetic_memory_model(c, kSeed);
    }
    auto copy = std::make_unique<MemoryWeightSource>(base->config());
    for (const auto& [name, t] : base->tensors()) copy->add(name, t.shape, t.data);
    return copy;
}

// The model of `preset`, one rank of `ep` (or one process without a group).
Result<std::unique_ptr<CausalLm>> load_model(const std::string& preset,
                                             const ExpertParallelOptions& ep,
                                             std::unique_ptr<WeightSource> source = nullptr) {
    ModelOptions o;
    o.expert_parallel = ep;
    return load_causal_lm(source != nullptr ? std::move(source) : weights_of(preset), o);
}

// Routed expert e's first matrix in MoE layer 0 (a rank reads it only if it holds e).
std::string expert_tensor(const ModelConfig& c, int64_t e) {
    if (c.v4_layout()) return "layers.0.ffn.experts." + std::to_string(e) + ".w1.weight";
    return "model.layers." + std::to_string(c.first_k_dense_replace) + ".mlp.experts." +
           std::to_string(e) + ".up_proj.weight";
}

// Records which tensors a load asked for (a rank must not read other ranks' experts).
class RecordingSource final : public WeightSource {
public:
    explicit RecordingSource(std::unique_ptr<WeightSource> inner, std::set<std::string>* names)
        : inner_(std::move(inner)), names_(names) {}
    const ModelConfig& config() const override { return inner_->config(); }
    bool has(const std::string& name) const override { return inner_->has(name); }
    Result<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) override {
        names_->insert(name);
        return inner_->matrix(name, rows, cols);
    }
    Result<std::vector<float>> vector(const std::string& name, int64_t n) override {
        names_->insert(name);
        return inner_->vector(name, n);
    }
    Result<std::vector<int32_t>> int_matrix(const std::string& name, int64_t rows,
                                            int64_t cols) override {
        names_->insert(name);
        return inner_->int_matrix(name, rows, cols);
    }
    std::string description() const override { return inner_->description(); }

private:
    std::unique_ptr<WeightSource> inner_;
    std::set<std::string>* names_;
};

std::string unique_group() {
    static std::atomic<int> counter{0};
    return "dsi_model_ep_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
}

// What rank r runs: its sequences' prompts (none: the rank has no tokens), then `decode`
// steps of one fixed token per sequence (fixed, so the reference needs no child output).
struct RankWork {
    std::vector<std::vector<int32_t>> prompts;
    int decode = 0;
    // V4.1: after the prompts, the first prompt again through forward_encoder (a pass
    // whose decoder layers run no token of this rank) on a cache of its own.
    bool encoder_pass = false;
};

RankWork work_of(int rank, int ranks) {
    RankWork w;
    if (ranks == 4 && rank == 2) {
        return w;  // no tokens: still in every MoE exchange of its peers
    }
    const int seqs = rank == 0 ? 2 : 1;
    for (int s = 0; s < seqs; ++s) {
        std::vector<int32_t> p;
        for (int i = 0; i < 3 + 2 * rank + 4 * s; ++i) {
            p.push_back((rank * 97 + s * 31 + i * 13 + 5) % 512);
        }
        w.prompts.push_back(p);
    }
    w.decode = 1 + rank % 3;  // ranks step different numbers of times
    w.encoder_pass = rank == 1;
    return w;
}

int32_t decode_token(int seq, int step) { return (seq * 17 + step * 7 + 1) % 512; }

// Runs a rank's work on `model`: step 0 the prompts, then the decode steps; logits rows
// of step i go to out[i * kMaxLogitRows * vocab ...].
Status run_work(CausalLm& model, const RankWork& w, float* out) {
    const int64_t vocab = model.config().vocab_size;
    std::vector<std::unique_ptr<KvCache>> caches;
    for (size_t s = 0; s < w.prompts.size(); ++s) caches.push_back(model.new_kv_cache(64));
    std::vector<std::vector<int32_t>> inputs(w.prompts.size());
    for (int step = 0; step <= w.decode && !w.prompts.empty(); ++step) {
        std::vector<SequenceStep> steps;
        for (size_t s = 0; s < w.prompts.size(); ++s) {
            inputs[s] = step == 0 ? w.prompts[s]
                                  : std::vector<int32_t>{decode_token(static_cast<int>(s), step)};
            const int64_t pos =
                step == 0 ? 0 : static_cast<int64_t>(w.prompts[s].size()) + step - 1;
            steps.push_back(SequenceStep{inputs[s], pos, caches[s].get(), false});
        }
        BatchOutput o;
        DSI_RETURN_IF_ERROR(model.forward_batch(steps, o));
        std::copy(o.logits.begin(), o.logits.end(), out + step * kMaxLogitRows * vocab);
        auto* v41 = dynamic_cast<DeepseekV41Model*>(&model);
        if (step == 0 && w.encoder_pass && v41 != nullptr) {
            auto cache = model.new_kv_cache(64);
            SequenceStep enc{w.prompts[0], 0, cache.get(), false};
            DSI_RETURN_IF_ERROR(v41->forward_encoder(std::span<const SequenceStep>(&enc, 1)));
        }
    }
    return Status::ok();
}

struct EpCase {
    std::string preset;
    int ranks = 2;
    int redundant = 0;
    int max_tokens_per_call = 128;
};

ExpertParallelOptions ep_options(const std::string& group, int rank, const EpCase& k) {
    ExpertParallelOptions o;
    o.num_ranks = k.ranks;
    o.rank = rank;
    o.group = group;
    o.redundant_experts_per_rank = k.redundant;
    o.max_tokens_per_call = k.max_tokens_per_call;
    o.attach_timeout_ms = 20'000;
    o.op_timeout_ms = 20'000;
    o.idle_timeout_ms = 20'000;
    return o;
}

// Exit codes of a rank: 0 ok, 10 load, 11 forward, 12 idle step, 13 read another rank's
// expert.
int ep_rank(const std::string& group, int rank, const EpCase& k, float* out) {
    const ModelConfig c = config_of(k.preset);
    std::set<std::string> names;
    auto m = load_model(k.preset, ep_options(group, rank, k),
                        std::make_unique<RecordingSource>(weights_of(k.preset), &names));
    if (!m.is_ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, m.status().to_string().c_str());
        return 10;
    }
    // Rank r holds its slots of the initial placement: experts [r * E / N, (r + 1) * E / N)
    // and its replicas (the spare slots hold experts 0, 1, ... in turn over the ranks).
    const int E = static_cast<int>(c.n_routed_experts);
    const int slots = slots_per_rank(E, k.ranks, k.redundant);
    const auto placement = initial_placement(E, k.ranks, slots);
    if (!placement.is_ok()) return 14;
    const auto held = placement->slot_expert().subspan(static_cast<size_t>(rank) * slots, slots);
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        const bool mine = std::find(held.begin(), held.end(), e) != held.end();
        if (names.count(expert_tensor(c, e)) != (mine ? 1u : 0u)) return 13;
    }
    Status s = run_work(**m, work_of(rank, k.ranks), out);
    if (!s.is_ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.to_string().c_str());
        return 11;
    }
    for (;;) {
        auto step = (*m)->group_idle_step(/*leaving=*/true);
        if (!step.is_ok()) {
            std::fprintf(stderr, "rank %d: %s\n", rank, step.status().to_string().c_str());
            return 12;
        }
        if (*step == CausalLm::GroupStep::kStopped) return 0;
    }
}

class ExpertParallelTest : public ::testing::TestWithParam<EpCase> {};

TEST_P(ExpertParallelTest, EveryRanksLogitsAreBitwiseThoseOfOneProcess) {
    const EpCase k = GetParam();
    const ModelConfig c = config_of(k.preset);
    const size_t per_rank = static_cast<size_t>(kMaxSteps) * kMaxLogitRows * c.vocab_size;
    SharedArray<float> out(per_rank * kMaxRanks);
    const std::string group = unique_group();
    auto codes = run_ranks(
        k.ranks, [&](int r) { return ep_rank(group, r, k, out.data() + r * per_rank); }, 120'000);
    (void)comm::ShmMoeCommunicator::unlink(group);
    for (int r = 0; r < k.ranks; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
    // The reference: one process, every expert, each rank's batch run alone.
    auto ref = load_model(k.preset, ExpertParallelOptions{});
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    std::vector<float> want(per_rank);
    for (int r = 0; r < k.ranks; ++r) {
        const RankWork w = work_of(r, k.ranks);
        std::fill(want.begin(), want.end(), 0.0f);
        ASSERT_TRUE(run_work(**ref, w, want.data()).is_ok());
        EXPECT_EQ(std::all_of(want.begin(), want.end(), [](float v) { return v == 0.0f; }),
                  w.prompts.empty());  // real logits, except for the rank without tokens
        EXPECT_EQ(std::memcmp(want.data(), out.data() + r * per_rank, per_rank * sizeof(float)), 0)
            << "rank " << r;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, ExpertParallelTest,
    ::testing::Values(EpCase{"tiny", 2, 0, 128},
                      // several MoE rounds per forward pass, redundant replicas, a rank
                      // with no tokens
                      EpCase{"tiny", 4, 1, 3},
                      // 3 ranks over 8 experts: 3 slots each, one holding a replica
                      EpCase{"tiny", 3, 0, 128},
                      // V3: sigmoid + noaux_tc group routing, q_lora, MTP layer left out
                      EpCase{"tiny-v3", 2, 2, 5}, EpCase{"tiny-v3", 4, 0, 128},
                      // V4: hash routing (layers 0, 1) and sqrt-softplus top-k, the SWA
                      // state; V4.1: CED (an encoder-only pass), single-pass mHC
                      EpCase{"tiny-v4", 2, 1, 5}, EpCase{"tiny-v4", 4, 0, 128},
                      EpCase{"tiny-v41", 2, 0, 128}, EpCase{"tiny-v41", 4, 1, 3}),
    [](const ::testing::TestParamInfo<EpCase>& p) {
        std::string n = p.param.preset + "_ep" + std::to_string(p.param.ranks) + "_r" +
                        std::to_string(p.param.redundant) + "_t" +
                        std::to_string(p.param.max_tokens_per_call);
        for (char& ch : n) {
            if (ch == '-') ch = '_';
        }
        return n;
    });

// Live EPLB (S-EPLB): the placement changes between forward passes in the middle of the
// ranks' generations (window 2 steps, rebalance every 2), weights move into the new slots,
// and every rank's logits stay bitwise those of one process — EP 1 (a one-rank group: the
// placement permutes its slots and moves its replicas), 2 and 4, with and without replicas.
constexpr int kEplbDecode = 6;

ExpertParallelOptions eplb_options(const std::string& group, int rank, const EpCase& k) {
    ExpertParallelOptions o = ep_options(group, rank, k);
    cluster::EplbSettings settings;
    settings.redundant_experts_per_rank = k.redundant;
    settings.window_steps = 2;
    settings.rebalance_interval_steps = 2;
    settings.smoothing = cluster::EplbSmoothing::kLastWindow;
    o.placement_policy = cluster::live_eplb_factory(settings);
    o.wait_for_moved_weights = true;
    o.stats_window_steps = 2;
    return o;
}

RankWork eplb_work(int rank, int ranks) {
    RankWork w = work_of(rank, ranks);
    w.decode = kEplbDecode - rank % 2;
    return w;
}

class LiveEplbTest : public ::testing::TestWithParam<EpCase> {};

TEST_P(LiveEplbTest, LogitsStayBitwiseAcrossPlacementChanges) {
    const EpCase k = GetParam();
    const ModelConfig c = config_of(k.preset);
    const size_t per_rank = static_cast<size_t>(kEplbDecode + 1) * kMaxLogitRows * c.vocab_size;
    SharedArray<float> out(per_rank * kMaxRanks);
    SharedArray<int64_t> changes(kMaxRanks);
    const std::string group = unique_group();
    auto codes = run_ranks(
        k.ranks,
        [&](int r) {
            auto m = load_model(k.preset, eplb_options(group, r, k));
            if (!m.is_ok()) {
                std::fprintf(stderr, "rank %d: %s\n", r, m.status().to_string().c_str());
                return 10;
            }
            Status s = run_work(**m, eplb_work(r, k.ranks), out.data() + r * per_rank);
            if (!s.is_ok()) {
                std::fprintf(stderr, "rank %d: %s\n", r, s.to_string().c_str());
                return 11;
            }
            for (;;) {
                auto step = (*m)->group_idle_step(/*leaving=*/true);
                if (!step.is_ok()) return 12;
                if (*step == CausalLm::GroupStep::kStopped) break;
            }
            changes[static_cast<size_t>(r)] = (*m)->expert_parallel_stats(0)->placement_changes;
            return 0;
        },
        120'000);
    (void)comm::ShmMoeCommunicator::unlink(group);
    for (int r = 0; r < k.ranks; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
    // Every rank switched as often, at least twice (steps 3 and 5 of 7) with several
    // ranks; one rank's slots may settle after the first switch.
    EXPECT_GE(changes[0], k.ranks > 1 ? 2 : 1);
    for (int r = 1; r < k.ranks; ++r) EXPECT_EQ(changes[static_cast<size_t>(r)], changes[0]);
    auto ref = load_model(k.preset, ExpertParallelOptions{});
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    std::vector<float> want(per_rank);
    for (int r = 0; r < k.ranks; ++r) {
        std::fill(want.begin(), want.end(), 0.0f);
        ASSERT_TRUE(run_work(**ref, eplb_work(r, k.ranks), want.data()).is_ok());
        EXPECT_EQ(std::memcmp(want.data(), out.data() + r * per_rank, per_rank * sizeof(float)), 0)
            << "rank " << r;
    }
}

INSTANTIATE_TEST_SUITE_P(Sizes, LiveEplbTest,
                         ::testing::Values(EpCase{"tiny", 1, 1, 128}, EpCase{"tiny", 2, 0, 128},
                                           EpCase{"tiny", 4, 1, 3}, EpCase{"tiny-v3", 1, 0, 128},
                                           EpCase{"tiny-v3", 2, 2, 5}, EpCase{"tiny-v3", 4, 0, 128},
                                           EpCase{"tiny-v4", 1, 1, 128},
                                           EpCase{"tiny-v4", 2, 0, 128}, EpCase{"tiny-v4", 4, 1, 3},
                                           EpCase{"tiny-v41", 1, 0, 128},
                                           EpCase{"tiny-v41", 2, 1, 5},
                                           EpCase{"tiny-v41", 4, 0, 128}),
                         [](const ::testing::TestParamInfo<EpCase>& p) {
                             std::string n = p.param.preset + "_ep" +
                                             std::to_string(p.param.ranks) + "_r" +
                                             std::to_string(p.param.redundant);
                             for (char& ch : n) {
                                 if (ch == '-') ch = '_';
                             }
                             return n;
                         });

// EP failover (S-DEPLOY): rank 2 of 3 is killed -9 between rank 0's steps, or in the
// middle of one (before MoE layer `die_at_layer` of its second joined pass); rank 0's
// restart callback starts a group of the 2 healthy ranks (a fresh rank 1), rank 0 moves
// its experts to its new slots and resumes the step (at the MoE layer that failed: V4's
// window ring and compressors must not see a layer twice): every logit is still bitwise
// one process's, and the survivor of the old group exits as healthy (UNAVAILABLE).
int idle_until_stopped(CausalLm& m, int die_after_joins) {
    int joins = 0;
    for (;;) {
        auto step = m.group_idle_step(/*leaving=*/true);
        if (!step.is_ok()) return step.status().code() == StatusCode::kUnavailable ? 75 : 12;
        if (*step == CausalLm::GroupStep::kStopped) return 0;
        if (*step == CausalLm::GroupStep::kJoinedPeers && ++joins == die_after_joins) {
            ::raise(SIGKILL);
        }
    }
}

struct FailoverCase {
    std::string preset;
    int die_at_layer = -1;  // -1: between passes
};

class ExpertParallelFailover : public ::testing::TestWithParam<FailoverCase> {};

TEST_P(ExpertParallelFailover, ARankKilledMidRunLosesNothing) {
    const FailoverCase fc = GetParam();
    const ModelConfig c = config_of(fc.preset);
    const EpCase k{fc.preset, 3, 1, 128};
    const RankWork work = eplb_work(0, 1);  // rank 0's prompts, several decode steps
    const size_t per_rank = static_cast<size_t>(kEplbDecode + 1) * kMaxLogitRows * c.vocab_size;
    SharedArray<float> out(per_rank);
    SharedArray<int64_t> result(4);
    const std::string group = unique_group();
    const std::string group2 = group + "_f1";
    auto codes = run_ranks(
        3,
        [&](int r) {
            ExpertParallelOptions o = ep_options(group, r, k);
            std::vector<pid_t> started;
            if (r == 0) {
                o.restart = [&](const Status&) -> Result<EpRestart> {
                    const pid_t pid = ::fork();
                    if (pid == 0) {
                        auto rm = load_model(fc.preset,
                                             ep_options(group2, 1, EpCase{fc.preset, 2, 1, 128}));
                        ::_exit(rm.is_ok() ? idle_until_stopped(**rm, -1) : 10);
                    }
                    started.push_back(pid);
                    return EpRestart{2, group2};
                };
            }
            if (r == 2 && fc.die_at_layer >= 0) {
                o.on_moe_layer = [&, passes = 0](int layer) mutable {
                    passes += layer == 0 ? 1 : 0;
                    if (passes == 2 && layer == fc.die_at_layer) ::raise(SIGKILL);
                };
            }
            auto m = load_model(fc.preset, o);
            if (!m.is_ok()) return 10;
            if (r > 0) return idle_until_stopped(**m, r == 2 && fc.die_at_layer < 0 ? 2 : -1);
            Status s = run_work(**m, work, out.data());
            if (!s.is_ok()) {
                std::fprintf(stderr, "rank 0: %s\n", s.to_string().c_str());
                return 11;
            }
            if (idle_until_stopped(**m, -1) != 0) return 12;
            const auto st = (*m)->expert_parallel_stats(0);
            result[0] = st->failovers;
            result[1] = st->num_ranks;
            for (pid_t pid : started) {
                int status = 0;
                ::waitpid(pid, &status, 0);
                result[2] += WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 1 : 0;
            }
            return 0;
        },
        120'000);
    (void)comm::ShmMoeCommunicator::unlink(group);
    (void)comm::ShmMoeCommunicator::unlink(group2);
    EXPECT_EQ(codes[0], 0);
    EXPECT_EQ(codes[1], 75);  // saw its group end: healthy
    EXPECT_EQ(codes[2], 128 + SIGKILL);
    EXPECT_EQ(result[0], 1);  // one failover, to 2 ranks, whose rank 1 ended cleanly
    EXPECT_EQ(result[1], 2);
    EXPECT_EQ(result[2], 1);
    auto ref = load_model(fc.preset, ExpertParallelOptions{});
    ASSERT_TRUE(ref.is_ok());
    std::vector<float> want(per_rank, 0.0f);
    ASSERT_TRUE(run_work(**ref, work, want.data()).is_ok());
    EXPECT_EQ(std::memcmp(want.data(), out.data(), per_rank * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Kills, ExpertParallelFailover,
                         ::testing::Values(FailoverCase{"tiny", -1}, FailoverCase{"tiny", 1},
                                           FailoverCase{"tiny-v4", 2}),
                         [](const ::testing::TestParamInfo<FailoverCase>& p) {
                             std::string n =
                                 p.param.preset +
                                 (p.param.die_at_layer < 0
                                      ? "_between_passes"
                                      : "_at_moe_layer_" + std::to_string(p.param.die_at_layer));
                             for (char& ch : n) {
                                 if (ch == '-') ch = '_';
                             }
                             return n;
                         });

TEST(ExpertParallelBadInput, RanksAndReplicasMustFitTheRoutedExperts) {
    const ModelConfig c = config_of("tiny");  // 8 routed experts
    for (const auto& [ranks, redundant, want] :
         {std::tuple{16, 0, "more ranks than the 8 routed experts"},
          std::tuple{2, 9, "9 redundant experts per rank, more than the 8 routed experts"},
          std::tuple{2, -1, "redundant experts must be >= 0"}}) {
        DeepseekModel::Options o;
        o.expert_parallel = ep_options(unique_group(), 0, EpCase{"tiny", ranks, redundant});
        auto m = DeepseekModel::load(synthetic_memory_model(c, kSeed), o);
        ASSERT_EQ(m.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(m.status().message().find(want), std::string::npos) << m.status().message();
    }
    // S-EPLB rounding: 8 experts + 1 redundant per rank over 3 ranks = 4 slots each.
    EXPECT_EQ(slots_per_rank(8, 3, 1), 4);
    EXPECT_EQ(slots_per_rank(8, 3, 0), 3);
    EXPECT_EQ(slots_per_rank(8, 2, 0), 4);
}

TEST(ExpertParallelBadInput, V4RanksMustFitItsRoutedExperts) {
    // tiny-v4: 16 routed experts, tiny-v41: 8; checked from the config (what apps/ does
    // before any rank starts) and by the load.
    for (const auto& [preset, ranks, want] :
         {std::tuple{"tiny-v4", 32, "more ranks than the 16 routed experts"},
          std::tuple{"tiny-v41", 9, "more ranks than the 8 routed experts"}}) {
        const ExpertParallelOptions o = ep_options(unique_group(), 0, EpCase{preset, ranks});
        Status s = validate_expert_parallel(o, config_of(preset));
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
        auto m = load_model(preset, o);
        ASSERT_EQ(m.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(m.status().message().find(want), std::string::npos) << m.status().message();
    }
}

TEST(ExpertParallelBadInput, ARankThatCannotAttachFailsInsteadOfHanging) {
    const ModelConfig c = config_of("tiny");
    // Rank 1 of a group whose rank 0 never comes: DEADLINE_EXCEEDED at its attach deadline.
    DeepseekModel::Options o;
    o.expert_parallel = ep_options(unique_group(), 1, EpCase{"tiny", 2});
    o.expert_parallel.attach_timeout_ms = 300;
    auto m = DeepseekModel::load(synthetic_memory_model(c, kSeed), o);
    EXPECT_EQ(m.status().code(), StatusCode::kDeadlineExceeded) << m.status().to_string();
    // A segment of another shape under the name (other options): refused by its layout.
    const std::string group = unique_group();
    auto codes = run_ranks(2, [&](int r) {
        DeepseekModel::Options ro;
        ro.expert_parallel = ep_options(group, r, EpCase{"tiny", 2, 0, r == 0 ? 128 : 64});
        ro.expert_parallel.attach_timeout_ms = 2'000;
        auto rm = DeepseekModel::load(synthetic_memory_model(c, kSeed), ro);
        return static_cast<int>(rm.status().code());
    });
    (void)comm::ShmMoeCommunicator::unlink(group);
    EXPECT_EQ(codes[0], static_cast<int>(StatusCode::kDeadlineExceeded));  // rank 1 never joined
    EXPECT_EQ(codes[1], static_cast<int>(StatusCode::kFailedPrecondition));
}

TEST(ExpertParallelBadInput, ARankThatDiesMidRunIsAnErrorOnItsPeers) {
    const ModelConfig c = config_of("tiny");
    const std::string group = unique_group();
    auto codes = run_ranks(2, [&](int r) {
        DeepseekModel::Options o;
        o.expert_parallel = ep_options(group, r, EpCase{"tiny", 2});
        auto m = DeepseekModel::load(synthetic_memory_model(c, kSeed), o);
        if (!m.is_ok()) return 90;
        auto cache = (*m)->new_kv_cache(16);
        const std::vector<int32_t> tokens = {1, 2, 3};
        SequenceStep step{tokens, 0, cache.get(), false};
        BatchOutput out;
        if (!(*m)->forward_batch(std::span<const SequenceStep>(&step, 1), out).is_ok()) return 91;
        if (r == 1) ::raise(SIGKILL);  // dies without leaving the group
        const std::vector<int32_t> next = {4};
        SequenceStep again{next, 3, cache.get(), false};
        // The dead peer is seen (UNAVAILABLE), not waited out (20 s DEADLINE_EXCEEDED).
        Status s = (*m)->forward_batch(std::span<const SequenceStep>(&again, 1), out);
        // The group is over for this rank: later calls fail at once too.
        auto idle = (*m)->group_idle_step(true);
        return idle.is_ok() ? 92 : static_cast<int>(s.code());
    });
    (void)comm::ShmMoeCommunicator::unlink(group);
    EXPECT_EQ(codes[0], static_cast<int>(StatusCode::kUnavailable));
    EXPECT_EQ(codes[1], 128 + SIGKILL);
}

TEST(ExpertParallelBadInput, NoGroupMeansNotGrouped) {
    auto m = DeepseekModel::load(synthetic_memory_model(config_of("tiny"), kSeed),
                                 DeepseekModel::Options{});
    ASSERT_TRUE(m.is_ok());
    auto step = (*m)->group_idle_step(true);
    ASSERT_TRUE(step.is_ok());
    EXPECT_EQ(*step, CausalLm::GroupStep::kNotGrouped);
}

}  // namespace
}  // namespace dsi
