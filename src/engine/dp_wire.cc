#include "engine/dp_wire.h"

#include <nlohmann/json.hpp>

namespace dsi::engine::dp_wire {
namespace {

using json = nlohmann::json;

std::string pack(const json& j) {
    const std::vector<uint8_t> bytes = json::to_msgpack(j);
    return std::string(bytes.begin(), bytes.end());
}

json sampling_json(const SamplingParams& s) {
    return {{"temperature", s.temperature},
            {"top_k", s.top_k},
            {"top_p", s.top_p},
            {"min_p", s.min_p},
            {"repetition_penalty", s.repetition_penalty},
            {"frequency_penalty", s.frequency_penalty},
            {"presence_penalty", s.presence_penalty},
            {"logit_bias", s.logit_bias},
            {"stop_token_ids", s.stop_token_ids},
            {"stop", s.stop},
            {"ignore_eos", s.ignore_eos},
            {"max_tokens", s.max_tokens},
            {"min_tokens", s.min_tokens},
            {"logprobs", s.logprobs},
            {"n", s.n},
            {"seed", s.seed}};
}

SamplingParams sampling_from(const json& j) {
    SamplingParams s;
    s.temperature = j.at("temperature").get<double>();
    s.top_k = j.at("top_k").get<int64_t>();
    s.top_p = j.at("top_p").get<double>();
    s.min_p = j.at("min_p").get<double>();
    s.repetition_penalty = j.at("repetition_penalty").get<double>();
    s.frequency_penalty = j.at("frequency_penalty").get<double>();
    s.presence_penalty = j.at("presence_penalty").get<double>();
    s.logit_bias = j.at("logit_bias").get<std::vector<std::pair<int32_t, float>>>();
    s.stop_token_ids = j.at("stop_token_ids").get<std::vector<int32_t>>();
    s.stop = j.at("stop").get<std::vector<std::string>>();
    s.ignore_eos = j.at("ignore_eos").get<bool>();
    s.max_tokens = j.at("max_tokens").get<int64_t>();
    s.min_tokens = j.at("min_tokens").get<int64_t>();
    s.logprobs = j.at("logprobs").get<int32_t>();
    s.n = j.at("n").get<int32_t>();
    s.seed = j.at("seed").get<uint64_t>();
    return s;
}

// A KV export (a prefill's hand-over, issue 18) as the rank's finishing event carries
// it; the layers and the SWA state (V4, V4.1: the stored slot + seal at the last full
// block's end) as MessagePack bin.
json kv_json(const kv::KvExport& x) {
    json keys = json::array();
    for (const kvstore::StoreKey& k : x.keys) keys.push_back({k.lo, k.hi});
    json layers = json::array();
    for (const std::vector<uint8_t>& l : x.layers) layers.push_back(json::binary(l));
    json j = {{"model", x.model_id},
              {"dtype", x.dtype},
              {"traffic", static_cast<int>(x.traffic_class)},
              {"block_tokens", x.block_tokens},
              {"layer_bytes", x.layer_block_bytes},
              {"keys", std::move(keys)},
              {"hashes", x.token_hashes},
              {"layers", std::move(layers)}};
    if (x.tail_tokens > 0) {
        j["tail"] = {x.tail_tokens, x.tail_key.lo, x.tail_key.hi, x.tail_token_hash};
    }
    if (x.swa_state != nullptr) {
        const kv::SwaState& s = *x.swa_state;
        j["swa"] = {s.key.chain.lo, s.key.chain.hi, s.key.position,
                    static_cast<int>(s.traffic_class), json::binary(s.bytes)};
    }
    return j;
}

Result<std::shared_ptr<const kv::KvExport>> kv_from(const json& j) {
    auto x = std::make_shared<kv::KvExport>();
    x->model_id = j.at("model").get<std::string>();
    x->dtype = j.at("dtype").get<uint32_t>();
    const int traffic = j.at("traffic").get<int>();
    if (traffic < 0 || traffic >= kvstore::kNumTrafficClasses) {
        return invalid_argument("dp message: traffic class " + std::to_string(traffic));
    }
    x->traffic_class = static_cast<kvstore::TrafficClass>(traffic);
    x->block_tokens = j.at("block_tokens").get<uint32_t>();
    x->layer_block_bytes = j.at("layer_bytes").get<std::vector<uint64_t>>();
    for (const json& k : j.at("keys")) {
        x->keys.push_back({k.at(0).get<uint64_t>(), k.at(1).get<uint64_t>()});
    }
    x->token_hashes = j.at("hashes").get<std::vector<uint64_t>>();
    for (const json& l : j.at("layers")) x->layers.push_back(l.get_binary());
    if (j.contains("tail")) {  // the rows past the last full block (kv::KvExport)
        const json& t = j.at("tail");
        x->tail_tokens = t.at(0).get<uint32_t>();
        x->tail_key = {t.at(1).get<uint64_t>(), t.at(2).get<uint64_t>()};
        x->tail_token_hash = t.at(3).get<uint64_t>();
    }
    if (j.contains("swa")) {  // the SWA state at the last full block's end (V4, V4.1)
        const json& s = j.at("swa");
        auto st = std::make_shared<kv::SwaState>();
        st->key.chain = {s.at(0).get<uint64_t>(), s.at(1).get<uint64_t>()};
        st->key.position = s.at(2).get<int64_t>();
        const int state_traffic = s.at(3).get<int>();
        if (state_traffic < 0 || state_traffic >= kvstore::kNumTrafficClasses) {
            return invalid_argument("dp message: SWA state traffic class " +
                                    std::to_string(state_traffic));
        }
        st->traffic_class = static_cast<kvstore::TrafficClass>(state_traffic);
        st->bytes = s.at(4).get_binary();
        const bool at_end =
            !x->keys.empty() && x->tail_tokens == 0 &&
            st->key.chain == kv::BlockKey{x->keys.back().lo, x->keys.back().hi} &&
            st->key.position == static_cast<int64_t>(x->keys.size() * x->block_tokens);
        if (!at_end || st->bytes.empty()) {
            return invalid_argument("dp message: an SWA state that is not the export's end");
        }
        x->swa_state = std::move(st);
    }
    bool ok = x->token_hashes.size() == x->keys.size() &&
              x->layers.size() == x->layer_block_bytes.size() && x->tail_tokens < x->block_tokens;
    for (size_t l = 0; ok && l < x->layers.size(); ++l) {
        ok = x->layers[l].size() == x->keys.size() * x->layer_block_bytes[l] + x->tail_bytes(l);
    }
    if (!ok) return invalid_argument("dp message: a KV export of inconsistent sizes");
    return std::shared_ptr<const kv::KvExport>(std::move(x));
}

}  // namespace

std::string encode_request(RequestId id, const GenerateRequest& r) {
    json j = {{"t", "req"},
              {"id", id},
              {"prompt", r.prompt},
              {"sampling", sampling_json(r.sampling)},
              {"cache_salt", r.cache_salt},
              {"deadline_ns", r.deadline_ns},
              {"agent_traffic", r.agent_traffic},
              {"resume_output", r.resume_output},
              {"export_kv", r.export_kv}};
    if (r.mask != nullptr) {
        const std::string form = r.mask->portable_form();
        j["mask"] = json::binary(std::vector<uint8_t>(form.begin(), form.end()));
    }
    return pack(j);
}

std::string encode_abort(RequestId id) { return pack({{"t", "abort"}, {"id", id}}); }

std::string encode_end() { return pack({{"t", "end"}}); }

std::string encode_reset(bool async) { return pack({{"t", "reset"}, {"async", async}}); }

std::string encode_event(RequestId id, const TokenEvent& e) {
    json top = json::array();
    for (const auto& [token, logprob] : e.top_logprobs) top.push_back({token, logprob});
    json j = {{"t", "ev"},
              {"id", id},
              {"index", e.index},
              {"token", e.token},
              {"text", e.text},
              {"logprob", e.logprob},
              {"top", std::move(top)},
              {"finished", e.finished},
              {"reason", static_cast<int>(e.reason)},
              {"cached", e.cached_prompt_tokens}};
    if (e.kv_export != nullptr) {
        j["kv"] = kv_json(*e.kv_export);
    }
    return pack(j);
}

std::string encode_error(RequestId id, const Status& error) {
    return pack({{"t", "err"},
                 {"id", id},
                 {"code", static_cast<int>(error.code())},
                 {"msg", error.message()}});
}

std::string encode_load(const RankLoad& l, const RankCounters& c, const ExpertParallelStats* ep) {
    json j = {{"t", "load"},
              {"running", l.running_seqs},
              {"used", l.kv_blocks_used},
              {"blocks", l.kv_blocks},
              {"steps", c.steps},
              {"fwd_ns", c.forward_ns},
              {"gap_ns", c.host_gap_ns}};
    if (ep != nullptr) {
        json windows = json::array();
        for (const ExpertParallelStats::Window& w : ep->windows) {
            windows.push_back({w.end_step, w.placement, w.moe_lb, w.placed_moe_lb});
        }
        j["ep"] = {{"ranks", ep->num_ranks},     {"failovers", ep->failovers},
                   {"steps", ep->steps},         {"changes", ep->placement_changes},
                   {"rows", ep->rank_rows},      {"windows", std::move(windows)},
                   {"placed", ep->placed_moe_lb}};
    }
    return pack(j);
}

Result<Message> decode(const std::string& text) {
    Message m;
    try {
        const json j = json::from_msgpack(text);
        const std::string t = j.at("t").get<std::string>();
        if (t == "req") {
            m.kind = Message::Kind::kRequest;
            m.id = j.at("id").get<RequestId>();
            m.request.prompt = j.at("prompt").get<std::vector<int32_t>>();
            m.request.sampling = sampling_from(j.at("sampling"));
            m.request.cache_salt = j.at("cache_salt").get<std::string>();
            m.request.deadline_ns = j.at("deadline_ns").get<int64_t>();
            m.request.agent_traffic = j.at("agent_traffic").get<bool>();
            m.request.resume_output = j.at("resume_output").get<std::vector<int32_t>>();
            m.request.export_kv = j.at("export_kv").get<bool>();
            if (auto it = j.find("mask"); it != j.end()) {
                const std::vector<uint8_t>& form = it->get_binary();
                m.mask_form.assign(form.begin(), form.end());
                m.has_mask = true;
            }
        } else if (t == "abort") {
            m.kind = Message::Kind::kAbort;
            m.id = j.at("id").get<RequestId>();
        } else if (t == "end") {
            m.kind = Message::Kind::kEnd;
        } else if (t == "reset") {
            m.kind = Message::Kind::kReset;
            m.async = j.at("async").get<bool>();
        } else if (t == "ev") {
            m.kind = Message::Kind::kEvent;
            m.id = j.at("id").get<RequestId>();
            m.event.request_id = m.id;
            m.event.index = j.at("index").get<int32_t>();
            m.event.token = j.at("token").get<int32_t>();
            m.event.text = j.at("text").get<std::string>();
            m.event.logprob = j.at("logprob").get<float>();
            for (const json& p : j.at("top")) {
                m.top_logprobs.emplace_back(p.at(0).get<int32_t>(), p.at(1).get<float>());
            }
            m.event.finished = j.at("finished").get<bool>();
            const int reason = j.at("reason").get<int>();
            if (reason < 0 || reason > static_cast<int>(FinishReason::kError)) {
                return invalid_argument("dp message: finish reason " + std::to_string(reason));
            }
            m.event.reason = static_cast<FinishReason>(reason);
            m.event.cached_prompt_tokens = j.at("cached").get<int64_t>();
            if (auto kv = j.find("kv"); kv != j.end()) {
                DSI_ASSIGN_OR_RETURN(m.event.kv_export, kv_from(*kv));
            }
        } else if (t == "err") {
            m.kind = Message::Kind::kError;
            m.id = j.at("id").get<RequestId>();
            const int code = j.at("code").get<int>();
            if (code <= 0 || code > static_cast<int>(StatusCode::kDataLoss)) {
                return invalid_argument("dp message: status code " + std::to_string(code));
            }
            m.error = Status(static_cast<StatusCode>(code), j.at("msg").get<std::string>());
        } else if (t == "load") {
            m.kind = Message::Kind::kLoad;
            m.load.running_seqs = j.at("running").get<int64_t>();
            m.load.kv_blocks_used = j.at("used").get<int64_t>();
            m.load.kv_blocks = j.at("blocks").get<int64_t>();
            m.counters.steps = j.at("steps").get<int64_t>();
            m.counters.forward_ns = j.at("fwd_ns").get<int64_t>();
            m.counters.host_gap_ns = j.at("gap_ns").get<int64_t>();
            if (j.contains("ep")) {
                const json& e = j.at("ep");
                ExpertParallelStats& ep = m.ep.emplace();
                ep.num_ranks = e.at("ranks").get<int>();
                ep.failovers = e.at("failovers").get<int64_t>();
                ep.steps = e.at("steps").get<int64_t>();
                ep.placement_changes = e.at("changes").get<int64_t>();
                ep.rank_rows = e.at("rows").get<std::vector<int64_t>>();
                for (const json& w : e.at("windows")) {
                    ep.windows.push_back({w.at(0).get<int64_t>(), w.at(1).get<int64_t>(),
                                          w.at(2).get<double>(), w.at(3).get<double>()});
                }
                ep.placed_moe_lb = e.at("placed").get<double>();
            }
        } else {
            return invalid_argument("dp message: unknown kind '" + t + "'");
        }
    } catch (const json::exception& e) {
        // The adapter around a library that throws (STYLE 2).
        return invalid_argument(std::string("dp message: ") + e.what());
    }
    return m;
}

}  // namespace dsi::engine::dp_wire
