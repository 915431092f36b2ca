#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "model/internal/format_util.h"

namespace dsi {
namespace {

using json = nlohmann::json;
using internal::quote_name;

std::string file_context(const std::string& path) { return "safetensors '" + path + "'"; }

// Thrown by HeaderParser's callback to stop nlohmann's parser; the Status is kept in
// the parser. Never leaves this file (STYLE 2: exceptions stay inside the adapter).
struct StopParse {};

// Turns the header JSON into entries while nlohmann parses it. The callback keeps the
// DOM small and bounded on hostile input: each tensor object is converted and dropped
// as soon as it closes, nesting deeper than name -> field -> list is refused, lists
// hold at most kMaxTensorDims items, and duplicate keys (which nlohmann would silently
// overwrite) are errors.
class HeaderParser {
public:
    HeaderParser(std::string context, uint64_t data_size)
        : context_(std::move(context)), data_size_(data_size) {}

    Status parse(std::string_view text) {
        try {
            json::parser_callback_t cb = [this](int depth, json::parse_event_t event,
                                                json& parsed) {
                return on_event(depth, event, parsed);
            };
            json root = json::parse(text.begin(), text.end(), cb);
            (void)root;
        } catch (const StopParse&) {
            return error_;
        } catch (const json::exception& e) {
            return invalid_argument(context_ + ": header is not valid JSON: " + e.what());
        }
        return Status::ok();
    }

    std::vector<SafetensorsEntry>& entries() { return entries_; }
    std::map<std::string, std::string>& metadata() { return metadata_; }

private:
    using Event = json::parse_event_t;

    [[noreturn]] void fail(Status status) {
        error_ = std::move(status);
        throw StopParse{};
    }
    [[noreturn]] void fail_entry(const std::string& what) {
        fail(invalid_argument(context_ + ": tensor " + quote_name(current_) + ": " + what));
    }

    bool on_event(int depth, Event event, json& parsed) {
        switch (event) {
            case Event::object_start:
                if (depth >= 2) fail_entry("unexpected nested object");
                keys_.emplace_back();
                return true;
            case Event::object_end:
                keys_.pop_back();
                if (depth == 1) {
                    convert(parsed);
                    return false;  // drop it from the DOM
                }
                return true;
            case Event::array_start:
                if (depth == 0) fail(invalid_argument(context_ + ": header is not a JSON object"));
                if (depth == 1) fail_entry("is not a JSON object");
                if (depth >= 3) fail_entry("unexpected nested list");
                num_items_ = 0;
                return true;
            case Event::array_end: return true;
            case Event::key: {
                const std::string& key = parsed.get_ref<const std::string&>();
                if (depth == 1) current_ = key;
                if (!keys_.back().insert(key).second) {
                    if (depth == 1) fail_entry("appears more than once");
                    fail_entry("field " + quote_name(key) + " appears more than once");
                }
                return true;
            }
            case Event::value:
                if (depth == 0) fail(invalid_argument(context_ + ": header is not a JSON object"));
                if (depth == 1) fail_entry("is not a JSON object");
                if (depth == 3 && ++num_items_ > internal::kMaxTensorDims) {
                    fail_entry("list has more than " + std::to_string(internal::kMaxTensorDims) +
                               " items");
                }
                return true;
        }
        return true;
    }

    void convert(const json& obj) {
        if (current_ == "__metadata__") {
            for (const auto& [key, value] : obj.items()) {
                if (!value.is_string()) {
                    fail(invalid_argument(context_ + ": __metadata__ value " + quote_name(key) +
                                          " is not a string"));
                }
                metadata_[key] = value.get<std::string>();
            }
            return;
        }
        Result<SafetensorsEntry> entry = make_entry(obj);
        if (!entry.is_ok()) {
            fail(entry.status().with_context(context_ + ": tensor " + quote_name(current_)));
        }
        entries_.push_back(std::move(entry).value());
    }

