// tokenizer_corpus_check: compares dsinfer's tokenizer with the JavaScript
// reference's ids on a corpus (tests/tokenizer/js_compare.sh runs it as the CTest
// test tokenizer_js_compare). Also checks, on the same documents, that
// decode(encode(x)) == utf8_lossy(x) and that segment-parallel encoding equals
// sequential encoding.
//
// Usage: tokenizer_corpus_check TOKENIZER_DIR CORPUS REFERENCE_IDS
// Exit status 0 when everything matches; 1 with a report of the first mismatches.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tools/corpus_file.h"

namespace dsi {
namespace {

std::string escaped(std::string_view s, size_t max_bytes = 160) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", c);
            out += buf;
        } else {
            out.push_back(static_cast<char>(c));
        }
    }
    if (s.size() > max_bytes) out += "...";
    return out;
}

std::string ids_around(const std::vector<int32_t>& ids, size_t at, const Tokenizer& tok) {
    std::string out;
    const size_t b = at >= 4 ? at - 4 : 0;
    const size_t e = std::min(ids.size(), at + 6);
    for (size_t i = b; i < e; ++i) {
        out += (i == at ? "[" : "") + std::to_string(ids[i]) + "'" +
               std::string(tok.token_text(ids[i])) + "'" + (i == at ? "]" : "") + " ";
    }
    return out;
}

// Prints one mismatch; returns false.
bool report(const Tokenizer& tok, size_t doc, const tokenizer_tools::CorpusDoc& d, const char* mode,
            const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
    size_t at = 0;
    while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
    const std::vector<int32_t> prefix(want.begin(), want.begin() + static_cast<long>(at));
    const size_t offset = tok.decode(prefix).size();
    std::printf("MISMATCH doc %zu (kind %d, %zu bytes) %s at id #%zu, text byte ~%zu:\n", doc,
                d.kind, d.bytes.size(), mode, at, offset);
    const size_t from = offset >= 20 ? offset - 20 : 0;
    std::printf("  text: \"%s\"\n",
                escaped(std::string_view(utf8_lossy(d.bytes)).substr(from), 80).c_str());
    std::printf("  C++:  %s\n", ids_around(got, at, tok).c_str());
    std::printf("  JS:   %s\n", ids_around(want, at, tok).c_str());
    return false;
}

int run(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s TOKENIZER_DIR CORPUS REFERENCE_IDS\n", argv[0]);
        return 2;
    }
    Env* env = Env::default_env();
    auto tok = Tokenizer::load(env, argv[1]);
    auto docs = tokenizer_tools::read_corpus(env, argv[2]);
    auto want = tokenizer_tools::read_reference_ids(env, argv[3]);
    for (const Status* s : {&tok.status(), &docs.status(), &want.status()}) {
        if (!s->is_ok()) {
            std::fprintf(stderr, "%s\n", s->to_string().c_str());
            return 2;
        }
    }
    if (docs->size() != want->size()) {
        std::fprintf(stderr, "corpus has %zu documents but the reference %zu\n", docs->size(),
                     want->size());
        return 2;
    }
    size_t num_bad = 0;
    size_t num_ids = 0;
    size_t num_bytes = 0;
    size_t num_kind1 = 0;
    std::vector<Segment> segments;
    std::vector<int32_t> sequential;
    for (size_t i = 0; i < docs->size(); ++i) {
        const auto& d = (*docs)[i];
        num_bytes += d.bytes.size();
        num_kind1 += d.kind == 1;
        const std::vector<int32_t> plain = (*tok)->encode(d.bytes);
        const std::vector<int32_t> special = (*tok)->encode_with_special(d.bytes);
        num_ids += plain.size() + special.size();
        bool ok = true;
        if (plain != (*want)[i].plain) {
            ok = report(**tok, i, d, "encode", plain, (*want)[i].plain);
        }
        if (special != (*want)[i].special) {
            ok = report(**tok, i, d, "encode_with_special", special, (*want)[i].special);
        }
        if ((*tok)->decode(plain) != utf8_lossy(d.bytes)) {
            std::printf("ROUNDTRIP doc %zu: decode(encode(x)) != utf8_lossy(x)\n", i);
            ok = false;
        }
        if (!ok && ++num_bad >= 20) {
            std::printf("stopping after 20 bad documents\n");
            break;
        }
        segments.push_back(Segment::of_token(static_cast<int32_t>(128803 + i % 2)));
        sequential.push_back(static_cast<int32_t>(128803 + i % 2));
        segments.push_back(Segment::of_text(d.bytes));
        sequential.insert(sequential.end(), plain.begin(), plain.end());
    }
    for (int threads : {2, 7}) {
        if ((*tok)->encode_segments(segments, threads) != sequential) {
            std::printf("SEGMENTS: encode_segments(%d threads) differs from sequential\n", threads);
            ++num_bad;
        }
    }
    std::printf(
        "tokenizer_corpus_check: %zu documents (%.2f MiB, %zu with the Oniguruma \\s), "
        "%zu ids compared, %zu bad\n",
        docs->size(), static_cast<double>(num_bytes) / 1048576.0, num_kind1, num_ids, num_bad);
    return num_bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dsi

int main(int argc, char** argv) { return dsi::run(argc, argv); }
