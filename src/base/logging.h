// Logging: DSI_LOG(kInfo) << "text"; one line per statement, to stderr, with a
// monotonic timestamp and the source location. The minimum level is a process-wide
// setting (--log-level / DSINFER_LOG_LEVEL). Thread model: each statement builds its
// line locally and writes it with one fwrite, so lines from threads do not interleave.
#pragma once

#include <sstream>
#include <string_view>

#include "base/status.h"

namespace dsi {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Accepts debug|info|warning|error|off.
Result<LogLevel> parse_log_level(std::string_view text);

namespace internal {

class LogLine {
public:
    LogLine(LogLevel level, const char* file, int line);
    ~LogLine();
    LogLine(const LogLine&) = delete;
    LogLine& operator=(const LogLine&) = delete;
    std::ostream& stream() { return os_; }

private:
    std::ostringstream os_;
};

}  // namespace internal
}  // namespace dsi

#define DSI_LOG(level)                                                  \
    if (::dsi::LogLevel::level < ::dsi::log_level()) {                  \
    } else                                                              \
        ::dsi::internal::LogLine(::dsi::LogLevel::level, __FILE__, __LINE__).stream()
