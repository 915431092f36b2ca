// Writes the seed of fuzz_v4_load: a micro DeepSeek V4 GGUF (every layer kind — window
// only, ratio 4 with the indexer, ratio 128 — hash routing, 2 hyper-connection streams;
// f16 matrices and MXFP4 experts), small enough (~60 KB) for libFuzzer to mutate.
//   v4_fuzz_seed OUT.gguf
#include <cstdio>

#include "base/env.h"
#include "model/checkpoint_writer.h"
#include "model/synthetic.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: v4_fuzz_seed OUT.gguf\n");
        return 2;
    }
    dsi::ModelConfig c = dsi::synthetic_preset("tiny-v4").value();
    c.vocab_size = 64;
    c.hidden_size = 32;
    c.num_hidden_layers = 3;
    c.compress_ratios = {0, 4, 128, 0};
    c.num_attention_heads = 2;
    c.head_dim = 32;
    c.qk_rope_head_dim = 16;
    c.q_lora_rank = 16;
    c.o_groups = 1;
    c.o_lora_rank = 16;
    c.index_n_heads = 2;
    c.index_head_dim = 32;
    c.index_topk = 2;
    c.n_routed_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 32;
    c.num_hash_layers = 1;
    c.hc_mult = 2;
    c.hc_sinkhorn_iters = 3;
    c.sliding_window = 8;
    c.fp8 = false;  // a GGUF holds no FP8; block-scale rules do not apply
    if (dsi::Status s = c.validate(); !s.is_ok()) {
        std::fprintf(stderr, "v4_fuzz_seed: %s\n", s.to_string().c_str());
        return 1;
    }
    const dsi::TokenizerFiles tok{R"({"model": {"vocab": {"a": 0, "b": 1}, "merges": []}})", "{}"};
    dsi::Status s = dsi::write_gguf_checkpoint(dsi::Env::default_env(), c, 1, tok, dsi::DType::kF16,
                                               argv[1], dsi::DType::kMXFP4);
    if (!s.is_ok()) {
        std::fprintf(stderr, "v4_fuzz_seed: %s\n", s.to_string().c_str());
        return 1;
    }
    return 0;
}
