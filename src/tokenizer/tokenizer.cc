#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "tokenizer/internal/unicode.h"

namespace dsi {

using json = nlohmann::json;
using tokenizer_internal::AddedToken;
using tokenizer_internal::AddedTokenMatcher;
using tokenizer_internal::BpeModel;
using tokenizer_internal::PreTokenizer;
using tokenizer_internal::SplitRule;

namespace {

constexpr uint8_t kFlagAdded = 1;
constexpr uint8_t kFlagSpecial = 2;

// Below this much text, encode_segments stays on the calling thread: starting
// threads costs more than encoding a few KiB (~0.1 ms).
constexpr size_t kMinParallelBytes = 16 * 1024;

// Exceptions stop here (STYLE 2): nlohmann::json throws on malformed input.
Result<json> parse_json(std::string_view text, const char* what) {
    try {
        return json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
        return invalid_argument(std::string(what) + ": " + e.what());
    }
}

std::string type_of(const json& j) {
    const json* t = j.is_object() && j.contains("type") ? &j["type"] : nullptr;
    return t && t->is_string() ? t->get<std::string>() : std::string();
}

bool get_bool(const json& j, const char* key, bool fallback) {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

bool is_null_or_empty_string(const json& j, const char* key) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

// The identity normalizers: null, or a Sequence of them (DeepSeek V3: []).
Status check_normalizer(const json& n) {
    if (n.is_null()) return Status::ok();
    if (type_of(n) == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
        for (const json& inner : n["normalizers"]) DSI_RETURN_IF_ERROR(check_normalizer(inner));
        return Status::ok();
    }
    return unimplemented("tokenizer.json: normalizer '" + type_of(n) +
                         "' is not supported (only the identity)");
}

Status check_byte_level(const json& b, const char* where) {
    if (get_bool(b, "add_prefix_space", false)) {
        return unimplemented(std::string(where) + ": ByteLevel add_prefix_space is not supported");
    }
    if (get_bool(b, "use_regex", true)) {
        return unimplemented(std::string(where) + ": ByteLevel use_regex is not supported");
    }
    return Status::ok();
}

Result<SplitRule> parse_split(const json& s) {
    SplitRule rule;
    const json& pattern = s.contains("pattern") ? s["pattern"] : json();
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
        DSI_ASSIGN_OR_RETURN(rule.matcher, tokenizer_internal::matcher_for_regex(
                                               pattern["Regex"].get<std::string>()));
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
        rule.matcher = tokenizer_internal::SplitMatcher::kLiteral;
        rule.literal = pattern["String"].get<std::string>();
    } else {
        return invalid_argument("tokenizer.json: Split without a Regex or String pattern");
    }
    const json& behavior = s.contains("behavior") ? s["behavior"] : json();
    if (!behavior.is_string()) return invalid_argument("tokenizer.json: Split without behavior");
    DSI_ASSIGN_OR_RETURN(rule.behavior,
                         tokenizer_internal::parse_split_behavior(behavior.get<std::string>()));
    rule.invert = get_bool(s, "invert", false);
    return rule;
}

// Sequence[Split..., ByteLevel] or ByteLevel alone (with use_regex false).
Result<std::vector<SplitRule>> parse_pre_tokenizer(const json& p) {
    std::vector<const json*> steps;
    if (type_of(p) == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
        for (const json& step : p["pretokenizers"]) steps.push_back(&step);
    } else if (!p.is_null()) {
        steps.push_back(&p);
    }
    std::vector<SplitRule> rules;
    bool byte_level = false;
    for (const json* step : steps) {
        const std::string type = type_of(*step);
        if (byte_level) {
            return unimplemented("tokenizer.json: pre_tokenizer step after ByteLevel: " + type);
        }
        if (type == "Split") {
            DSI_ASSIGN_OR_RETURN(SplitRule rule, parse_split(*step));
            rules.push_back(std::move(rule));
        } else if (type == "ByteLevel") {
            DSI_RETURN_IF_ERROR(check_byte_level(*step, "pre_tokenizer"));
            byte_level = true;
        } else {
            return unimplemented("tokenizer.json: pre_tokenizer '" + type + "' is not supported");
        }
    }
    if (!byte_level) {
        return unimplemented("tokenizer.json: pre_tokenizer must end with ByteLevel");
    }
    return rules;
}

// "a b" (tokenizers < 0.20) or ["a", "b"].
Status parse_merges(const json& merges, std::vector<std::pair<std::string, std::string>>* out) {
    if (!merges.is_array()) return invalid_argument("tokenizer.json: model.merges is not a list");
    out->reserve(merges.size());
    for (size_t k = 0; k < merges.size(); ++k) {
        const json& m = merges[k];
        if (m.is_string()) {
            const std::string s = m.get<std::string>();
            const size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos || sp == 0 ||
                sp + 1 == s.size()) {
                return invalid_argument("tokenizer.json: bad merge #" + std::to_string(k) + " '" +
                                        s + "' (want two tokens separated by a space)");
            }
            out->emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            out->emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        } else {
            return invalid_argument("tokenizer.json: bad merge #" + std::to_string(k) + ": " +
                                    m.dump());
        }
    }
    return Status::ok();
}

// HF ByteLevel decoder, per token: every char back to its byte, or the token's own
// UTF-8 bytes when some char is outside the byte-level alphabet (added tokens).
std::string decoded_bytes_of(std::string_view token) {
    std::string raw;
    raw.reserve(token.size());
    for (size_t i = 0; i < token.size();) {
        if (tokenizer_internal::utf8_step(token.substr(i)).kind !=
            tokenizer_internal::Utf8Step::kValid) {
            return std::string(token);
        }
        size_t len;
        const int b = tokenizer_internal::byte_of_char(
            tokenizer_internal::decode_utf8(token.data(), i, &len));
        if (b < 0) return std::string(token);
        raw.push_back(static_cast<char>(b));
        i += len;
    }
    return raw;
}

// bos_token / eos_token: a string or an AddedToken object with "content".
std::optional<std::string> token_content(const json& config, const char* key) {
    auto it = config.find(key);
    if (it == config.end()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        return (*it)["content"].get<std::string>();
    }
    return std::nullopt;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(Env* env, const std::string& model_dir) {
    const std::string json_path = model_dir + "/tokenizer.json";
    const std::string config_path = model_dir + "/tokenizer_config.json";
    if (!env->file_exists(json_path)) return not_found("no tokenizer.json in " + model_dir);
    DSI_ASSIGN_OR_RETURN(std::string tokenizer_json, env->read_file(json_path));
    std::string config_json;
    if (env->file_exists(config_path)) {
        DSI_ASSIGN_OR_RETURN(config_json, env->read_file(config_path));
    }
    auto tok = from_json(tokenizer_json, config_json, env);
    if (!tok.is_ok()) return tok.status().with_context(model_dir);
    return tok;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view tokenizer_json,
                                                        std::string_view tokenizer_config_json,
                                                        Env* env) {
    std::unique_ptr<Tokenizer> tok(new Tokenizer());
    tok->env_ = env ? env : Env::default_env();
    DSI_RETURN_IF_ERROR(tok->parse_tokenizer_json(tokenizer_json));
    if (!tokenizer_config_json.empty()) {
        DSI_RETURN_IF_ERROR(tok->parse_config_json(tokenizer_config_json));
    }
    return tok;
}

Status Tokenizer::parse_tokenizer_json(std::string_view text) {
    DSI_ASSIGN_OR_RETURN(json root, parse_json(text, "tokenizer.json"));
    if (!root.is_object()) return invalid_argument("tokenizer.json: not a JSON object");
    if (!root.contains("model") || !root["model"].is_object()) {
        return invalid_argument("tokenizer.json: missing \"model\"");
    }
    const json& model = root["model"];
    const std::string model_type = type_of(model);
    if (!model_type.empty() && model_type != "BPE") {
        return unimplemented("tokenizer.json: model type '" + model_type + "' (only BPE)");
    }
    if (model.contains("dropout") && !model["dropout"].is_null() &&
        !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
        return unimplemented("tokenizer.json: BPE dropout is not supported");
    }
    if (get_bool(model, "byte_fallback", false)) {
        return unimplemented("tokenizer.json: BPE byte_fallback is not supported");
    }
    if (!is_null_or_empty_string(model, "continuing_subword_prefix") ||
        !is_null_or_empty_string(model, "end_of_word_suffix")) {
        return unimplemented("tokenizer.json: BPE subword prefix/suffix is not supported");
    }
    if (!model.contains("vocab") || !model["vocab"].is_object()) {
        return invalid_argument("tokenizer.json: missing model.vocab");
    }
    if (!model.contains("merges")) return invalid_argument("tokenizer.json: missing model.merges");

    DSI_RETURN_IF_ERROR(check_normalizer(root.value("normalizer", json())));
    DSI_ASSIGN_OR_RETURN(std::vector<SplitRule> rules,
                         parse_pre_tokenizer(root.value("pre_tokenizer", json())));
    pretokenizer_ = PreTokenizer(std::move(rules));
    const json decoder = root.value("decoder", json());
    if (!decoder.is_null() && type_of(decoder) != "ByteLevel") {
        return unimplemented("tokenizer.json: decoder '" + type_of(decoder) +
                             "' is not supported (only ByteLevel)");
    }

    // Vocab.
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(model["vocab"].size());
    int32_t max_id = -1;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
            it->get<int64_t>() > INT32_MAX - 1) {
            return invalid_argument("tokenizer.json: vocab entry '" + it.key() +
                                    "' has no valid id");
        }
        const auto id = static_cast<int32_t>(it->get<int64_t>());
        vocab.emplace(it.key(), id);
        max_id = std::max(max_id, id);
    }
    std::vector<std::pair<std::string, std::string>> merges;
    DSI_RETURN_IF_ERROR(parse_merges(model["merges"], &merges));
    {
        auto bpe = BpeModel::build(vocab, merges, get_bool(model, "ignore_merges", false));
        if (!bpe.is_ok()) return bpe.status().with_context("tokenizer.json");
        bpe_ = std::move(bpe).value();
    }