    Result<SafetensorsEntry> make_entry(const json& obj) const {
        SafetensorsEntry e;
        e.name = current_;
        auto dtype_it = obj.find("dtype");
        if (dtype_it == obj.end() || !dtype_it->is_string()) {
            return invalid_argument("missing string field 'dtype'");
        }
        std::optional<DType> dtype =
            dtype_from_safetensors(dtype_it->get_ref<const std::string&>());
        if (!dtype) {
            return invalid_argument("unsupported dtype " +
                                    quote_name(dtype_it->get_ref<const std::string&>()));
        }
        e.dtype = *dtype;

        auto shape_it = obj.find("shape");
        if (shape_it == obj.end() || !shape_it->is_array()) {
            return invalid_argument("missing list field 'shape'");
        }
        for (size_t i = 0; i < shape_it->size(); ++i) {
            const json& d = (*shape_it)[i];
            std::string which = "dimension " + std::to_string(i);
            if (d.is_number_unsigned()) {
                uint64_t v = d.get<uint64_t>();
                if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                    return invalid_argument(which + " is too large (" + std::to_string(v) + ")");
                }
                e.shape.push_back(static_cast<int64_t>(v));
            } else if (d.is_number_integer()) {
                return invalid_argument(which + " is negative (" + d.dump() + ")");
            } else {
                return invalid_argument(which + " is not an integer");
            }
        }
        DSI_ASSIGN_OR_RETURN(uint64_t nbytes, internal::tensor_nbytes(e.dtype, e.shape));

        auto off_it = obj.find("data_offsets");
        if (off_it == obj.end() || !off_it->is_array() || off_it->size() != 2 ||
            !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
            return invalid_argument("'data_offsets' must be a list of two unsigned integers");
        }
        e.begin = (*off_it)[0].get<uint64_t>();
        e.end = (*off_it)[1].get<uint64_t>();
        std::string offsets = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
        if (e.begin > e.end) {
            return invalid_argument("data_offsets " + offsets + " begin after end");
        }
        if (e.end - e.begin != nbytes) {
            return invalid_argument("data_offsets " + offsets + " hold " +
                                    std::to_string(e.end - e.begin) + " bytes but " +
                                    std::string(dtype_name(e.dtype)) + " " +
                                    shape_to_string(e.shape) + " needs " + std::to_string(nbytes));
        }
        if (e.end > data_size_) {
            return out_of_range("data_offsets " + offsets +
                                " reach past the end of the data section (" +
                                std::to_string(data_size_) + " bytes)");
        }
        return e;
    }

    std::string context_;
    uint64_t data_size_;
    std::vector<SafetensorsEntry> entries_;
    std::map<std::string, std::string> metadata_;
    Status error_;
    std::string current_;                      // the top-level key being parsed
    std::vector<std::set<std::string>> keys_;  // keys seen, per open object
    size_t num_items_ = 0;                     // items of the open list
};

// The reference reader's layout rule: sorted by offsets, the tensors tile the data
// section exactly (no overlap, no gap, nothing after the last one), so a file has one
// reading only.
Status check_layout(const std::string& context, std::vector<SafetensorsEntry>& entries,
                    uint64_t data_size) {
    std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
        return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
    });
    uint64_t expected = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
        const SafetensorsEntry& e = entries[i];
        if (e.begin < expected) {
            return invalid_argument(context + ": tensor " + quote_name(e.name) +
                                    " overlaps tensor " + quote_name(entries[i - 1].name) +
                                    " (begins at " + std::to_string(e.begin) + ", before byte " +
                                    std::to_string(expected) + ")");
        }
        if (e.begin > expected) {
            return invalid_argument(context + ": " + std::to_string(e.begin - expected) +
                                    " unused bytes before tensor " + quote_name(e.name) +
                                    " (data section has a hole)");
        }
        expected = e.end;
    }
    if (expected != data_size) {
        return invalid_argument(context + ": " + std::to_string(data_size - expected) +
                                " bytes after the last tensor are not covered by any tensor");
    }
    return Status::ok();
}

}  // namespace

