#include "base/progress.h"

#include <unistd.h>

#include <cinttypes>

#include "base/logging.h"

namespace dsi {
namespace {

std::string amount(int64_t v, Progress::Unit unit) {
    char buf[32];
    if (unit == Progress::Unit::kItems) {
        std::snprintf(buf, sizeof(buf), "%" PRId64, v);
        return buf;
    }
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = static_cast<double>(v);
    int u = 0;
    while (x >= 1024.0 && u < 4) {
        x /= 1024.0;
        ++u;
    }
    std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", x, units[u]);
    return buf;
}

std::string duration(double seconds) {
    const int64_t s = static_cast<int64_t>(seconds + 0.5);
    char buf[32];
    if (s >= 3600) {
        std::snprintf(buf, sizeof(buf), "%" PRId64 ":%02d:%02d", s / 3600,
                      static_cast<int>(s / 60 % 60), static_cast<int>(s % 60));
    } else {
        std::snprintf(buf, sizeof(buf), "%d:%02d", static_cast<int>(s / 60), static_cast<int>(s % 60));
    }
    return buf;
}

std::string rate_text(double per_second, Progress::Unit unit) {
    if (unit == Progress::Unit::kBytes) return amount(static_cast<int64_t>(per_second), unit) + "/s";
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f/s", per_second);
    return buf;
}

}  // namespace

Progress::Progress(std::string label, int64_t total, Unit unit, Options options)
    : label_(std::move(label)),
      unit_(unit),
      show_(options.show.value_or(default_show())),
      redraw_interval_ns_(options.redraw_interval_ns),
      env_(options.env != nullptr ? options.env : Env::default_env()),
      out_(options.out != nullptr ? options.out : stderr),
      start_ns_(env_->now_ns()),
      total_(total),
      next_draw_ns_(start_ns_ + redraw_interval_ns_) {}

Progress::~Progress() { finish(); }

bool Progress::default_show() { return isatty(STDERR_FILENO) == 1 && log_level() <= LogLevel::kInfo; }

void Progress::set_total(int64_t total) { total_.store(total, std::memory_order_relaxed); }

void Progress::advance(int64_t n) {
    done_.fetch_add(n, std::memory_order_relaxed);
    if (!show_) return;
    const int64_t now = env_->now_ns();
    if (now < next_draw_ns_.load(std::memory_order_relaxed)) return;
    std::unique_lock<std::mutex> lock(draw_mu_, std::try_to_lock);
    if (!lock.owns_lock() || finished_) return;
    next_draw_ns_.store(now + redraw_interval_ns_, std::memory_order_relaxed);
    draw(false);
}

void Progress::finish() {
    if (!show_) return;
    std::lock_guard<std::mutex> lock(draw_mu_);
    if (finished_) return;
    finished_ = true;
    draw(true);
}

void Progress::draw(bool final_line) {
    const std::string line =
        format_line(label_, done(), total_.load(std::memory_order_relaxed), unit_,
                    env_->now_ns() - start_ns_);
    // \r + erase to end of line: redraw in place.
    std::fprintf(out_, "\r%s\x1b[K%s", line.c_str(), final_line ? "\n" : "");
    std::fflush(out_);
}

std::string Progress::format_line(const std::string& label, int64_t done, int64_t total,
                                  Unit unit, int64_t elapsed_ns) {
    std::string line = label + "  " + amount(done, unit);
    if (total > 0) {
        line += " / " + amount(total, unit);
        char pct[16];
        std::snprintf(pct, sizeof(pct), "  %3d%%",
                      static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total)));
        line += pct;
    }
    const double seconds = static_cast<double>(elapsed_ns) * 1e-9;
    if (seconds > 0 && done > 0) {
        const double rate = static_cast<double>(done) / seconds;
        line += "  " + rate_text(rate, unit);
        if (total > done) line += "  " + duration(static_cast<double>(total - done) / rate) + " left";
    }
    if (total > 0 && done >= total) line += "  done in " + duration(seconds);
    return line;
}

}  // namespace dsi
