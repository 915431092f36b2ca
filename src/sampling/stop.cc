#include "sampling/stop.h"

#include <algorithm>

#include "base/check.h"

namespace dsi {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

StopMatcher::Piece StopMatcher::push(std::string_view text) {
    DSI_CHECK(!stopped_);
    held_.append(text);
    Piece out;
    size_t first = std::string::npos;
    for (const std::string& s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
        out.text = held_.substr(0, first);
        out.stopped = stopped_ = true;
        held_.clear();
        return out;
    }
    // Keep the longest suffix of held_ that is a proper prefix of some stop string.
    size_t keep = 0;
    for (const std::string& s : stops_) {
        for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
            if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                keep = k;
                break;
            }
        }
    }
    out.text = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopMatcher::flush() {
    std::string s;
    s.swap(held_);
    return s;
}

}  // namespace dsi
