#include "protocol/json_limits.h"

#include <string>
#include <vector>

namespace dsi::protocol {
namespace {

// One open container while scanning: an array's current index or an object's
// current member name (the step the path takes into it).
struct Frame {
    bool array = false;
    bool expect_key = false;  // object: the next string is a member name
    size_t index = 0;
    std::string key;
};

constexpr size_t kPathSteps = 8;
constexpr size_t kKeyChars = 64;

// `field`, then the steps into the open containers down to the deepest member name
// among the first kPathSteps steps ("tools[0].function.parameters.x" for 20,000 `[`
// under x): the field a client wrote, not a run of "[0]".
std::string frame_path(std::string_view field, const std::vector<Frame>& stack) {
    std::string path(field);
    std::string steps;
    for (size_t i = 0; i < stack.size() && i < kPathSteps; ++i) {
        const Frame& f = stack[i];
        if (f.array) {
            steps += "[" + std::to_string(f.index) + "]";
        } else if (!f.expect_key) {
            if (!path.empty() || !steps.empty()) {
                steps.push_back('.');
            }
            steps += f.key;
            path += steps;
            steps.clear();
        }
    }
    return path.empty() ? std::string("body") : path;
}

}  // namespace

Status check_json_depth(std::string_view text, int max_depth, std::string_view field) {
    std::vector<Frame> stack;
    stack.reserve(16);
    bool in_string = false;
    bool escape = false;
    bool collecting = false;  // the string being read is a member name
    std::string str;
    for (const char c : text) {
        if (in_string) {
            if (escape) {
                escape = false;
            } else if (c == '\\') {
                escape = true;
                continue;
            } else if (c == '"') {
                in_string = false;
                if (collecting) {
                    stack.back().key = std::move(str);
                    stack.back().expect_key = false;
                }
                continue;
            }
            if (collecting && str.size() < kKeyChars) {
                str.push_back(c);
            }
            continue;
        }
        switch (c) {
            case '"':
                in_string = true;
                collecting = !stack.empty() && !stack.back().array && stack.back().expect_key;
                str.clear();
                break;
            case '{':
            case '[':
                if (static_cast<int64_t>(stack.size()) >= max_depth) {
                    return invalid_argument(frame_path(field, stack) + ": JSON nested deeper than " +
                                            std::to_string(max_depth) + " levels");
                }
                stack.push_back(Frame{c == '[', c == '{', 0, {}});
                break;
            case '}':
            case ']':
                if (!stack.empty()) {
                    stack.pop_back();
                }
                break;
            case ',':
                if (!stack.empty()) {
                    if (stack.back().array) {
                        ++stack.back().index;
                    } else {
                        stack.back().expect_key = true;
                    }
                }
                break;
            default:
                break;
        }
    }
    return Status::ok();
}

Result<nlohmann::ordered_json> parse_json(std::string_view text, int max_depth,
                                          std::string_view field) {
    DSI_RETURN_IF_ERROR(check_json_depth(text, max_depth, field));
    try {
        return nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        return invalid_argument((field.empty() ? std::string("body") : std::string(field)) +
                                ": invalid JSON: " + e.what());
    }
}

}  // namespace dsi::protocol