    // Added tokens.
    const json added = root.value("added_tokens", json::array());
    if (!added.is_array()) return invalid_argument("tokenizer.json: added_tokens is not a list");
    for (const json& a : added) {
        if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
            !a.contains("content") || !a["content"].is_string() || a["id"].get<int64_t>() < 0 ||
            a["id"].get<int64_t>() > INT32_MAX - 1) {
            return invalid_argument("tokenizer.json: bad added token: " + a.dump());
        }
        AddedToken t;
        t.id = static_cast<int32_t>(a["id"].get<int64_t>());
        t.content = a["content"].get<std::string>();
        if (t.content.empty()) return invalid_argument("tokenizer.json: empty added token");
        t.single_word = get_bool(a, "single_word", false);
        t.lstrip = get_bool(a, "lstrip", false);
        t.rstrip = get_bool(a, "rstrip", false);
        t.normalized = get_bool(a, "normalized", true);
        t.special = get_bool(a, "special", false);
        auto in_vocab = vocab.find(t.content);
        if (in_vocab != vocab.end() && in_vocab->second != t.id) {
            return invalid_argument("tokenizer.json: added token '" + t.content + "' has id " +
                                    std::to_string(t.id) + " but vocab says " +
                                    std::to_string(in_vocab->second));
        }
        max_id = std::max(max_id, t.id);
        added_tokens_.push_back(std::move(t));
    }

    // Id tables.
    vocab_size_ = max_id + 1;
    id_to_token_.assign(static_cast<size_t>(vocab_size_), std::string());
    id_flags_.assign(static_cast<size_t>(vocab_size_), 0);
    for (const auto& [token, id] : vocab) {
        if (!id_to_token_[id].empty()) {
            return invalid_argument("tokenizer.json: id " + std::to_string(id) +
                                    " is used by two vocab entries");
        }
        id_to_token_[id] = token;
    }
    token_to_id_ = std::move(vocab);
    for (const AddedToken& t : added_tokens_) {
        if (!id_to_token_[t.id].empty() && id_to_token_[t.id] != t.content) {
            return invalid_argument("tokenizer.json: id " + std::to_string(t.id) + " is both '" +
                                    id_to_token_[t.id] + "' and added token '" + t.content + "'");
        }
        id_to_token_[t.id] = t.content;
        token_to_id_[t.content] = t.id;
        id_flags_[t.id] |= kFlagAdded | (t.special ? kFlagSpecial : 0);
    }
    std::vector<const AddedToken*> raw_tokens;
    std::vector<const AddedToken*> normalized_tokens;
    for (const AddedToken& t : added_tokens_) {
        (t.normalized ? normalized_tokens : raw_tokens).push_back(&t);
    }
    raw_matcher_ = AddedTokenMatcher(raw_tokens);
    normalized_matcher_ = AddedTokenMatcher(normalized_tokens);

    decoded_offsets_.assign(static_cast<size_t>(vocab_size_) + 1, 0);
    for (int32_t id = 0; id < vocab_size_; ++id) {
        decoded_offsets_[id] = static_cast<uint32_t>(decoded_.size());
        decoded_ += decoded_bytes_of(id_to_token_[id]);
    }
    decoded_offsets_[vocab_size_] = static_cast<uint32_t>(decoded_.size());
    return Status::ok();
}

