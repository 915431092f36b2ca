#include "server/swa_announce.h"

#include <charconv>
#include <nlohmann/json.hpp>

namespace dsi::server {
namespace {

using nlohmann::json;

bool parse_u64(std::string_view s, uint64_t* out) {
    if (s.empty()) return false;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), *out, 10);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

json keys_json(const std::vector<kv::SwaStateKey>& keys) {
    json a = json::array();
    for (const kv::SwaStateKey& k : keys) {
        a.push_back(json::array({chain_key_hex(k.chain), k.position}));
    }
    return a;
}

Status read_keys(const json& j, const char* name, std::vector<kv::SwaStateKey>* out) {
    auto it = j.find(name);
    if (it == j.end()) return Status::ok();
    if (!it->is_array()) return invalid_argument(std::string(name) + ": must be an array");
    for (const json& e : *it) {
        kv::SwaStateKey k;
        if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number_integer() ||
            !parse_chain_key_hex(e[0].get_ref<const std::string&>(), &k.chain)) {
            return invalid_argument(std::string(name) +
                                    ": each entry is [32 hex digits, position]");
        }
        k.position = e[1].get<int64_t>();
        out->push_back(k);
    }
    return Status::ok();
}

Status read_u64(const json& j, const char* name, uint64_t* out) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_string() || !parse_u64(it->get_ref<const std::string&>(), out)) {
        return invalid_argument(std::string(name) + ": must be a decimal string");
    }
    return Status::ok();
}

}  // namespace

std::string encode_swa_announcement(const SwaAnnouncementReply& r) {
    json j = {{"incarnation", std::to_string(r.incarnation)},
              {"next", std::to_string(r.changes.next)},
              {"snapshot", r.changes.snapshot},
              {"fetch_address", r.fetch_address},
              {"added", keys_json(r.changes.added)},
              {"removed", keys_json(r.changes.removed)}};
    return j.dump();
}

Result<SwaAnnouncementReply> decode_swa_announcement(std::string_view body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return invalid_argument("SWA announcement: not a JSON object");
    SwaAnnouncementReply r;
    DSI_RETURN_IF_ERROR(read_u64(j, "incarnation", &r.incarnation));
    DSI_RETURN_IF_ERROR(read_u64(j, "next", &r.changes.next));
    auto s = j.find("snapshot");
    if (s == j.end() || !s->is_boolean()) return invalid_argument("snapshot: must be a boolean");
    r.changes.snapshot = s->get<bool>();
    if (auto f = j.find("fetch_address"); f != j.end()) {
        if (!f->is_string() || f->get_ref<const std::string&>().size() > 300) {
            return invalid_argument("fetch_address: must be host:port or empty");
        }
        r.fetch_address = f->get<std::string>();
    }
    DSI_RETURN_IF_ERROR(read_keys(j, "added", &r.changes.added));
    DSI_RETURN_IF_ERROR(read_keys(j, "removed", &r.changes.removed));
    return r;
}

std::string encode_swa_lookup_target(std::span<const kv::SwaStateKey> keys) {
    std::string t = std::string(kSwaLookupPath) + "?q=";
    for (size_t i = 0; i < keys.size(); ++i) {
        if (i > 0) t += ',';
        t += chain_key_hex(keys[i].chain) + "." + std::to_string(keys[i].position);
    }
    return t;
}

Result<std::vector<kv::SwaStateKey>> decode_swa_lookup_target(std::string_view target) {
    const size_t q = target.find("?q=");
    if (q == std::string_view::npos) return invalid_argument("swa_lookup: no q= in the query");
    std::string_view rest = target.substr(q + 3);
    std::vector<kv::SwaStateKey> out;
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        const size_t dot = item.find('.');
        kv::SwaStateKey k;
        uint64_t pos = 0;
        if (dot == std::string_view::npos || !parse_chain_key_hex(item.substr(0, dot), &k.chain) ||
            !parse_u64(item.substr(dot + 1), &pos) || pos == 0 || pos > (uint64_t{1} << 40)) {
            return invalid_argument("swa_lookup: each state is KEY(32 hex).POSITION");
        }
        k.position = static_cast<int64_t>(pos);
        out.push_back(k);
        if (out.size() > kMaxSwaLookupStates)
            return invalid_argument("swa_lookup: too many states");
        if (comma == std::string_view::npos) break;
        rest = rest.substr(comma + 1);
    }
    return out;
}

std::string encode_swa_lookup_answer(const std::vector<SwaLookupHeld>& held) {
    json a = json::array();
    for (const SwaLookupHeld& h : held) {
        a.push_back(json::array({chain_key_hex(h.key.chain), h.key.position, h.engines}));
    }
    return json{{"held", std::move(a)}}.dump();
}

Result<std::vector<SwaLookupHeld>> decode_swa_lookup_answer(std::string_view body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("held") || !j["held"].is_array()) {
        return invalid_argument("swa_lookup answer: no held array");
    }
    std::vector<SwaLookupHeld> out;
    for (const json& e : j["held"]) {
        SwaLookupHeld h;
        if (!e.is_array() || e.size() != 3 || !e[0].is_string() || !e[1].is_number_integer() ||
            !e[2].is_array() ||
            !parse_chain_key_hex(e[0].get_ref<const std::string&>(), &h.key.chain)) {
            return invalid_argument("swa_lookup answer: each entry is [key, position, [engines]]");
        }
        h.key.position = e[1].get<int64_t>();
        for (const json& n : e[2]) {
            if (!n.is_string())
                return invalid_argument("swa_lookup answer: engine ids are strings");
            h.engines.push_back(n.get<std::string>());
        }
        out.push_back(std::move(h));
    }
    return out;
}

uint64_t swa_announcement_since(std::string_view target) {
    const size_t q = target.find('?');
    if (q == std::string_view::npos) return 0;
    std::string_view query = target.substr(q + 1);
    while (!query.empty()) {
        const size_t amp = query.find('&');
        const std::string_view kv = query.substr(0, amp);
        if (kv.rfind("since=", 0) == 0) {
            uint64_t v = 0;
            return parse_u64(kv.substr(6), &v) ? v : 0;
        }
        if (amp == std::string_view::npos) break;
        query = query.substr(amp + 1);
    }
    return 0;
}

}  // namespace dsi::server
