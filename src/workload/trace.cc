#include "workload/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

namespace dsi::workload {
namespace {

Status line_error(int64_t line, const std::string& what) {
    return invalid_argument("trace line " + std::to_string(line) + ": " + what);
}

// Sorts by arrival (stable) and makes times relative to the first request.
void finish_trace(Trace& t) {
    std::vector<size_t> order(t.requests.size());
    for (size_t i = 0; i < order.size(); ++i) {
        order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return t.requests[a].arrival_ns < t.requests[b].arrival_ns;
    });
    std::vector<TraceRequest> sorted;
    sorted.reserve(order.size());
    for (size_t i : order) {
        sorted.push_back(t.requests[i]);
    }
    t.requests = std::move(sorted);
    if (!t.requests.empty()) {
        const int64_t t0 = t.requests.front().arrival_ns;
        for (auto& r : t.requests) {
            r.arrival_ns -= t0;
        }
    }
}

template <typename T>
bool parse_int(std::string_view s, T& out) {
    while (!s.empty() && s.front() == ' ') {
        s.remove_prefix(1);
    }
    while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) {
        s.remove_suffix(1);
    }
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && p == s.data() + s.size();
}

// Days since 1970-01-01 of a proleptic Gregorian date.
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2 ? 1 : 0;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

// "YYYY-MM-DD HH:MM:SS[.fraction]" -> ns since the epoch.
bool parse_timestamp(std::string_view s, int64_t& ns) {
    if (s.size() < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' ||
        s[16] != ':') {
        return false;
    }
    int64_t y, mo, d, h, mi, sec;
    if (!parse_int(s.substr(0, 4), y) || !parse_int(s.substr(5, 2), mo) ||
        !parse_int(s.substr(8, 2), d) || !parse_int(s.substr(11, 2), h) ||
        !parse_int(s.substr(14, 2), mi) || !parse_int(s.substr(17, 2), sec)) {
        return false;
    }
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) {
        return false;
    }
    int64_t frac_ns = 0;
    if (s.size() > 19) {
        if (s[19] != '.') {
            return false;
        }
        int64_t scale = 100'000'000;
        for (size_t i = 20; i < s.size(); ++i) {
            if (s[i] < '0' || s[i] > '9') {
                return false;
            }
            frac_ns += (s[i] - '0') * scale;
            scale /= 10;
        }
    }
    ns = ((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60 + sec;
    ns = ns * 1'000'000'000 + frac_ns;
    return true;
}

// The next line of `text` from `pos` (without its newline); false at the end.
bool next_line(std::string_view text, size_t& pos, std::string_view& line) {
    if (pos >= text.size()) {
        return false;
    }
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) {
        end = text.size();
    }
    line = text.substr(pos, end - pos);
    pos = end + 1;
    return true;
}

}  // namespace