// ---------------------------------------------------------------------------------
// SafetensorsFile

Result<SafetensorsFile> SafetensorsFile::open(Env* env, const std::string& path) {
    DSI_ASSIGN_OR_RETURN(MappedFile mapping, env->map_file(path));
    return parse(std::move(mapping));
}

Result<SafetensorsFile> SafetensorsFile::parse(MappedFile file) {
    return parse_impl(internal::SourceBytes::owned(std::move(file)));
}

Result<SafetensorsFile> SafetensorsFile::parse_bytes(std::span<const uint8_t> bytes,
                                                     std::string path) {
    return parse_impl(internal::SourceBytes::borrowed(bytes, std::move(path)));
}

Result<SafetensorsFile> SafetensorsFile::parse_impl(internal::SourceBytes source) {
    SafetensorsFile file;
    file.source_ = std::move(source);
    const std::span<const uint8_t> bytes = file.source_.bytes;
    const std::string context = file_context(file.source_.path);
    if (bytes.size() < 8) {
        return data_loss(context + ": file has " + std::to_string(bytes.size()) +
                         " bytes, too short for the 8-byte header length");
    }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[static_cast<size_t>(i)];
    if (header_len > kSafetensorsMaxHeaderBytes) {
        return invalid_argument(context + ": header length " + std::to_string(header_len) +
                                " exceeds the limit of " +
                                std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
    }
    if (header_len > bytes.size() - 8) {
        return data_loss(context + ": header length " + std::to_string(header_len) +
                         " exceeds the " + std::to_string(bytes.size() - 8) +
                         " bytes after it (truncated file?)");
    }
    std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), header_len);
    file.data_ = bytes.subspan(8 + header_len);

    HeaderParser parser(context, file.data_.size());
    DSI_RETURN_IF_ERROR(parser.parse(text));
    file.entries_ = std::move(parser.entries());
    file.metadata_ = std::move(parser.metadata());
    DSI_RETURN_IF_ERROR(check_layout(context, file.entries_, file.data_.size()));
    for (size_t i = 0; i < file.entries_.size(); ++i) file.index_[file.entries_[i].name] = i;
    return file;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
}

Result<TensorView> SafetensorsFile::view(std::string_view name) const {
    const SafetensorsEntry* e = find(name);
    if (e == nullptr) {
        return not_found(file_context(source_.path) + ": no tensor " + quote_name(name));
    }
    return view(*e);
}

TensorView SafetensorsFile::view(const SafetensorsEntry& e) const {
    return TensorView{e.dtype, e.shape, data_.subspan(e.begin, e.end - e.begin)};
}

// ---------------------------------------------------------------------------------
// SafetensorsWriter

namespace {

Status check_safetensors_tensor(const internal::TensorQueue::Tensor& t) {
    if (t.name == "__metadata__") return invalid_argument("the name is reserved");
    if (dtype_safetensors_name(t.dtype).empty()) {
        return invalid_argument("dtype " + std::string(dtype_name(t.dtype)) +
                                " has no safetensors name");
    }
    return Status::ok();
}

}  // namespace

SafetensorsWriter::SafetensorsWriter()
    : queue_("safetensors writer", internal::kMaxTensorDims, &check_safetensors_tensor) {}

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::span<const uint8_t> bytes) {
    queue_.add(std::move(name), dtype, std::move(shape), bytes, /*copy=*/true);
}

void SafetensorsWriter::add_borrowed(std::string name, DType dtype, std::vector<int64_t> shape,
                                     std::span<const uint8_t> bytes) {
    queue_.add(std::move(name), dtype, std::move(shape), bytes, /*copy=*/false);
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
}

