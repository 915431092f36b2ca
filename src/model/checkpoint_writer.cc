#include "model/checkpoint_writer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/gguf_names.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace dsi {
namespace {

using nlohmann::json;

std::vector<uint8_t> to_bytes(DType dtype, const std::vector<float>& v) {
    std::vector<uint8_t> out(
        static_cast<size_t>(dtype_row_bytes(dtype, static_cast<int64_t>(v.size()))));
    switch (dtype) {
        case DType::kF32:
            std::memcpy(out.data(), v.data(), out.size());
            break;
        case DType::kBF16:
            for (size_t i = 0; i < v.size(); ++i) {
                uint16_t h = f32_to_bf16(v[i]);
                std::memcpy(out.data() + 2 * i, &h, 2);
            }
            break;
        case DType::kF16:
            for (size_t i = 0; i < v.size(); ++i) {
                uint16_t h = f32_to_f16(v[i]);
                std::memcpy(out.data() + 2 * i, &h, 2);
            }
            break;
        case DType::kQ8_0:
            quantize_row_q8_0(v.data(), out.data(), static_cast<int64_t>(v.size()));
            break;
        case DType::kMXFP4:
            quantize_row_mxfp4(v.data(), out.data(), static_cast<int64_t>(v.size()));
            break;
        default:
            DSI_CHECK(false, "to_bytes: unsupported dtype ", dtype_name(dtype));
    }
    return out;
}

bool is_matrix(const TensorSpec& s) {
    return s.shape.size() == 2 && s.name.find("mlp.gate.weight") == std::string::npos;
}

}  // namespace

Result<TokenizerFiles> read_tokenizer_files(Env* env, const std::string& dir) {
    TokenizerFiles t;
    DSI_ASSIGN_OR_RETURN(t.tokenizer_json, env->read_file(dir + "/tokenizer.json"));
    DSI_ASSIGN_OR_RETURN(t.tokenizer_config_json, env->read_file(dir + "/tokenizer_config.json"));
    return t;
}