Result<Trace> parse_mooncake_jsonl(std::string_view text) {
    Trace t;
    t.source = "mooncake-jsonl";
    int64_t line_no = 0;
    size_t pos = 0;
    std::string_view line;
    while (next_line(text, pos, line)) {
        ++line_no;
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
            continue;
        }
        nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded() || !j.is_object()) {
            return line_error(line_no, "not a JSON object");
        }
        for (const char* key : {"timestamp", "input_length", "output_length"}) {
            if (!j.contains(key) || !j[key].is_number()) {
                return line_error(line_no, std::string("missing or non-numeric \"") + key + "\"");
            }
        }
        const double ts_ms = j["timestamp"].get<double>();
        if (!j["input_length"].is_number_integer() || !j["output_length"].is_number_integer()) {
            return line_error(line_no, "lengths must be integers");
        }
        const int64_t in = j["input_length"].get<int64_t>();
        const int64_t out = j["output_length"].get<int64_t>();
        if (!(ts_ms >= 0) || !std::isfinite(ts_ms)) {
            return line_error(line_no, "timestamp must be >= 0");
        }
        if (in <= 0 || in > (int64_t{1} << 30) || out < 0 || out > (int64_t{1} << 30)) {
            return line_error(line_no, "input_length must be > 0 and output_length >= 0");
        }
        TraceRequest r;
        r.arrival_ns = static_cast<int64_t>(ts_ms * 1e6);
        r.input_tokens = static_cast<int32_t>(in);
        r.output_tokens = static_cast<int32_t>(out);
        r.first_block = static_cast<uint32_t>(t.blocks.size());
        if (j.contains("hash_ids")) {
            const auto& ids = j["hash_ids"];
            if (!ids.is_array()) {
                return line_error(line_no, "\"hash_ids\" must be an array");
            }
            const int64_t max_blocks = (in + t.block_tokens - 1) / t.block_tokens;
            if (static_cast<int64_t>(ids.size()) > max_blocks) {
                return line_error(line_no, "more hash_ids than 512-token blocks of the input");
            }
            for (const auto& id : ids) {
                if (!id.is_number_unsigned()) {
                    return line_error(line_no, "hash_ids must be non-negative integers");
                }
                t.blocks.push_back(id.get<uint64_t>());
            }
        }
        r.num_blocks = static_cast<uint32_t>(t.blocks.size() - r.first_block);
        t.requests.push_back(r);
    }
    if (t.requests.empty()) {
        return invalid_argument("trace: no requests");
    }
    finish_trace(t);
    return t;
}

Result<Trace> parse_azure_csv(std::string_view text) {
    Trace t;
    t.source = "azure-csv";
    int64_t line_no = 0;
    size_t pos = 0;
    bool header = true;
    std::string_view line;
    while (next_line(text, pos, line)) {
        ++line_no;
        if (!line.empty() && line.back() == '\r') {
            line.remove_suffix(1);
        }
        if (line.empty()) {
            continue;
        }
        if (header) {
            if (line != "TIMESTAMP,ContextTokens,GeneratedTokens") {
                return line_error(line_no, "want header TIMESTAMP,ContextTokens,GeneratedTokens");
            }
            header = false;
            continue;
        }
        const size_t c1 = line.find(',');
        const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(',', c1 + 1);
        if (c2 == std::string_view::npos || line.find(',', c2 + 1) != std::string_view::npos) {
            return line_error(line_no, "want 3 comma-separated fields");
        }
        int64_t ts = 0;
        int64_t in = 0;
        int64_t out = 0;
        if (!parse_timestamp(line.substr(0, c1), ts)) {
            return line_error(line_no, "bad timestamp");
        }
        if (!parse_int(line.substr(c1 + 1, c2 - c1 - 1), in) || in <= 0 || in > (1 << 30)) {
            return line_error(line_no, "ContextTokens must be an integer > 0");
        }
        if (!parse_int(line.substr(c2 + 1), out) || out < 0 || out > (1 << 30)) {
            return line_error(line_no, "GeneratedTokens must be an integer >= 0");
        }
        TraceRequest r;
        r.arrival_ns = ts;
        r.input_tokens = static_cast<int32_t>(in);
        r.output_tokens = static_cast<int32_t>(out);
        t.requests.push_back(r);
    }
    if (t.requests.empty()) {
        return invalid_argument("trace: no requests");
    }
    finish_trace(t);
    return t;
}

Result<Trace> load_trace(Env* env, const std::string& path) {
    DSI_ASSIGN_OR_RETURN(std::string text, env->read_file(path));
    auto ends_with = [&](std::string_view suf) {
        return path.size() >= suf.size() && path.compare(path.size() - suf.size(), suf.size(), suf) == 0;
    };
    Result<Trace> t = ends_with(".jsonl")  ? parse_mooncake_jsonl(text)
                      : ends_with(".csv") ? parse_azure_csv(text)
                                          : Result<Trace>(invalid_argument(
                                                "trace: unknown format (want .jsonl or .csv): " + path));
    if (!t.is_ok()) {
        return t.status().with_context(path);
    }
    t->source = path;
    return t;
}

