// Test data of the EP all-to-all tests (shm_group_test, ucx_group_test): deterministic
// MoE calls, a stand-in expert, the single-process reference, and one rank's run of
// kCalls calls through any MoeCommunicator. Not part of any library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "comm/expert_load.h"
#include "comm/moe_comm.h"

namespace dsi::comm::moe_test {

constexpr int kHidden = 32;
constexpr int kExperts = 16;
constexpr int kTopK = 4;
constexpr int kGlobalTokens = 48;  // split over the ranks: EP 1, 2 and 4 divide it
constexpr int kCalls = 3;          // MoE calls per run (alternating buffer sets)

// Deterministic inputs for call c: hidden rows, distinct top-k ids and gate weights.
struct CallInput {
    std::vector<float> hidden;  // [kGlobalTokens * kHidden]
    std::vector<int32_t> ids;   // [kGlobalTokens * kTopK]
    std::vector<float> gate;    // [kGlobalTokens * kTopK]
};

inline CallInput make_input(int call) {
    std::mt19937 rng(1234 + call);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    CallInput in;
    for (int i = 0; i < kGlobalTokens * kHidden; ++i) {
        in.hidden.push_back(u(rng));
    }
    // Skewed routing: experts 0 and 1 are hot (what redundant replicas are for).
    std::vector<int> perm(kExperts);
    for (int t = 0; t < kGlobalTokens; ++t) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        if (t % 2 == 0) {
            std::swap(*std::find(perm.begin(), perm.end(), 0), perm[0]);
        }
        for (int k = 0; k < kTopK; ++k) {
            in.ids.push_back(perm[static_cast<size_t>(k)]);
            in.gate.push_back(u(rng));
        }
    }
    return in;
}

// Expert e: y = W_e x, W_e[i][j] from a fixed formula, summed over j in order.
inline void expert_forward(int e, const float* x, float* y) {
    for (int i = 0; i < kHidden; ++i) {
        float acc = 0.0f;
        for (int j = 0; j < kHidden; ++j) {
            const float w = static_cast<float>(((e * 131 + i * 31 + j * 7) % 97) - 48) / 64.0f;
            acc += w * x[j];
        }
        y[i] = acc;
    }
}

// The single-process reference: out[t] = sum_k gate * expert(x) in k order from 0.
inline std::vector<float> reference(const CallInput& in) {
    std::vector<float> out(static_cast<size_t>(kGlobalTokens) * kHidden);
    std::vector<float> y(kHidden);
    for (int t = 0; t < kGlobalTokens; ++t) {
        float* acc = out.data() + static_cast<size_t>(t) * kHidden;
        for (int k = 0; k < kTopK; ++k) {
            expert_forward(in.ids[static_cast<size_t>(t) * kTopK + k],
                           in.hidden.data() + static_cast<size_t>(t) * kHidden, y.data());
            const float w = in.gate[static_cast<size_t>(t) * kTopK + k];
            for (int h = 0; h < kHidden; ++h) {
                acc[h] += w * y[h];
            }
        }
    }
    return out;
}

// Rank `rank`'s slice of a call's inputs (its kGlobalTokens / ranks tokens).
struct RankSlice {
    RankSlice(const CallInput& in, int rank, int ranks)
        : tokens(kGlobalTokens / ranks),
          ids(in.ids.data() + static_cast<size_t>(rank) * tokens * kTopK,
              static_cast<size_t>(tokens) * kTopK),
          x(in.hidden.data() + static_cast<size_t>(rank) * tokens * kHidden,
            static_cast<size_t>(tokens) * kHidden),
          gate(in.gate.data() + static_cast<size_t>(rank) * tokens * kTopK,
               static_cast<size_t>(tokens) * kTopK) {}
    int tokens;
    std::span<const int32_t> ids;  // [tokens * kTopK]
    std::span<const float> x;      // [tokens * kHidden]
    std::span<const float> gate;   // [tokens * kTopK]
};