namespace {

// config.json, generation_config.json and the tokenizer files.
Status write_hf_side_files(Env* env, const ModelConfig& c, const TokenizerFiles& tokenizer,
                           const std::string& dir) {
    DSI_RETURN_IF_ERROR(env->write_file(dir + "/config.json", to_hf_config_json(c)));
    json gen = {
        {"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_id}, {"do_sample", false}};
    DSI_RETURN_IF_ERROR(env->write_file(dir + "/generation_config.json", gen.dump(2) + "\n"));
    DSI_RETURN_IF_ERROR(env->write_file(dir + "/tokenizer.json", tokenizer.tokenizer_json));
    return env->write_file(dir + "/tokenizer_config.json", tokenizer.tokenizer_config_json);
}

// DeepSeek V4 in the official layout (model/weights.h deepseek_v4_tensor_specs): FP8
// weights with "<x>.scale" F8_E8M0 per 128x128 block, FP4 experts as I8 pairs with
// "<x>.scale" F8_E8M0 per 32, tid2eid I64, the rest BF16 / F32.
Status write_v4_safetensors(Env* env, const ModelConfig& c, uint64_t seed, const std::string& dir,
                            uint64_t max_shard_bytes) {
    std::vector<std::vector<uint8_t>> storage;
    std::vector<SafetensorsTensor> tensors;
    const std::vector<V4TensorSpec> specs = deepseek_v4_tensor_specs(c);
    storage.reserve(specs.size() * 2);
    for (const V4TensorSpec& spec : specs) {
        V4SyntheticTensor t = synthetic_v4_tensor(c, spec, seed);
        switch (t.dtype) {
            case DType::kF8E4M3:
            case DType::kI8:
                storage.push_back(std::move(t.codes));
                tensors.push_back({spec.name, t.dtype, t.stored_shape, storage.back()});
                storage.push_back(std::move(t.scales));
                tensors.push_back(
                    {v4_scale_name(spec.name), DType::kE8M0, t.scale_shape, storage.back()});
                break;
            case DType::kI64: {
                std::vector<uint8_t> bytes(t.ints.size() * 8);
                for (size_t i = 0; i < t.ints.size(); ++i) {
                    const int64_t v = t.ints[i];
                    std::memcpy(bytes.data() + 8 * i, &v, 8);
                }
                storage.push_back(std::move(bytes));
                tensors.push_back({spec.name, DType::kI64, t.stored_shape, storage.back()});
                break;
            }
            default:
                storage.push_back(to_bytes(t.dtype, t.values));
                tensors.push_back({spec.name, t.dtype, t.stored_shape, storage.back()});
        }
    }
    return write_sharded_safetensors(env, dir, tensors, max_shard_bytes, {{"format", "pt"}});
}

// FP8 codes come from the synthetic generator only (`fp8_seed`); everything else
// from `values`.
Status write_hf(Env* env, const ModelConfig& c, const TensorValues& values,
                const uint64_t* fp8_seed, const TokenizerFiles& tokenizer, const std::string& dir,
                uint64_t max_shard_bytes) {
    if ((c.fp8 || c.v4_layout()) && fp8_seed == nullptr) {
        return invalid_argument("write_hf_checkpoint: FP8 / V4 output needs the synthetic writer");
    }
    DSI_RETURN_IF_ERROR(env->create_dirs(dir));
    if (c.v4_layout()) {
        DSI_RETURN_IF_ERROR(write_v4_safetensors(env, c, *fp8_seed, dir, max_shard_bytes));
        return write_hf_side_files(env, c, tokenizer, dir);
    }
    std::vector<std::vector<uint8_t>> storage;
    std::vector<SafetensorsTensor> tensors;
    const std::vector<TensorSpec> specs = deepseek_tensor_specs(c);
    storage.reserve(specs.size() * 2);
    for (const TensorSpec& spec : specs) {
        if (c.fp8 && spec.quantizable) {
            Fp8Matrix m = synthetic_fp8(c, spec, *fp8_seed);
            storage.push_back(std::move(m.codes));
            tensors.push_back({spec.name, DType::kF8E4M3, spec.shape, storage.back()});
            std::vector<int64_t> sshape = {
                (spec.shape[0] + c.fp8_block_rows - 1) / c.fp8_block_rows,
                (spec.shape[1] + c.fp8_block_cols - 1) / c.fp8_block_cols};
            storage.push_back(to_bytes(DType::kF32, m.scale_inv));
            tensors.push_back({spec.name + "_scale_inv", DType::kF32, sshape, storage.back()});
            continue;
        }
        const bool keep_f32 = spec.name.find("e_score_correction_bias") != std::string::npos;
        const DType dtype = keep_f32 ? DType::kF32 : DType::kBF16;
        DSI_ASSIGN_OR_RETURN(std::vector<float> v, values(spec));
        if (static_cast<int64_t>(v.size()) != shape_numel(spec.shape)) {
            return invalid_argument("write_hf_checkpoint: wrong size for " + spec.name);
        }
        storage.push_back(to_bytes(dtype, v));
        tensors.push_back({spec.name, dtype, spec.shape, storage.back()});
    }
    DSI_RETURN_IF_ERROR(
        write_sharded_safetensors(env, dir, tensors, max_shard_bytes, {{"format", "pt"}}));
    return write_hf_side_files(env, c, tokenizer, dir);
}

TensorValues synthetic_values(const ModelConfig& c, uint64_t seed) {
    return [&c, seed](const TensorSpec& spec) -> Result<std::vector<float>> {
        return synthetic_tensor(c, spec, seed);
    };
}

}  // namespace

Status write_hf_checkpoint(Env* env, const ModelConfig& c, uint64_t seed,
                           const TokenizerFiles& tokenizer, const std::string& dir,
                           uint64_t max_shard_bytes) {
    return write_hf(env, c, synthetic_values(c, seed), &seed, tokenizer, dir, max_shard_bytes);
}

Status write_hf_checkpoint(Env* env, const ModelConfig& c, const TensorValues& values,
                           const TokenizerFiles& tokenizer, const std::string& dir,
                           uint64_t max_shard_bytes) {
    return write_hf(env, c, values, nullptr, tokenizer, dir, max_shard_bytes);
}

namespace {

// llama.cpp token types.
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenUserDefined = 4;
constexpr int32_t kTokenUnused = 5;

Status add_tokenizer_metadata(const ModelConfig& c, const TokenizerFiles& files, GgufWriter& w) {
    json tok = json::parse(files.tokenizer_json, nullptr, false);
    if (tok.is_discarded() || !tok.contains("model") || !tok["model"].contains("vocab")) {
        return invalid_argument("tokenizer.json: not a BPE tokenizer file");
    }
    std::vector<std::string> tokens(static_cast<size_t>(c.vocab_size));
    std::vector<int32_t> types(static_cast<size_t>(c.vocab_size), kTokenUnused);
    std::vector<bool> set(static_cast<size_t>(c.vocab_size), false);
    for (auto& [text, id_json] : tok["model"]["vocab"].items()) {
        int64_t id = id_json.get<int64_t>();
        if (id < 0 || id >= c.vocab_size)
            return invalid_argument("tokenizer.json: id out of range");
        tokens[id] = text;
        types[id] = kTokenNormal;
        set[id] = true;
    }
    for (const json& a : tok.value("added_tokens", json::array())) {
        int64_t id = a.at("id").get<int64_t>();
        if (id < 0 || id >= c.vocab_size)
            return invalid_argument("tokenizer.json: id out of range");
        tokens[id] = a.at("content").get<std::string>();
        types[id] = a.value("special", false) ? kTokenControl : kTokenUserDefined;
        set[id] = true;
    }
    for (int64_t i = 0; i < c.vocab_size; ++i) {
        if (!set[i]) tokens[i] = "[PAD" + std::to_string(i) + "]";
    }
    std::vector<std::string> merges;
    for (const json& m : tok["model"].value("merges", json::array())) {
        if (m.is_string()) {
            merges.push_back(m.get<std::string>());
        } else if (m.is_array() && m.size() == 2) {
            merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
        } else {
            return invalid_argument("tokenizer.json: malformed merge");
        }
    }
    w.add_kv("tokenizer.ggml.model", std::string("gpt2"));
    w.add_kv("tokenizer.ggml.pre", std::string("deepseek-v3"));
    w.add_kv("tokenizer.ggml.tokens", GgufArray(std::move(tokens)));
    w.add_kv("tokenizer.ggml.token_type", GgufArray(std::move(types)));
    w.add_kv("tokenizer.ggml.merges", GgufArray(std::move(merges)));
    w.add_kv("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(c.bos_token_id));
    w.add_kv("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_id));
    w.add_kv("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(c.eos_token_id));
    w.add_kv("tokenizer.ggml.add_bos_token", true);
    w.add_kv("tokenizer.ggml.add_eos_token", false);
    return Status::ok();
}

// Merged expert tensors [experts, rows, cols], gathered in expert order.
// The routed experts of one GGUF tensor ([experts, rows, cols]), kept as encoded bytes
// expert by expert: each expert's slice is whole rows, so the encoded tensor is the
// concatenation of the slices' encodings, and the writer never holds a model's experts
// as f32 (22 GB for the `medium` preset).
struct MergedExperts {
    explicit MergedExperts(DType encoding) : dtype(encoding) {}
    DType dtype;
    std::map<std::string, std::pair<std::vector<int64_t>, std::vector<uint8_t>>> tensors;
    std::vector<std::string> order;

    void add(const std::string& name, int64_t experts, const std::vector<int64_t>& shape,
             const std::vector<float>& v) {
        auto& [s, bytes] = tensors[name];
        const std::vector<uint8_t> encoded = to_bytes(dtype, v);
        if (s.empty()) {
            s = {experts, shape[0], shape[1]};
            bytes.reserve(encoded.size() * static_cast<size_t>(experts));
            order.push_back(name);
        }
        bytes.insert(bytes.end(), encoded.begin(), encoded.end());
    }
    void write(GgufWriter& w) {
        for (const std::string& name : order) {
            auto& [s, bytes] = tensors[name];
            w.add_tensor(name, dtype, s, bytes);
            bytes = {};
        }
    }
};

Status write_gguf_file(Env* env, const GgufWriter& w, const std::string& path) {
    size_t slash = path.rfind('/');
    if (slash != std::string::npos) DSI_RETURN_IF_ERROR(env->create_dirs(path.substr(0, slash)));
    return w.write(env, path);
}

// The routed experts' GGUF type; INVALID_ARGUMENT for an unsupported pair.
Result<DType> gguf_expert_dtype(const ModelConfig& c, DType matrix_dtype,
                                std::optional<DType> expert_dtype) {
    if (matrix_dtype != DType::kF32 && matrix_dtype != DType::kF16 &&
        matrix_dtype != DType::kBF16 && matrix_dtype != DType::kQ8_0) {
        return invalid_argument("GGUF matrix dtype must be f32, f16, bf16 or q8_0");
    }
    const DType exps_dtype = expert_dtype.value_or(matrix_dtype);
    if (exps_dtype != matrix_dtype && exps_dtype != DType::kMXFP4 && exps_dtype != DType::kF32 &&
        exps_dtype != DType::kF16 && exps_dtype != DType::kBF16 && exps_dtype != DType::kQ8_0) {
        return invalid_argument("GGUF expert dtype must be f32, f16, bf16, q8_0 or mxfp4");
    }
    if (dtype_block_elems(exps_dtype) > 1 &&
        (c.hidden_size % 32 != 0 || c.moe_intermediate_size % 32 != 0)) {
        return invalid_argument("GGUF expert dtype " + std::string(dtype_name(exps_dtype)) +
                                " needs hidden_size and moe_intermediate_size % 32 == 0");
    }
    return exps_dtype;
}

// llama.cpp deepseek4 (docs/models.md): every block (the MTP layer last, its e_proj and
// h_proj concatenated into nextn.eh_proj; its hc_head has no GGUF counterpart), matrices
// in matrix_dtype, routed experts merged in the expert dtype, tid2eid I32, the rest F32.
Status write_v4_gguf(Env* env, const ModelConfig& c, uint64_t seed, const TokenizerFiles& tokenizer,
                     DType matrix_dtype, const std::string& path,
                     std::optional<DType> expert_dtype) {
    DSI_ASSIGN_OR_RETURN(DType exps_dtype, gguf_expert_dtype(c, matrix_dtype, expert_dtype));
    GgufWriter w;
    for (auto& [k, v] : gguf_metadata_for_config(c, "dsinfer synthetic")) w.add_kv(k, v);
    DSI_RETURN_IF_ERROR(add_tokenizer_metadata(c, tokenizer, w));
    MergedExperts merged(exps_dtype);
    std::map<std::string, std::array<std::vector<float>, 2>> halves;  // eh_proj parts
    for (const V4TensorSpec& spec : deepseek_v4_tensor_specs(c)) {
        std::optional<GgufTensorRef> ref = gguf_tensor_for_hf_name(c, spec.name);
        if (!ref) continue;  // the MTP layer's hc_head
        V4SyntheticTensor t = synthetic_v4_tensor(c, spec, seed);
        if (ref->col_half >= 0) {
            auto& parts = halves[ref->gguf_name];
            parts[static_cast<size_t>(ref->col_half)] = std::move(t.values);
            if (parts[0].empty() || parts[1].empty()) continue;
            const int64_t rows = spec.shape[0], cols = spec.shape[1];
            std::vector<float> joined(static_cast<size_t>(rows * 2 * cols));
            for (int64_t r = 0; r < rows; ++r) {
                for (size_t h = 0; h < 2; ++h) {
                    std::copy_n(parts[h].begin() + r * cols, cols,
                                joined.begin() + (2 * r + static_cast<int64_t>(h)) * cols);
                }
            }
            const DType dtype =
                dtype_block_elems(matrix_dtype) > 1 && cols % 32 != 0 ? DType::kF32 : matrix_dtype;
            w.add_tensor(ref->gguf_name, dtype, {rows, 2 * cols}, to_bytes(dtype, joined));
            halves.erase(ref->gguf_name);
            continue;
        }
        if (ref->expert >= 0) {
            merged.add(ref->gguf_name, c.n_routed_experts, spec.shape, t.values);
            continue;
        }
        if (spec.storage == V4Storage::kI64) {
            std::vector<uint8_t> bytes(t.ints.size() * 4);
            std::memcpy(bytes.data(), t.ints.data(), bytes.size());
            w.add_tensor(ref->gguf_name, DType::kI32, spec.shape, bytes);
            continue;
        }
        // Projections take matrix_dtype; the router, hc_*, ape, sinks, norms stay F32.
        const bool matrix = spec.shape.size() == 2 &&
                            (spec.storage == V4Storage::kFp8 || spec.storage == V4Storage::kBF16) &&
                            !spec.name.ends_with("ffn.gate.weight");
        DType dtype = matrix ? matrix_dtype : DType::kF32;
        if (dtype_block_elems(dtype) > 1 && spec.shape.back() % 32 != 0) dtype = DType::kF32;
        w.add_tensor(ref->gguf_name, dtype, spec.shape, to_bytes(dtype, t.values));
    }
    merged.write(w);
    return write_gguf_file(env, w, path);
}

}  // namespace

Status write_gguf_checkpoint(Env* env, const ModelConfig& c, uint64_t seed,
                             const TokenizerFiles& tokenizer, DType matrix_dtype,
                             const std::string& path, std::optional<DType> expert_dtype,
                             std::optional<DType> attn_kv_b_dtype) {
    if (c.is_v41()) {
        return unimplemented(
            "write_gguf_checkpoint: DeepSeek V4.1 has no GGUF layout yet "
            "(write the HF checkpoint)");
    }
    if (c.is_v4()) return write_v4_gguf(env, c, seed, tokenizer, matrix_dtype, path, expert_dtype);
    return write_gguf_checkpoint(env, c, synthetic_values(c, seed), tokenizer, matrix_dtype, path,
                                 expert_dtype, attn_kv_b_dtype);
}

Status write_gguf_checkpoint(Env* env, const ModelConfig& c, const TensorValues& values,
                             const TokenizerFiles& tokenizer, DType matrix_dtype,
                             const std::string& path, std::optional<DType> expert_dtype,
                             std::optional<DType> attn_kv_b_dtype) {
    if (c.v4_layout()) {
        return invalid_argument("write_gguf_checkpoint: V4 output needs the synthetic writer");
    }
    DSI_ASSIGN_OR_RETURN(DType exps_dtype, gguf_expert_dtype(c, matrix_dtype, expert_dtype));
    if (attn_kv_b_dtype && *attn_kv_b_dtype != DType::kF32 && *attn_kv_b_dtype != DType::kF16 &&
        *attn_kv_b_dtype != DType::kBF16) {
        return invalid_argument("GGUF attn_k_b/attn_v_b dtype must be f32, f16 or bf16");
    }

    GgufWriter w;
    for (auto& [k, v] : gguf_metadata_for_config(c, "dsinfer synthetic")) w.add_kv(k, v);
    DSI_RETURN_IF_ERROR(add_tokenizer_metadata(c, tokenizer, w));

    MergedExperts merged(exps_dtype);
    for (const TensorSpec& spec : deepseek_tensor_specs(c)) {
        std::optional<GgufTensorRef> ref = gguf_tensor_for_hf_name(c, spec.name);
        DSI_CHECK(ref.has_value(), "no GGUF name for ", spec.name);
        DSI_ASSIGN_OR_RETURN(std::vector<float> v, values(spec));
        if (static_cast<int64_t>(v.size()) != shape_numel(spec.shape)) {
            return invalid_argument("write_gguf_checkpoint: wrong size for " + spec.name);
        }
        const DType dtype = is_matrix(spec) ? matrix_dtype : DType::kF32;
        if (ref->expert >= 0) {
            merged.add(ref->gguf_name, c.n_routed_experts, spec.shape, v);
            continue;
        }
        if (spec.name.find("kv_b_proj") == std::string::npos) {
            w.add_tensor(ref->gguf_name, dtype, spec.shape, to_bytes(dtype, v));
        } else {
            // llama.cpp's MLA layout: no attn_kv_b, but W_kb per head as [heads,
            // kv_lora, nope] (transposed) and W_vb as [heads, v, kv_lora].
            const int64_t nh = c.num_attention_heads, nope = c.qk_nope_head_dim, vd = c.v_head_dim,
                          lora = c.kv_lora_rank;
            std::vector<float> kb(static_cast<size_t>(nh * lora * nope));
            std::vector<float> vb(static_cast<size_t>(nh * vd * lora));
            for (int64_t h = 0; h < nh; ++h) {
                for (int64_t d = 0; d < nope; ++d) {
                    for (int64_t l = 0; l < lora; ++l) {
                        kb[(h * lora + l) * nope + d] = v[(h * (nope + vd) + d) * lora + l];
                    }
                }
                for (int64_t j = 0; j < vd; ++j) {
                    for (int64_t l = 0; l < lora; ++l) {
                        vb[(h * vd + j) * lora + l] = v[(h * (nope + vd) + nope + j) * lora + l];
                    }
                }
            }
            const std::string blk = ref->gguf_name.substr(0, ref->gguf_name.find("attn_kv_b"));
            // attn_k_b is f32 in an f32 file, else bf16 (never q8_0/f16): llama.cpp's AMX
            // CPU variant places q8_0/f16 weights in its AMX buffer, then finds no backend
            // for k_b's batched product and aborts (docs/gguf_deepseek2.md section 8);
            // bf16 stays on the plain CPU path, so AMX can stay on.
            const DType kb_dtype =
                attn_kv_b_dtype.value_or(dtype == DType::kF32 ? DType::kF32 : DType::kBF16);
            const DType vb_dtype = attn_kv_b_dtype.value_or(dtype);
            w.add_tensor(blk + "attn_k_b.weight", kb_dtype, {nh, lora, nope},
                         to_bytes(kb_dtype, kb));
            w.add_tensor(blk + "attn_v_b.weight", vb_dtype, {nh, vd, lora}, to_bytes(vb_dtype, vb));
        }
    }
    merged.write(w);
    return write_gguf_file(env, w, path);
}

}  // namespace dsi