Status Tokenizer::parse_config_json(std::string_view text) {
    DSI_ASSIGN_OR_RETURN(json config, parse_json(text, "tokenizer_config.json"));
    if (!config.is_object()) return invalid_argument("tokenizer_config.json: not an object");
    auto id_of = [&](const char* key, int32_t* out) -> Status {
        std::optional<std::string> content = token_content(config, key);
        if (!content) return Status::ok();
        std::optional<int32_t> id = token_id(*content);
        if (!id) {
            return invalid_argument(std::string("tokenizer_config.json: ") + key + " '" + *content +
                                    "' is not a token");
        }
        *out = *id;
        return Status::ok();
    };
    DSI_RETURN_IF_ERROR(id_of("bos_token", &bos_id_));
    DSI_RETURN_IF_ERROR(id_of("eos_token", &eos_id_));
    add_bos_token_ = get_bool(config, "add_bos_token", false);
    auto tmpl = config.find("chat_template");
    if (tmpl != config.end() && tmpl->is_string()) {
        chat_template_ = tmpl->get<std::string>();
    } else if (tmpl != config.end() && tmpl->is_array()) {
        // [{"name": ..., "template": ...}]: the "default" one, else the first.
        for (const json& t : *tmpl) {
            if (!t.is_object() || !t.contains("template") || !t["template"].is_string()) continue;
            if (chat_template_.empty() || t.value("name", "") == "default") {
                chat_template_ = t["template"].get<std::string>();
            }
        }
    }
    return Status::ok();
}

