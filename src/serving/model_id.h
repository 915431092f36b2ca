// The model id rule: two names per replica, derived the same way by every command
// (docs/serving.md, "Model id").
//
//   - served model name: what API clients send and see in "model". `--model-id` when
//     given; the embedded default model is "dsinfer-default"; otherwise the checkpoint's
//     directory name or GGUF file name.
//   - cache identity: what the KV cache is keyed by. It salts every prefix-cache block
//     key (kv::make_salt) and is the store's model identity (kvstore::model_identity),
//     so blocks written by one process (`generate`, `serve`, another host) are hit by
//     any other process that runs the same weights the same way, and never by one
//     that does not. It is derived from the checkpoint's bytes, not its path or served
//     name: "ckpt-" + 32 hex digits of checkpoint_fingerprint() + "/" + weight format.
//     The KV dtype is not part of it: every stored block carries its dtype and a
//     mismatch is a miss.
//
// Thread model: pure functions (checkpoint_fingerprint reads files).
#pragma once

#include <string>

#include "base/env.h"
#include "base/status.h"

namespace dsi::serving {

// XXH3-128 over, for each checkpoint file in name order (a .gguf file alone, or a
// directory's config.json and *.safetensors / *.gguf files): its name, its size and its
// first and last MiB (headers, tensor tables and enough weight bytes to tell two
// checkpoints with the same shapes apart). Reads at most 2 MiB per file.
// NOT_FOUND when the path holds no checkpoint file.
Result<std::string> checkpoint_fingerprint(Env* env, const std::string& model_path);

// "ckpt-<fingerprint>/<weight_format>".
std::string cache_identity(const std::string& fingerprint, const std::string& weight_format);

// The served model name of the rule above ("" model_id: from the path).
std::string served_model_name(const std::string& model_id, const std::string& model_path,
                              bool is_default_model);

}  // namespace dsi::serving