Result<std::string> SafetensorsWriter::serialize() const {
    if (!queue_.error().is_ok()) return queue_.error();
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    uint64_t offset = 0;
    for (const internal::TensorQueue::Tensor& p : queue_.tensors()) {
        nlohmann::ordered_json entry = nlohmann::ordered_json::object();
        entry["dtype"] = dtype_safetensors_name(p.dtype);
        entry["shape"] = p.shape;
        entry["data_offsets"] = nlohmann::ordered_json::array({offset, offset + p.bytes.size()});
        header[p.name] = std::move(entry);
        offset += p.bytes.size();
    }
    std::string text;
    try {
        text = header.dump();
    } catch (const nlohmann::json::exception& e) {
        return invalid_argument(std::string("safetensors writer: a tensor name or metadata "
                                            "string is not valid UTF-8: ") +
                                e.what());
    }
    text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-aligned
    std::string out;
    out.reserve(8 + text.size() + queue_.data_bytes());
    internal::append_le(out, text.size(), 8);
    out += text;
    for (const internal::TensorQueue::Tensor& p : queue_.tensors()) {
        out.append(reinterpret_cast<const char*>(p.bytes.data()), p.bytes.size());
    }
    return out;
}

Status SafetensorsWriter::write(Env* env, const std::string& path) const {
    Result<std::string> bytes = serialize();
    if (!bytes.is_ok()) return bytes.status().with_context(path);
    return env->write_file(path, *bytes);
}

// ---------------------------------------------------------------------------------
// SafetensorsSet

namespace {

std::string join_path(const std::string& dir, std::string_view file) {
    return dir + "/" + std::string(file);
}

// A shard named by the index must be a plain file name inside the directory.
bool is_plain_file_name(const std::string& name) {
    return !name.empty() && name != "." && name != ".." &&
           name.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos;
}

// Reads the index JSON and returns its weight_map (tensor -> shard file name).
Result<std::map<std::string, std::string>> read_weight_map(Env* env, const std::string& path) {
    const std::string context = "safetensors index '" + path + "'";
    DSI_ASSIGN_OR_RETURN(uint64_t size, env->file_size(path));
    if (size > kSafetensorsMaxHeaderBytes) {
        return invalid_argument(context + ": " + std::to_string(size) +
                                " bytes exceeds the limit of " +
                                std::to_string(kSafetensorsMaxHeaderBytes));
    }
    DSI_ASSIGN_OR_RETURN(std::string text, env->read_file(path));
    json root;
    try {
        root = json::parse(text);
    } catch (const json::exception& e) {
        return invalid_argument(context + ": not valid JSON: " + e.what());
    }
    if (!root.is_object()) return invalid_argument(context + ": not a JSON object");
    auto map_it = root.find("weight_map");
    if (map_it == root.end() || !map_it->is_object()) {
        return invalid_argument(context + ": missing object 'weight_map'");
    }
    std::map<std::string, std::string> weight_map;
    for (const auto& [tensor, file] : map_it->items()) {
        if (!file.is_string() || !is_plain_file_name(file.get_ref<const std::string&>())) {
            return invalid_argument(context + ": tensor " + quote_name(tensor) +
                                    " maps to something other than a file name in the "
                                    "directory");
        }
        weight_map[tensor] = file.get<std::string>();
    }
    return weight_map;
}

}  // namespace

Result<SafetensorsSet> SafetensorsSet::open_dir(Env* env, const std::string& dir) {
    SafetensorsSet set;
    set.dir_ = dir;
    const std::string index_path = join_path(dir, kSafetensorsIndexFile);
    if (!env->file_exists(index_path)) {
        const std::string single = join_path(dir, kSafetensorsSingleFile);
        if (!env->file_exists(single)) {
            return not_found("safetensors dir '" + dir + "': neither " +
                             std::string(kSafetensorsSingleFile) + " nor " +
                             std::string(kSafetensorsIndexFile) + " exists");
        }
        DSI_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(env, single));
        for (const SafetensorsEntry& e : file.entries()) set.file_of_[e.name] = 0;
        set.files_.push_back(std::move(file));
        return set;
    }

    DSI_ASSIGN_OR_RETURN(auto weight_map, read_weight_map(env, index_path));
    std::map<std::string, size_t> shard_index;  // file name -> files_ index
    for (const auto& [tensor, file_name] : weight_map) {
        auto [it, inserted] = shard_index.emplace(file_name, set.files_.size());
        if (inserted) {
            DSI_ASSIGN_OR_RETURN(SafetensorsFile file,
                                 SafetensorsFile::open(env, join_path(dir, file_name)));
            set.files_.push_back(std::move(file));
        }
        if (set.files_[it->second].find(tensor) == nullptr) {
            return data_loss("safetensors index '" + index_path + "': tensor " +
                             quote_name(tensor) + " is mapped to shard '" + file_name +
                             "', which does not contain it");
        }
        set.file_of_[tensor] = it->second;
    }
    return set;
}

