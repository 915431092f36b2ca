// Readers for the tokenizer comparison files written by tests/tokenizer/corpus.js
// (documents) and tests/tokenizer/reference_encode.js (the JavaScript reference's
// ids). Used by tokenizer_corpus_check and bench/tokenizer_bench. Thread model:
// plain functions returning values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"

namespace dsi::tokenizer_tools {

struct CorpusDoc {
    // 0: compared as is; 1: holds U+0085/U+FEFF, where the reference was run with
    // Oniguruma's \s (see docs/tokenizer.md).
    uint8_t kind = 0;
    std::string bytes;
};

// "DSTC1\n", then per document: u8 kind, u32 length (LE), bytes.
Result<std::vector<CorpusDoc>> read_corpus(Env* env, const std::string& path);

struct ReferenceIds {
    std::vector<int32_t> plain;    // Tokenizer::encode
    std::vector<int32_t> special;  // Tokenizer::encode_with_special
};

// "DSTI1\n", then per document: u32 n, n x i32, u32 m, m x i32 (LE).
Result<std::vector<ReferenceIds>> read_reference_ids(Env* env, const std::string& path);

}  // namespace dsi::tokenizer_tools
