#include "model/v41_config.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "model/config.h"
#include "model/internal/config_json.h"
#include "model/weights.h"

namespace dsi {

using internal::field_error;
using internal::positive_field;
using internal::read_opt;
using internal::read_req;
using nlohmann::json;

const char* v41_attn_kind_name(V41AttnKind k) {
    switch (k) {
        case V41AttnKind::kWindow:
            return "window";
        case V41AttnKind::kFull:
            return "full";
        case V41AttnKind::kReindex:
            return "reindex";
        case V41AttnKind::kReuse:
            return "reuse";
    }
    return "?";
}

namespace {

bool contains(const std::vector<int64_t>& v, int64_t x) {
    return std::find(v.begin(), v.end(), x) != v.end();
}

bool is_prime(int64_t n) {
    if (n < 2) return false;
    for (int64_t d = 2; d * d <= n; ++d) {
        if (n % d == 0) return false;
    }
    return true;
}

}  // namespace

int64_t v41_first_decoder_layer(const ModelConfig& c) {
    const auto& ids = c.v41.kv_source_layer_ids;
    return ids.empty() ? c.num_hidden_layers : *std::max_element(ids.begin(), ids.end());
}

V41AttnKind v41_attn_kind(const ModelConfig& c, int64_t layer) {
    if (c.compress_ratio(layer) == 0) return V41AttnKind::kWindow;
    if (contains(c.v41.kv_source_layer_ids, layer)) return V41AttnKind::kFull;
    if (contains(c.v41.index_source_layer_ids, layer)) return V41AttnKind::kReindex;
    return V41AttnKind::kReuse;
}

// The nearest layer at or below `layer` (in its half: encoder or decoder) of the kinds
// `accept` takes.
namespace {
template <typename Accept>
int64_t latest_in_half(const ModelConfig& c, int64_t layer, Accept accept) {
    if (c.compress_ratio(layer) == 0) return -1;
    const int64_t first = layer >= v41_first_decoder_layer(c) ? v41_first_decoder_layer(c) : 0;
    for (int64_t l = layer; l >= first; --l) {
        if (c.compress_ratio(l) > 0 && accept(v41_attn_kind(c, l))) return l;
    }
    return -1;
}
}  // namespace

int64_t v41_kv_source_of(const ModelConfig& c, int64_t layer) {
    return latest_in_half(c, layer, [](V41AttnKind k) { return k == V41AttnKind::kFull; });
}

int64_t v41_topk_source_of(const ModelConfig& c, int64_t layer) {
    return latest_in_half(c, layer, [](V41AttnKind k) {
        return k == V41AttnKind::kFull || k == V41AttnKind::kReindex;
    });
}

int64_t v41_engram_index(const ModelConfig& c, int64_t layer) {
    const auto& ids = c.v41.engram_layer_ids;
    auto it = std::find(ids.begin(), ids.end(), layer);
    return it == ids.end() ? -1 : static_cast<int64_t>(it - ids.begin());
}

std::vector<int64_t> v41_engram_moduli(const ModelConfig& c, int64_t e) {
    const V41Fields& f = c.v41;
    const int64_t per_layer = (f.engram_max_ngram_size - 1) * f.engram_n_heads;
    std::vector<int64_t> out;
    int64_t skip = e * per_layer;
    for (int64_t n = f.engram_vocab_size + 1; static_cast<int64_t>(out.size()) < per_layer; ++n) {
        if (!is_prime(n)) continue;
        if (skip > 0) {
            --skip;
            continue;
        }
        out.push_back(n);
    }
    return out;
}

int64_t v41_swa_row_bytes(const ModelConfig& c) { return c.head_dim + c.head_dim / 32; }

double v41_block_kv_bytes_per_token(const ModelConfig& c) {
    const double entry = static_cast<double>(c.head_dim / 2 + c.head_dim / 16 +
                                             c.index_head_dim / 2 + c.index_head_dim / 32);
    double bytes = 0;
    for (int64_t id : c.v41.kv_source_layer_ids) {
        bytes += entry / static_cast<double>(c.compress_ratio(id));
    }
    return bytes;
}

int64_t v41_partial_state_bytes(const ModelConfig& c) {
    int64_t bytes = 0;
    for (int64_t id : c.v41.kv_source_layer_ids) {
        const int64_t r = c.compress_ratio(id);
        if (r > 1) bytes += (r - 1) * 2 * c.head_dim * static_cast<int64_t>(sizeof(float));
    }
    return bytes;
}

// ---- config.json ----

Status internal::parse_v41_fields(const json& root, ModelConfig& c) {
    auto it = root.find("text_config");
    if (it == root.end() || !it->is_object()) {
        return invalid_argument("config.json: a " + c.architecture +
                                " config needs a 'text_config' object");
    }
    // Fields V4.1 files may keep at the top level (quantization_config, with
    // expert_dtype inside it; the special tokens) are read as if under text_config.
    json t = *it;
    for (const char* key : {"quantization_config", "vocab_size", "bos_token_id", "eos_token_id",
                            "tie_word_embeddings"}) {
        if (!t.contains(key) && root.contains(key)) t[key] = root[key];
    }
    if (!t.contains("expert_dtype") && t.contains("quantization_config") &&
        t["quantization_config"].is_object() && t["quantization_config"].contains("expert_dtype")) {
        t["expert_dtype"] = t["quantization_config"]["expert_dtype"];
    }
    DSI_RETURN_IF_ERROR(parse_v4_fields(t, c));
    V41Fields& f = c.v41;
    DSI_RETURN_IF_ERROR(read_req(t, "kv_source_layer_ids", f.kv_source_layer_ids));
    DSI_RETURN_IF_ERROR(read_req(t, "index_source_layer_ids", f.index_source_layer_ids));
    DSI_RETURN_IF_ERROR(read_opt(t, "candidate_source_layer_id", f.candidate_source_layer_id));
    DSI_RETURN_IF_ERROR(read_opt(t, "candidate_topk_blocks", f.candidate_topk_blocks));
    DSI_RETURN_IF_ERROR(read_opt(t, "candidate_block_size", f.candidate_block_size));
    DSI_RETURN_IF_ERROR(read_opt(t, "engram_layer_ids", f.engram_layer_ids));
    DSI_RETURN_IF_ERROR(read_opt(t, "engram_num_embeddings", f.engram_num_embeddings));
    DSI_RETURN_IF_ERROR(read_opt(t, "engram_max_ngram_size", f.engram_max_ngram_size));
    DSI_RETURN_IF_ERROR(read_opt(t, "engram_vocab_size", f.engram_vocab_size));
    DSI_RETURN_IF_ERROR(read_opt(t, "engram_n_heads", f.engram_n_heads));
    DSI_RETURN_IF_ERROR(read_opt(t, "engram_head_dim", f.engram_head_dim));
    DSI_RETURN_IF_ERROR(read_opt(t, "engram_pad_token_id", f.engram_pad_token_id));
    DSI_RETURN_IF_ERROR(
        read_opt(t, "engram_compressed_vocab_size", f.engram_compressed_vocab_size));
    DSI_RETURN_IF_ERROR(read_opt(t, "dspark_block_size", f.dspark_block_size));
    DSI_RETURN_IF_ERROR(read_opt(t, "dspark_noise_token_id", f.dspark_noise_token_id));
    DSI_RETURN_IF_ERROR(read_opt(t, "dspark_target_layer_ids", f.dspark_target_layer_ids));
    DSI_RETURN_IF_ERROR(read_opt(t, "dspark_markov_rank", f.dspark_markov_rank));
    DSI_RETURN_IF_ERROR(read_opt(t, "dspark_n_routed_experts", f.dspark_n_routed_experts));
    DSI_RETURN_IF_ERROR(read_opt(t, "dspark_num_experts_per_tok", f.dspark_num_experts_per_tok));
    DSI_RETURN_IF_ERROR(read_opt(root, "image_token_id", f.image_token_id));
    if (auto v = root.find("vision_config"); v != root.end() && !v->is_null()) {
        if (!v->is_object()) {
            return invalid_argument("config.json: field 'vision_config' must be an object");
        }
        V41VisionConfig& vc = f.vision;
        vc.present = true;
        DSI_RETURN_IF_ERROR(read_req(*v, "num_hidden_layers", vc.num_hidden_layers));
        DSI_RETURN_IF_ERROR(read_req(*v, "hidden_size", vc.hidden_size));
        DSI_RETURN_IF_ERROR(read_req(*v, "num_attention_heads", vc.num_attention_heads));
        DSI_RETURN_IF_ERROR(read_req(*v, "patch_size", vc.patch_size));
        DSI_RETURN_IF_ERROR(read_opt(*v, "image_size", vc.image_size));
        DSI_RETURN_IF_ERROR(read_opt(*v, "spatial_merge_size", vc.spatial_merge_size));
    }
    return Status::ok();
}

std::string internal::to_v41_config_json(const ModelConfig& c) {
    json t = v4_config_json(c);
    json q = t.contains("quantization_config") ? t["quantization_config"] : json();
    for (const char* key : {"architectures", "model_type", "quantization_config", "num_hash_layers",
                            "expert_dtype"}) {
        t.erase(key);
    }
    const V41Fields& f = c.v41;
    t["kv_source_layer_ids"] = f.kv_source_layer_ids;
    t["index_source_layer_ids"] = f.index_source_layer_ids;
    t["candidate_source_layer_id"] = f.candidate_source_layer_id;
    t["candidate_topk_blocks"] = f.candidate_topk_blocks;
    t["candidate_block_size"] = f.candidate_block_size;
    t["engram_layer_ids"] = f.engram_layer_ids;
    t["engram_num_embeddings"] = f.engram_num_embeddings;
    t["engram_max_ngram_size"] = f.engram_max_ngram_size;
    t["engram_vocab_size"] = f.engram_vocab_size;
    t["engram_n_heads"] = f.engram_n_heads;
    t["engram_head_dim"] = f.engram_head_dim;
    t["engram_pad_token_id"] = f.engram_pad_token_id;
    t["engram_compressed_vocab_size"] = f.engram_compressed_vocab_size;
    t["dspark_block_size"] = f.dspark_block_size;
    t["dspark_noise_token_id"] = f.dspark_noise_token_id;
    t["dspark_target_layer_ids"] = f.dspark_target_layer_ids;
    t["dspark_markov_rank"] = f.dspark_markov_rank;
    t["dspark_n_routed_experts"] = f.dspark_n_routed_experts;
    t["dspark_num_experts_per_tok"] = f.dspark_num_experts_per_tok;
    json j;
    j["architectures"] = {c.architecture};
    j["model_type"] = "deepseek_v41";
    if (f.image_token_id >= 0) j["image_token_id"] = f.image_token_id;
    j["text_config"] = t;
    if (f.vision.present) {
        j["vision_config"] = {{"num_hidden_layers", f.vision.num_hidden_layers},
                              {"hidden_size", f.vision.hidden_size},
                              {"num_attention_heads", f.vision.num_attention_heads},
                              {"patch_size", f.vision.patch_size},
                              {"image_size", f.vision.image_size},
                              {"spatial_merge_size", f.vision.spatial_merge_size}};
    }
    if (!q.is_null()) {
        q["expert_dtype"] = c.expert_fp4 ? "fp4" : "fp8";
        j["quantization_config"] = q;
    } else {
        j["text_config"]["expert_dtype"] = c.expert_fp4 ? "fp4" : "fp8";
    }
    return j.dump(2) + "\n";
}

// ---- validation ----

namespace {

// Layer ids: strictly increasing, each a main layer.
Status check_layer_ids(const char* field, const std::vector<int64_t>& ids, int64_t layers,
                       bool allow_empty) {
    if (ids.empty() && !allow_empty) return field_error(field, "is empty");
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= layers) {
            return field_error(field, "entry " + std::to_string(ids[i]) +
                                          " is not a layer in [0, " + std::to_string(layers) + ")");
        }
        if (i > 0 && ids[i] <= ids[i - 1]) return field_error(field, "must be strictly increasing");
    }
    return Status::ok();
}

}  // namespace

