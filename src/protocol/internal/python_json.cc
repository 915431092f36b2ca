#include "protocol/internal/python_json.h"

#include <cstdio>

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

void dump_into(const nlohmann::ordered_json& v, std::string* out) {
    switch (v.type()) {
        case nlohmann::ordered_json::value_t::object: {
            out->push_back('{');
            bool first = true;
            for (const auto& [k, x] : v.items()) {
                if (!first) {
                    out->append(", ");
                }
                first = false;
                out->push_back('"');
                append_json_escaped(k, out);
                out->append("\": ");
                dump_into(x, out);
            }
            out->push_back('}');
            break;
        }
        case nlohmann::ordered_json::value_t::array: {
            out->push_back('[');
            bool first = true;
            for (const auto& x : v) {
                if (!first) {
                    out->append(", ");
                }
                first = false;
                dump_into(x, out);
            }
            out->push_back(']');
            break;
        }
        case nlohmann::ordered_json::value_t::string:
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

std::string python_dumps(const nlohmann::ordered_json& v) {
    std::string out;
    dump_into(v, &out);
    return out;
}

}  // namespace dsi::protocol::internal