const SafetensorsFile* SafetensorsSet::file_of(std::string_view name) const {
    auto it = file_of_.find(name);
    return it == file_of_.end() ? nullptr : &files_[it->second];
}

const SafetensorsEntry* SafetensorsSet::find(std::string_view name) const {
    const SafetensorsFile* file = file_of(name);
    return file == nullptr ? nullptr : file->find(name);
}

bool SafetensorsSet::has(std::string_view name) const { return file_of_.count(name) != 0; }

Result<TensorView> SafetensorsSet::view(std::string_view name) const {
    const SafetensorsFile* file = file_of(name);
    if (file == nullptr) {
        return not_found("safetensors dir '" + dir_ + "': no tensor " + quote_name(name));
    }
    return file->view(name);
}

std::vector<std::string> SafetensorsSet::names() const {
    std::vector<std::string> out;
    out.reserve(file_of_.size());
    for (const auto& [name, index] : file_of_) out.push_back(name);
    return out;
}

// ---------------------------------------------------------------------------------
// write_sharded_safetensors

Status write_sharded_safetensors(Env* env, const std::string& dir,
                                 std::span<const SafetensorsTensor> tensors,
                                 uint64_t max_shard_bytes,
                                 const std::map<std::string, std::string>& metadata) {
    DSI_CHECK(max_shard_bytes > 0, "max_shard_bytes must be positive");
    std::set<std::string_view> seen;
    for (const SafetensorsTensor& t : tensors) {
        if (!seen.insert(t.name).second) {
            return invalid_argument("safetensors writer '" + dir + "': tensor " +
                                    quote_name(t.name) + " added twice");
        }
    }
    // Shards as [first, last) ranges of `tensors`.
    std::vector<std::pair<size_t, size_t>> shards;
    size_t first = 0;
    uint64_t shard_bytes = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        uint64_t n = tensors[i].bytes.size();
        if (i > first && shard_bytes + n > max_shard_bytes) {
            shards.emplace_back(first, i);
            first = i;
            shard_bytes = 0;
        }
        shard_bytes += n;
    }
    shards.emplace_back(first, tensors.size());

    DSI_RETURN_IF_ERROR(env->create_dirs(dir));
    json weight_map = json::object();
    uint64_t total_size = 0;
    for (size_t k = 0; k < shards.size(); ++k) {
        std::string file_name(kSafetensorsSingleFile);
        if (shards.size() > 1) {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", k + 1,
                          shards.size());
            file_name = buf;
        }
        SafetensorsWriter writer;
        for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
        for (size_t i = shards[k].first; i < shards[k].second; ++i) {
            const SafetensorsTensor& t = tensors[i];
            writer.add_borrowed(t.name, t.dtype, t.shape, t.bytes);
            weight_map[t.name] = file_name;
        }
        total_size += writer.data_bytes();
        DSI_RETURN_IF_ERROR(writer.write(env, join_path(dir, file_name)));
    }
    if (shards.size() == 1) return Status::ok();
    json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
    std::string text;
    try {
        text = index.dump(2) + "\n";
    } catch (const json::exception& e) {
        return invalid_argument("safetensors writer '" + dir + "': " + e.what());
    }
    return env->write_file(join_path(dir, kSafetensorsIndexFile), text);
}

}  // namespace dsi