void Tokenizer::encode_valid(std::string_view text, std::vector<int32_t>* out) const {
    pretokenizer_.run(text,
                      [&](size_t b, size_t e) { bpe_.encode_piece(text.substr(b, e - b), out); });
}

void Tokenizer::encode_into(std::string_view text, std::vector<int32_t>* out) const {
    // S-REC-2: ordinary text never yields added tokens; spellings stay BPE.
    if (tokenizer_internal::valid_utf8_prefix(text) != text.size()) {
        const std::string repaired = tokenizer_internal::utf8_lossy(text);
        encode_valid(repaired, out);
        return;
    }
    encode_valid(text, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    encode_into(text, &out);
    return out;
}

std::vector<int32_t> Tokenizer::encode_with_special(std::string_view input) const {
    std::string repaired;
    std::string_view text = input;
    if (tokenizer_internal::valid_utf8_prefix(text) != text.size()) {
        repaired = tokenizer_internal::utf8_lossy(text);
        text = repaired;
    }
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    std::vector<AddedTokenMatcher::Split> raw_splits;
    std::vector<AddedTokenMatcher::Split> splits;
    raw_matcher_.split(text, &raw_splits);
    for (const auto& rs : raw_splits) {
        if (rs.id >= 0) {
            out.push_back(rs.id);
            continue;
        }
        const std::string_view part = text.substr(rs.begin, rs.end - rs.begin);
        splits.clear();
        normalized_matcher_.split(part, &splits);
        for (const auto& s : splits) {
            if (s.id >= 0) {
                out.push_back(s.id);
            } else {
                encode_valid(part.substr(s.begin, s.end - s.begin), &out);
            }
        }
    }
    return out;
}

std::vector<int32_t> Tokenizer::encode_segments(std::span<const Segment> segments,
                                                int num_threads) const {
    std::vector<size_t> text_segments;
    size_t total_bytes = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
        if (!segments[i].is_token()) {
            text_segments.push_back(i);
            total_bytes += segments[i].text.size();
        }
    }
    const size_t num_workers =
        std::min<size_t>(static_cast<size_t>(std::max(num_threads, 1)), text_segments.size());
    std::vector<int32_t> out;
    if (num_workers <= 1 || total_bytes < kMinParallelBytes) {
        out.reserve(total_bytes / 3 + segments.size());
        for (const Segment& s : segments) {
            if (s.is_token()) {
                out.push_back(s.id);
            } else {
                encode_into(s.text, &out);
            }
        }
        return out;
    }
    // S-REC-3: each text segment is encoded on its own (no state crosses a
    // segment), so the order of work does not matter; largest first balances.
    std::sort(text_segments.begin(), text_segments.end(), [&](size_t a, size_t b) {
        return segments[a].text.size() > segments[b].text.size();
    });
    std::vector<std::vector<int32_t>> encoded(segments.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t k = next.fetch_add(1); k < text_segments.size(); k = next.fetch_add(1)) {
            const size_t i = text_segments[k];
            encoded[i] = encode(segments[i].text);
        }
    };
    std::vector<std::thread> threads;
    threads.reserve(num_workers - 1);
    for (size_t t = 1; t < num_workers; ++t) threads.push_back(env_->start_thread(work));
    work();
    for (std::thread& t : threads) t.join();
    size_t total_ids = 0;
    for (const Segment& s : segments) total_ids += s.is_token() ? 1 : 0;
    for (const auto& e : encoded) total_ids += e.size();
    out.reserve(total_ids);
    for (size_t i = 0; i < segments.size(); ++i) {
        if (segments[i].is_token()) {
            out.push_back(segments[i].id);
        } else {
            out.insert(out.end(), encoded[i].begin(), encoded[i].end());
        }
    }
    return out;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
    if (id < 0 || id >= vocab_size_) return {};
    return std::string_view(decoded_).substr(decoded_offsets_[id],
                                             decoded_offsets_[id + 1] - decoded_offsets_[id]);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    std::string out;
    for (int32_t id : ids) {
        if (skip_special && is_special(id)) continue;
        out += token_bytes(id);
    }
    return out;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
    auto it = token_to_id_.find(std::string(token));
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
}