// One rank's kCalls MoE calls through `comm` (its tokens: the rank-th slice of
// kGlobalTokens); writes its tokens' outputs to `out` ([kCalls][kGlobalTokens][kHidden]).
// Between calls an all_gather and a barrier, as the engine's lockstep does. Exit codes:
// 0 ok, 3 layout, 4 dispatch, 5 a received row differs from its origin's input, 6 combine,
// 7 the layout's global expert load differs from the inputs', 8 all_gather / barrier.
inline int run_calls(MoeCommunicator& comm, const PlacementTable& placement, ReplicaChoice choice,
                     float* out) {
    const int rank = comm.rank();
    const int ranks = comm.size();
    const int tokens = kGlobalTokens / ranks;
    const int first = rank * tokens;
    for (int c = 0; c < kCalls; ++c) {
        const CallInput in = make_input(c);
        const RankSlice slice(in, rank, ranks);
        auto layout = comm.layout(placement, slice.ids, tokens, choice);
        if (!layout.is_ok()) {
            return 3;
        }
        // The layout's per-slot rows give every rank the global expert load of the call.
        ExpertLoadCounter group_load(1, kExperts), want(1, kExperts);
        if (!group_load.add_slot_rows(0, placement, layout->slot_rows).is_ok() ||
            !want.add(0, in.ids).is_ok() ||
            !std::equal(group_load.step_loads().begin(), group_load.step_loads().end(),
                        want.step_loads().begin())) {
            return 7;
        }
        auto view = comm.dispatch(*layout, slice.x);
        if (!view.is_ok()) {
            std::fprintf(stderr, "rank %d dispatch: %s\n", rank, view.status().to_string().c_str());
            return 4;
        }
        std::span<float> y = comm.expert_output_buffer(*layout);
        for (int s = 0; s < placement.slots_per_rank(); ++s) {
            const int e =
                placement.slot_expert()[static_cast<size_t>(rank) * placement.slots_per_rank() + s];
            for (int64_t row = view->slot_offsets[s]; row < view->slot_offsets[s + 1]; ++row) {
                const RowOrigin o = view->origins[row];
                const size_t global = static_cast<size_t>(o.rank) * tokens + o.token;
                const float* x = view->rows.data() + row * kHidden;
                if (std::memcmp(x, in.hidden.data() + global * kHidden, kHidden * sizeof(float)) !=
                        0 ||
                    in.ids[global * kTopK + o.k] != e) {
                    return 5;
                }
                expert_forward(e, x, y.data() + row * kHidden);
            }
        }
        std::span<float> mine(out + (static_cast<size_t>(c) * kGlobalTokens + first) * kHidden,
                              static_cast<size_t>(tokens) * kHidden);
        if (Status s = comm.combine(*layout, y, slice.gate, mine); !s.is_ok()) {
            std::fprintf(stderr, "rank %d combine: %s\n", rank, s.to_string().c_str());
            return 6;
        }
        auto values = comm.all_gather(rank * 10 + c);
        if (!values.is_ok() || (*values)[static_cast<size_t>(ranks - 1)] != (ranks - 1) * 10 + c ||
            !comm.barrier().is_ok()) {
            return 8;
        }
    }
    return 0;
}

// The fault tests' rank: up to `calls` MoE calls on call 0's input (kSpread) until one
// fails; then a later collective must fail with the same code at once (the communicator
// is broken). Returns 0 (no failure), that status code, or 92 (the later call differed).
inline int run_until_failure(MoeCommunicator& comm, const PlacementTable& placement, int calls) {
    const CallInput in = make_input(0);
    const RankSlice slice(in, comm.rank(), comm.size());
    std::vector<float> out(static_cast<size_t>(slice.tokens) * kHidden);
    for (int c = 0; c < calls; ++c) {
        auto layout = comm.layout(placement, slice.ids, slice.tokens, ReplicaChoice::kSpread);
        Status s = layout.status();
        if (layout.is_ok()) {
            auto view = comm.dispatch(*layout, slice.x);
            s = view.status();
            if (view.is_ok()) {
                s = comm.combine(*layout, comm.expert_output_buffer(*layout), slice.gate, out);
            }
        }
        if (!s.is_ok()) {
            auto again = comm.all_gather(0);
            return again.status().code() == s.code() ? static_cast<int>(s.code()) : 92;
        }
    }
    return 0;
}

}  // namespace dsi::comm::moe_test
