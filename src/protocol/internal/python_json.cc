#include "protocol/internal/python_json.h"

#include <cstdio>
#include <vector>

namespace dsi::protocol::internal {

void append_json_escaped(std::string_view s, std::string* out) {
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
            case '"': out->append("\\\""); break;
            case '\\': out->append("\\\\"); break;
            case '\n': out->append("\\n"); break;
            case '\r': out->append("\\r"); break;
            case '\t': out->append("\\t"); break;
            case '\b': out->append("\\b"); break;
            case '\f': out->append("\\f"); break;
            default:
                if (u < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\u%04x", u);
                    out->append(buf);
                } else {
                    out->push_back(c);
                }
        }
    }
}

namespace {

using OJ = nlohmann::ordered_json;

// Writes a scalar, or the opening bracket of a container (the caller walks it).
void open_value(const OJ& v, std::string* out) {
    switch (v.type()) {
        case OJ::value_t::object: out->push_back('{'); break;
        case OJ::value_t::array: out->push_back('['); break;
        case OJ::value_t::string:
            out->push_back('"');
            append_json_escaped(v.get_ref<const std::string&>(), out);
            out->push_back('"');
            break;
        default:
            // Numbers, booleans, null: nlohmann prints these as Python does
            // ("true", "null", shortest round-trip floats).
            out->append(v.dump());
    }
}

}  // namespace

// An explicit stack instead of recursion: the depth of `v` costs heap, not stack
// (issue 22 D1; request values are depth-checked on parse as well).
std::string python_dumps(const OJ& v) {
    struct Frame {
        const OJ* value;
        OJ::const_iterator next;
    };
    std::string out;
    std::vector<Frame> stack;
    open_value(v, &out);
    if (v.is_structured()) {
        stack.push_back(Frame{&v, v.cbegin()});
    }
    while (!stack.empty()) {
        Frame& f = stack.back();
        if (f.next == f.value->cend()) {
            out.push_back(f.value->is_object() ? '}' : ']');
            stack.pop_back();
            continue;
        }
        if (f.next != f.value->cbegin()) {
            out.append(", ");
        }
        if (f.value->is_object()) {
            out.push_back('"');
            append_json_escaped(f.next.key(), &out);
            out.append("\": ");
        }
        const OJ& child = *f.next;
        ++f.next;
        open_value(child, &out);
        if (child.is_structured()) {
            stack.push_back(Frame{&child, child.cbegin()});  // `f` is not used after this
        }
    }
    return out;
}

}  // namespace dsi::protocol::internal