std::string_view Tokenizer::token_text(int32_t id) const {
    if (id < 0 || id >= vocab_size_) return {};
    return id_to_token_[id];
}

bool Tokenizer::is_special(int32_t id) const {
    return id >= 0 && id < vocab_size_ && (id_flags_[id] & kFlagSpecial);
}

bool Tokenizer::is_added(int32_t id) const {
    return id >= 0 && id < vocab_size_ && (id_flags_[id] & kFlagAdded);
}

std::string IncrementalDecoder::push(int32_t id) {
    if (skip_special_ && tokenizer_.is_special(id)) return {};
    pending_ += tokenizer_.token_bytes(id);
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        const auto step = tokenizer_internal::utf8_step(std::string_view(pending_).substr(i));
        if (step.kind == tokenizer_internal::Utf8Step::kIncomplete) break;  // wait for more
        if (step.kind == tokenizer_internal::Utf8Step::kValid) {
            out.append(pending_, i, step.len);
        } else {
            out += "\xEF\xBF\xBD";
        }
        i += step.len;
    }
    pending_.erase(0, i);
    return out;
}

std::string IncrementalDecoder::flush() {
    // What is left is a valid prefix cut short: one maximal subpart, one U+FFFD.
    std::string out = pending_.empty() ? std::string() : std::string("\xEF\xBF\xBD");
    pending_.clear();
    return out;
}

std::string utf8_lossy(std::string_view bytes) { return tokenizer_internal::utf8_lossy(bytes); }

Result<std::string> find_reference_tokenizer_dir(Env* env, const std::string& repo_root) {
    const std::string dir = repo_root + "/" + std::string(kReferenceTokenizerSubdir);
    if (!env->file_exists(dir + "/tokenizer.json")) {
        return not_found("reference tokenizer.json not found under " + dir +
                         " (run scripts/setup.sh, which runs npm ci in tests/tokenizer)");
    }
    return dir;
}

}  // namespace dsi