Status ModelConfig::validate_v41() const {
    DSI_RETURN_IF_ERROR(validate_v4_shared());
    const V41Fields& f = v41;
    const int64_t L = num_hidden_layers;
    if (num_nextn_predict_layers < 0) {
        return field_error("text_config.num_nextn_predict_layers", "must be >= 0");
    }
    if (static_cast<int64_t>(compress_ratios.size()) != L + num_nextn_predict_layers) {
        return field_error(
            "text_config.compress_ratios",
            "has " + std::to_string(compress_ratios.size()) +
                " entries, expected num_hidden_layers + num_nextn_predict_layers = " +
                std::to_string(L + num_nextn_predict_layers));
    }
    for (size_t i = 0; i < compress_ratios.size(); ++i) {
        const int64_t r = compress_ratios[i];
        if (r < 0 || r > 2) {
            return field_error("text_config.compress_ratios", "entry " + std::to_string(i) +
                                                                  " is " + std::to_string(r) +
                                                                  " (CSA2 supports 0, 1, 2)");
        }
        if (r != 0 && static_cast<int64_t>(i) >= L) {
            return field_error("text_config.compress_ratios",
                               "DSpark entry " + std::to_string(i) + " must be 0 (window only)");
        }
    }
    if (head_dim % 32 != 0) {
        return field_error("text_config.head_dim",
                           "must be a multiple of 32 (MXFP8 window rows, FP4 main KV)");
    }
    if (num_hash_layers != 0) {
        return field_error("text_config.num_hash_layers", "must be absent or 0 for V4.1");
    }
    DSI_RETURN_IF_ERROR(
        check_layer_ids("text_config.kv_source_layer_ids", f.kv_source_layer_ids, L, false));
    DSI_RETURN_IF_ERROR(
        check_layer_ids("text_config.index_source_layer_ids", f.index_source_layer_ids, L, false));
    const int64_t dec = v41_first_decoder_layer(*this);
    if (dec < 1) return field_error("text_config.kv_source_layer_ids", "leaves no encoder layer");
    for (int64_t id : f.kv_source_layer_ids) {
        if (compress_ratio(id) == 0) {
            return field_error("text_config.kv_source_layer_ids",
                               "names layer " + std::to_string(id) + ", which has ratio 0");
        }
        if (!contains(f.index_source_layer_ids, id)) {
            return field_error("text_config.index_source_layer_ids",
                               "must contain every kv source (misses " + std::to_string(id) + ")");
        }
    }
    bool any_reindex = false, any_compressed = false;
    for (int64_t l = 0; l < L; ++l) {
        if (compress_ratio(l) == 0) {
            if (contains(f.index_source_layer_ids, l)) {
                return field_error("text_config.index_source_layer_ids",
                                   "names layer " + std::to_string(l) + ", which has ratio 0");
            }
            continue;
        }
        any_compressed = true;
        const int64_t src = v41_kv_source_of(*this, l);
        if (src < 0 || compress_ratio(src) != compress_ratio(l)) {
            return field_error("text_config.kv_source_layer_ids",
                               "gives compressed layer " + std::to_string(l) +
                                   " no kv source of its ratio before it in its " +
                                   (l >= dec ? "decoder" : "encoder"));
        }
        if (v41_attn_kind(*this, l) == V41AttnKind::kReindex) {
            any_reindex = true;
            if (l < dec) {
                return field_error("text_config.index_source_layer_ids",
                                   "names encoder layer " + std::to_string(l) +
                                       " as Reindex (candidates exist in the decoder only)");
            }
        }
    }
    if (any_compressed) {
        DSI_RETURN_IF_ERROR(positive_field("text_config.index_n_heads", index_n_heads));
        DSI_RETURN_IF_ERROR(positive_field("text_config.index_topk", index_topk));
        if (index_head_dim <= 0 || index_head_dim % 32 != 0 || index_head_dim < qk_rope_head_dim) {
            return field_error("text_config.index_head_dim",
                               "must be a positive multiple of 32 (MXFP4) and >= qk_rope_head_dim");
        }
        if (!(compress_rope_theta > 1)) {
            return field_error("text_config.compress_rope_theta", "must be > 1");
        }
    }
    if (any_reindex) {
        if (f.candidate_source_layer_id != dec) {
            return field_error("text_config.candidate_source_layer_id",
                               "must be the decoder's kv source " + std::to_string(dec) + ", got " +
                                   std::to_string(f.candidate_source_layer_id));
        }
        DSI_RETURN_IF_ERROR(
            positive_field("text_config.candidate_topk_blocks", f.candidate_topk_blocks));
        DSI_RETURN_IF_ERROR(
            positive_field("text_config.candidate_block_size", f.candidate_block_size));
    }
    // Engram.
    DSI_RETURN_IF_ERROR(
        check_layer_ids("text_config.engram_layer_ids", f.engram_layer_ids, L, true));
    if (!f.engram_layer_ids.empty()) {
        if (f.engram_num_embeddings.size() != f.engram_layer_ids.size()) {
            return field_error("text_config.engram_num_embeddings",
                               "must have one entry per engram layer (" +
                                   std::to_string(f.engram_layer_ids.size()) + ")");
        }
        if (f.engram_max_ngram_size < 2) {
            return field_error("text_config.engram_max_ngram_size", "must be >= 2");
        }
        DSI_RETURN_IF_ERROR(positive_field("text_config.engram_n_heads", f.engram_n_heads));
        DSI_RETURN_IF_ERROR(positive_field("text_config.engram_vocab_size", f.engram_vocab_size));
        DSI_RETURN_IF_ERROR(positive_field("text_config.engram_compressed_vocab_size",
                                           f.engram_compressed_vocab_size));
        if (f.engram_head_dim <= 0 || f.engram_head_dim % 32 != 0) {
            return field_error("text_config.engram_head_dim", "must be a positive multiple of 32");
        }
        if (f.engram_pad_token_id < 0 || f.engram_pad_token_id >= f.engram_compressed_vocab_size) {
            return field_error("text_config.engram_pad_token_id",
                               "must be inside the compressed vocabulary");
        }
        if (f.engram_vocab_size > (int64_t{1} << 40)) {
            return field_error("text_config.engram_vocab_size", "is too large");
        }
        for (size_t e = 0; e < f.engram_layer_ids.size(); ++e) {
            const std::vector<int64_t> m = v41_engram_moduli(*this, static_cast<int64_t>(e));
            const int64_t rows = std::accumulate(m.begin(), m.end(), int64_t{0});
            if (f.engram_num_embeddings[e] != rows) {
                return field_error("text_config.engram_num_embeddings",
                                   "entry " + std::to_string(e) + " is " +
                                       std::to_string(f.engram_num_embeddings[e]) +
                                       "; the sub-tables (consecutive primes above "
                                       "engram_vocab_size) hold " +
                                       std::to_string(rows));
            }
        }
    }
    // DSpark.
    if (num_nextn_predict_layers > 0) {
        DSI_RETURN_IF_ERROR(positive_field("text_config.dspark_block_size", f.dspark_block_size));
        DSI_RETURN_IF_ERROR(positive_field("text_config.dspark_markov_rank", f.dspark_markov_rank));
        DSI_RETURN_IF_ERROR(
            positive_field("text_config.dspark_n_routed_experts", f.dspark_n_routed_experts));
        DSI_RETURN_IF_ERROR(
            positive_field("text_config.dspark_num_experts_per_tok", f.dspark_num_experts_per_tok));
        if (f.dspark_num_experts_per_tok > f.dspark_n_routed_experts) {
            return field_error("text_config.dspark_num_experts_per_tok",
                               "exceeds dspark_n_routed_experts");
        }
        if (f.dspark_noise_token_id < 0 || f.dspark_noise_token_id >= vocab_size) {
            return field_error("text_config.dspark_noise_token_id", "is outside the vocabulary");
        }
        DSI_RETURN_IF_ERROR(check_layer_ids("text_config.dspark_target_layer_ids",
                                            f.dspark_target_layer_ids, L, false));
    }
    if (f.image_token_id != -1 && (f.image_token_id < 0 || f.image_token_id >= vocab_size)) {
        return field_error("image_token_id", "is outside the vocabulary");
    }
    if (f.vision.present) {
        const V41VisionConfig& v = f.vision;
        DSI_RETURN_IF_ERROR(positive_field("vision_config.num_hidden_layers", v.num_hidden_layers));
        DSI_RETURN_IF_ERROR(positive_field("vision_config.hidden_size", v.hidden_size));
        DSI_RETURN_IF_ERROR(
            positive_field("vision_config.num_attention_heads", v.num_attention_heads));
        DSI_RETURN_IF_ERROR(positive_field("vision_config.patch_size", v.patch_size));
        DSI_RETURN_IF_ERROR(
            positive_field("vision_config.spatial_merge_size", v.spatial_merge_size));
        if (v.hidden_size % v.num_attention_heads != 0) {
            return field_error("vision_config.num_attention_heads", "must divide hidden_size");
        }
        if (v.image_size < 0 || (v.image_size > 0 && v.image_size % v.patch_size != 0)) {
            return field_error("vision_config.image_size", "must be a multiple of patch_size");
        }
    }
    return Status::ok();
}

}  // namespace dsi
