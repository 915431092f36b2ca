// tokenizer_bench: encode throughput of dsinfer's tokenizer on the comparison
// corpus (tests/tokenizer/corpus.js), single-threaded and segment-parallel
// (S-REC-3), plus load time and incremental-decode cost. bench/tokenizer_bench.sh
// runs it next to the JavaScript reference; results go to bench/RESULTS.md.
//
// Usage: tokenizer_bench --corpus FILE [--tokenizer-dir DIR] [--repeat N]
//                        [--max-threads N]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tools/corpus_file.h"
#include "support/build_paths.h"

namespace dsi {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double thread_cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Best wall time of `repeat` runs of fn; *cpu_s gets the calling thread's CPU time
// of that run (the figure that other load on the machine disturbs least).
template <typename Fn>
double best_of(int repeat, Fn&& fn, double* cpu_s = nullptr) {
    double best = 1e30;
    for (int r = 0; r < repeat; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = thread_cpu_s();
        fn();
        const double s = seconds_since(t0);
        if (s < best) {
            best = s;
            if (cpu_s) *cpu_s = thread_cpu_s() - c0;
        }
    }
    return best;
}

int run(int argc, char** argv) {
    std::string corpus_path;
    std::string dir =
        std::string(DSINFER_SOURCE_DIR) + "/" + std::string(kReferenceTokenizerSubdir);
    int repeat = 3;
    int max_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--corpus")) {
            corpus_path = argv[i + 1];
        } else if (!std::strcmp(argv[i], "--tokenizer-dir")) {
            dir = argv[i + 1];
        } else if (!std::strcmp(argv[i], "--repeat")) {
            repeat = std::max(1, std::atoi(argv[i + 1]));
        } else if (!std::strcmp(argv[i], "--max-threads")) {
            max_threads = std::max(1, std::atoi(argv[i + 1]));
        }
    }
    if (corpus_path.empty()) {
        std::fprintf(stderr,
                     "usage: %s --corpus FILE [--tokenizer-dir DIR] [--repeat N] "
                     "[--max-threads N]\n",
                     argv[0]);
        return 2;
    }
    Env* env = Env::default_env();
    const auto t_load = std::chrono::steady_clock::now();
    auto tok = Tokenizer::load(env, dir);
    const double load_s = seconds_since(t_load);
    auto docs = tokenizer_tools::read_corpus(env, corpus_path);
    if (!tok.is_ok() || !docs.is_ok()) {
        std::fprintf(stderr, "%s %s\n", tok.status().to_string().c_str(),
                     docs.status().to_string().c_str());
        return 2;
    }
    size_t bytes = 0;
    for (const auto& d : *docs) bytes += d.bytes.size();
    const double mb = static_cast<double>(bytes) / 1e6;

    size_t num_ids = 0;
    for (const auto& d : *docs) num_ids += (*tok)->encode(d.bytes).size();  // warm-up
    double plain_cpu_s = 0;
    double special_cpu_s = 0;
    const double plain_s = best_of(
        repeat,
        [&] {
            for (const auto& d : *docs) (*tok)->encode(d.bytes);
        },
        &plain_cpu_s);
    const double special_s = best_of(
        repeat,
        [&] {
            for (const auto& d : *docs) (*tok)->encode_with_special(d.bytes);
        },
        &special_cpu_s);

    // One long multi-segment prompt: every document is a text segment, each
    // preceded by a special token, as a chat template would lay them out.
    std::vector<Segment> segments;
    for (size_t i = 0; i < docs->size(); ++i) {
        segments.push_back(Segment::of_token(128803 + static_cast<int32_t>(i % 2)));
        segments.push_back(Segment::of_text((*docs)[i].bytes));
    }
    std::printf("tokenizer_bench: %zu documents, %.2f MB, %zu ids; load %.2f s\n", docs->size(), mb,
                num_ids, load_s);
    std::printf("  encode (1 thread)               %8.2f MB/s  (%.2f MB per CPU-s)\n", mb / plain_s,
                mb / plain_cpu_s);
    std::printf("  encode_with_special (1 thread)  %8.2f MB/s  (%.2f MB per CPU-s)\n",
                mb / special_s, mb / special_cpu_s);
    std::string json = "{\"impl\":\"dsinfer\",\"bytes\":" + std::to_string(bytes) +
                       ",\"load_s\":" + std::to_string(load_s) +
                       ",\"encode_mb_per_s\":" + std::to_string(mb / plain_s) +
                       ",\"encode_cpu_mb_per_s\":" + std::to_string(mb / plain_cpu_s) +
                       ",\"encode_with_special_mb_per_s\":" + std::to_string(mb / special_s) +
                       ",\"segments\":{";
    double one_thread_s = 0;
    for (int t = 1; t <= max_threads; t *= 2) {
        const double s = best_of(repeat, [&] { (*tok)->encode_segments(segments, t); });
        if (t == 1) one_thread_s = s;
        std::printf("  encode_segments (%2d threads)    %8.2f MB/s  (x%.2f)\n", t, mb / s,
                    one_thread_s / s);
        json += (t == 1 ? "\"" : ",\"") + std::to_string(t) + "\":" + std::to_string(mb / s);
        if (t < max_threads && t * 2 > max_threads) t = max_threads / 2;  // end at max
    }
    json += "}";

    // Streaming decode of the whole corpus's ids, one id at a time.
    std::vector<int32_t> all_ids;
    for (const auto& d : *docs) {
        const auto ids = (*tok)->encode(d.bytes);
        all_ids.insert(all_ids.end(), ids.begin(), ids.end());
    }
    size_t out_bytes = 0;
    const double decode_s = best_of(repeat, [&] {
        IncrementalDecoder dec(**tok);
        for (int32_t id : all_ids) out_bytes += dec.push(id).size();
        out_bytes += dec.flush().size();
    });
    const double ns_per_token = decode_s * 1e9 / static_cast<double>(all_ids.size());
    std::printf("  IncrementalDecoder::push         %8.1f ns/token\n", ns_per_token);
    json += ",\"incremental_decode_ns_per_token\":" + std::to_string(ns_per_token) + "}";
    std::printf("%s\n", json.c_str());
    return out_bytes > 0 ? 0 : 1;
}

}  // namespace
}  // namespace dsi

int main(int argc, char** argv) { return dsi::run(argc, argv); }
