// DeepSeek-V4.1-Flash configuration (architectures ["DeepseekV41ForCausalLM"], model_type
// deepseek_v41; reference deepseek_v4.md §7, docs/models_v41.md). The fields V4.1 shares
// with V4 (widths, MQA head, window, compress_ratios, MoE, mHC, RoPE, FP8) live in
// ModelConfig itself (read from `text_config`); this header holds what only V4.1 has:
// the causal encoder / decoder split (CED) and CSA2 layer roles, the decoder's
// hierarchical indexer, Engram, the DSpark draft blocks and `vision_config`.
//
// CED layout (§7.2): the decoder starts at max(kv_source_layer_ids) (layer 20 of 40),
// the only decoder KV source; the layers before it are the causal encoder. Among
// compressed layers, the kv sources are Full (own compressor + indexer), the other
// index sources are Reindex (own indexer query over the latest Full layer's keys), the
// rest Reuse (the latest Full layer's main KV and the latest Full / Reindex top-k).
// Thread model: plain value types.
#pragma once

#include <cstdint>
#include <vector>

namespace dsi {

struct ModelConfig;

// vision_config (§7.1): read and checked; no vision encoder runs yet.
struct V41VisionConfig {
    bool present = false;
    int64_t num_hidden_layers = 0;
    int64_t hidden_size = 0;
    int64_t num_attention_heads = 0;
    int64_t patch_size = 0;
    int64_t image_size = 0;          // 0: not given
    int64_t spatial_merge_size = 1;  // the pixel-unshuffle factor (3 in V4.1)
};

struct V41Fields {
    // Layer roles (CSA2).
    std::vector<int64_t> kv_source_layer_ids;     // Full layers; the last starts the decoder
    std::vector<int64_t> index_source_layer_ids;  // Full + Reindex layers
    // Hierarchical sparse indexer: the decoder's source picks candidate_topk_blocks blocks
    // of candidate_block_size positions by their best score; Reindex layers score inside.
    int64_t candidate_source_layer_id = -1;
    int64_t candidate_topk_blocks = 0;
    int64_t candidate_block_size = 0;
    // Engram (hashed n-gram memory) before the listed layers.
    std::vector<int64_t> engram_layer_ids;
    std::vector<int64_t> engram_num_embeddings;  // rows of each layer's table
    int64_t engram_max_ngram_size = 0;           // orders 2..max
    int64_t engram_vocab_size = 0;               // sub-table moduli: primes above this
    int64_t engram_n_heads = 0;
    int64_t engram_head_dim = 0;
    int64_t engram_pad_token_id = 0;
    int64_t engram_compressed_vocab_size = 0;
    // DSpark draft blocks (num_nextn_predict_layers of them; loaded, not run).
    int64_t dspark_block_size = 0;
    int64_t dspark_noise_token_id = 0;
    std::vector<int64_t> dspark_target_layer_ids;
    int64_t dspark_markov_rank = 0;
    int64_t dspark_n_routed_experts = 0;
    int64_t dspark_num_experts_per_tok = 0;
    int64_t image_token_id = -1;  // top level; -1: not given
    V41VisionConfig vision;
};

enum class V41AttnKind : uint8_t {
    kWindow,   // ratio 0: sliding window only
    kFull,     // a kv source: own compressor (main KV + index K) and indexer
    kReindex,  // own indexer query over the latest Full layer's index K
    kReuse,    // the latest Full layer's main KV and the latest Full / Reindex top-k
};
const char* v41_attn_kind_name(V41AttnKind k);

// REQUIRES: config.is_v41() and validated (the functions below).
// The first decoder layer: max(kv_source_layer_ids).
int64_t v41_first_decoder_layer(const ModelConfig& c);
V41AttnKind v41_attn_kind(const ModelConfig& c, int64_t layer);
// The Full layer whose main KV / index K `layer` reads (itself for Full), -1 for window.
int64_t v41_kv_source_of(const ModelConfig& c, int64_t layer);
// The Full / Reindex layer whose top-k `layer` uses (itself unless Reuse), -1 for window.
int64_t v41_topk_source_of(const ModelConfig& c, int64_t layer);
// Index of `layer` in engram_layer_ids, or -1.
int64_t v41_engram_index(const ModelConfig& c, int64_t layer);
// The moduli of engram layer `e`'s sub-tables (order-major: n = 2..max, heads 0..h-1):
// consecutive primes above engram_vocab_size, each engram layer continuing where the
// previous one stopped (their sum is engram_num_embeddings[e]; checked by validate()).
std::vector<int64_t> v41_engram_moduli(const ModelConfig& c, int64_t e);
// One SWA row as MXFP8 over all head_dim values: e4m3 + one ue8m0 scale per 32 (528 B).
int64_t v41_swa_row_bytes(const ModelConfig& c);
// Block KV per token in the production formats (§7.3): per Full layer, (main entry 288 B
// + index key 68 B at head_dim 512 / index_head_dim 128) / its ratio. V4.1-Flash: 890 B.
double v41_block_kv_bytes_per_token(const ModelConfig& c);
// The encoder Full layers' partial compressor groups: (ratio - 1) pending tokens of f32
// kv and score rows of head_dim each.
int64_t v41_partial_state_bytes(const ModelConfig& c);

}  // namespace dsi