std::string to_mooncake_jsonl(const Trace& trace) {
    std::string out;
    for (const TraceRequest& r : trace.requests) {
        out += "{\"timestamp\": " + std::to_string(r.arrival_ns / 1'000'000) +
               ", \"input_length\": " + std::to_string(r.input_tokens) +
               ", \"output_length\": " + std::to_string(r.output_tokens) + ", \"hash_ids\": [";
        const auto ids = trace.blocks_of(r);
        for (size_t i = 0; i < ids.size(); ++i) {
            out += (i ? ", " : "") + std::to_string(ids[i]);
        }
        out += "]}\n";
    }
    return out;
}

Status SyntheticTraceSettings::validate() const {
    if (num_requests < 1 || !(rate_per_s > 0) || !(input_median_tokens >= 1) ||
        !(output_median_tokens >= 0) || input_sigma < 0 || output_sigma < 0 ||
        max_input_tokens < 1 || max_output_tokens < 0 || block_tokens < 1 ||
        num_prefix_groups < 1 || !(long_context_fraction >= 0 && long_context_fraction <= 1) ||
        !(shared_prefix_fraction >= 0 && shared_prefix_fraction <= 1) || prefix_zipf_s < 0) {
        return invalid_argument("synthetic trace: settings out of range");
    }
    return Status::ok();
}

Result<Trace> generate_synthetic_trace(const SyntheticTraceSettings& s) {
    DSI_RETURN_IF_ERROR(s.validate());
    SplitMix64 rng(s.seed);
    Trace t;
    t.source = "synthetic";
    t.block_tokens = s.block_tokens;
    t.requests.reserve(s.num_requests);
    // Zipf over prefix groups by inverse CDF on a precomputed table.
    std::vector<double> cdf(s.num_prefix_groups);
    double acc = 0;
    for (int64_t g = 0; g < s.num_prefix_groups; ++g) {
        acc += 1.0 / std::pow(static_cast<double>(g + 1), s.prefix_zipf_s);
        cdf[g] = acc;
    }
    uint64_t next_unique = uint64_t{1} << 62;  // ids of unshared blocks
    double now_s = 0;
    for (int64_t i = 0; i < s.num_requests; ++i) {
        now_s += -std::log(1.0 - rng.next_double()) / s.rate_per_s;  // Poisson arrivals
        int64_t in = 0;
        if (rng.next_double() < s.long_context_fraction) {
            in = 262144 + static_cast<int64_t>(rng.next_double() * (1 << 20) * 0.75);
        } else {
            in = static_cast<int64_t>(s.input_median_tokens *
                                      std::exp(s.input_sigma * rng.next_normal()));
        }
        in = std::clamp<int64_t>(in, 1, s.max_input_tokens);
        int64_t out = static_cast<int64_t>(s.output_median_tokens *
                                           std::exp(s.output_sigma * rng.next_normal()));
        out = std::clamp<int64_t>(out, 1, s.max_output_tokens);
        TraceRequest r;
        r.arrival_ns = static_cast<int64_t>(now_s * 1e9);
        r.input_tokens = static_cast<int32_t>(in);
        r.output_tokens = static_cast<int32_t>(out);
        r.first_block = static_cast<uint32_t>(t.blocks.size());
        const int64_t num_blocks = (in + s.block_tokens - 1) / s.block_tokens;
        const int64_t group = std::lower_bound(cdf.begin(), cdf.end(), rng.next_double() * acc) -
                              cdf.begin();
        const int64_t shared = static_cast<int64_t>(num_blocks * s.shared_prefix_fraction);
        for (int64_t b = 0; b < num_blocks; ++b) {
            // Shared prefix blocks: a chain per group, so equal id = equal prefix.
            t.blocks.push_back(b < shared ? (static_cast<uint64_t>(group) << 24) + b
                                          : next_unique++);
        }
        r.num_blocks = static_cast<uint32_t>(num_blocks);
        t.requests.push_back(r);
    }
    return t;
}

}  // namespace dsi::workload
