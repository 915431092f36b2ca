#include "base/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace dsi {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

const char* level_letter(LogLevel level) {
    switch (level) {
        case LogLevel::kDebug: return "D";
        case LogLevel::kInfo: return "I";
        case LogLevel::kWarning: return "W";
        case LogLevel::kError: return "E";
        case LogLevel::kOff: return "-";
    }
    return "?";
}

}  // namespace

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

Result<LogLevel> parse_log_level(std::string_view text) {
    if (text == "debug") return LogLevel::kDebug;
    if (text == "info") return LogLevel::kInfo;
    if (text == "warning" || text == "warn") return LogLevel::kWarning;
    if (text == "error") return LogLevel::kError;
    if (text == "off") return LogLevel::kOff;
    return invalid_argument("unknown log level '" + std::string(text) +
                            "' (expected debug|info|warning|error|off)");
}

namespace internal {

LogLine::LogLine(LogLevel level, const char* file, int line) {
    const char* base = std::strrchr(file, '/');
    base = base ? base + 1 : file;
    auto now = std::chrono::steady_clock::now().time_since_epoch();
    double secs = std::chrono::duration<double>(now).count();
    char prefix[96];
    std::snprintf(prefix, sizeof(prefix), "%s %.6f %s:%d] ", level_letter(level), secs, base, line);
    os_ << prefix;
}

LogLine::~LogLine() {
    os_ << '\n';
    std::string s = os_.str();
    std::fwrite(s.data(), 1, s.size(), stderr);
}

}  // namespace internal
}  // namespace dsi
