// Progress: the one-line progress display of long commands (make-model, calibrate,
// store GC, trace replays): what is done of the total, the rate and the time left,
// redrawn in place on stderr at most every `redraw_interval_ns`.
//
// It shows only where a person watches: stderr is a terminal and the log level is info
// or lower (`--log-level warning` or a pipe keeps it quiet; logs stay clean). A
// Progress that is not shown costs one atomic add per advance().
//
// Thread model: advance() and set_total() may be called from any thread; drawing is
// serialised by a mutex that advance() only try-locks, so a worker never waits on the
// terminal. finish() (also run by the destructor) draws the final line and a newline.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>

#include "base/env.h"

namespace dsi {

class Progress {
public:
    enum class Unit { kItems, kBytes };
    struct Options {
        // Default: shown iff stderr is a terminal and log_level() <= kInfo.
        std::optional<bool> show;
        int64_t redraw_interval_ns = 200'000'000;
        Env* env = nullptr;          // clock; default Env::default_env()
        std::FILE* out = nullptr;    // default stderr
    };

    // `total` 0: unknown (no percentage, no time left).
    Progress(std::string label, int64_t total, Unit unit, Options options);
    Progress(std::string label, int64_t total, Unit unit) : Progress(std::move(label), total, unit, {}) {}
    ~Progress();
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    void advance(int64_t n);
    void set_total(int64_t total);
    // Draws the final line (once). Later calls do nothing.
    void finish();

    bool shown() const { return show_; }
    int64_t done() const { return done_.load(std::memory_order_relaxed); }

    // The line for a state, without control characters, e.g.
    // "make-model  1.20 GiB / 3.40 GiB  35%  150.0 MiB/s  0:15 left".
    static std::string format_line(const std::string& label, int64_t done, int64_t total,
                                   Unit unit, int64_t elapsed_ns);
    // Whether stderr is a terminal and the log level lets info through.
    static bool default_show();

private:
    void draw(bool final_line);

    const std::string label_;
    const Unit unit_;
    const bool show_;
    const int64_t redraw_interval_ns_;
    Env* const env_;
    std::FILE* const out_;
    const int64_t start_ns_;
    std::atomic<int64_t> total_;
    std::atomic<int64_t> done_{0};
    std::atomic<int64_t> next_draw_ns_;
    std::mutex draw_mu_;
    bool finished_ = false;  // guarded by draw_mu_
};

}  // namespace dsi
