// The embedded default model: the trained model pack DATA_DIR/models/
// dsinfer-default.safetensors (issue 17, modelpack/), expanded once into
// CACHE_DIR/models/dsinfer-default-<digest>/; without a pack, the synthetic `tiny`
// preset (model/synthetic.h) written under CACHE_DIR/models/tiny. Both use the real
// DeepSeek V3 tokenizer from the product's data directory (serving/data_dir.h).
// `serve` and `generate` use it when no --model is given.
//
// Thread model: free functions; safe against other processes creating the same model
// at the same time (each writes a private temporary directory, then renames it).
#pragma once

#include <string>

#include "base/env.h"
#include "base/status.h"

namespace dsi::serving {

// The served model name of the default model (serving/model_id.h).
inline constexpr const char* kDefaultModelName = "dsinfer-default";
// The trained default model's pack, relative to the data directory.
inline constexpr const char* kDefaultModelPack = "models/dsinfer-default.safetensors";

// CACHE_DIR/models/tiny, created from `tokenizer_dir` when it has no config.json yet.
// A crash never leaves half a model behind. Errors name the tokenizer files' folder.
// With `pack_path` naming an existing pack, its expanded directory instead.
Result<std::string> ensure_default_model(Env* env, const std::string& cache_dir,
                                         const std::string& tokenizer_dir,
                                         const std::string& pack_path = "");

}  // namespace dsi::serving
