// StopMatcher: finds stop strings in streamed text, across token boundaries.
//
// Text arrives in pieces (one per token). Policy: text that could still be the start
// of a stop string is held back; when a stop string appears, everything before it is
// emitted and the rest (the stop string and after) is dropped, as the OpenAI API does.
// The earliest match in the text wins. Thread model: one user at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dsi {

class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops);

    struct Piece {
        std::string text;  // safe to emit now
        bool stopped = false;
    };
    // REQUIRES: not stopped yet.
    Piece push(std::string_view text);
    // The held-back text (when the sequence ends without a stop string).
    std::string flush();
    bool stopped() const { return stopped_; }

private:
    std::vector<std::string> stops_;
    std::string held_;
    bool stopped_ = false;
};

}  // namespace dsi
