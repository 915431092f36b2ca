// Safetensors checkpoints: read one file or a sharded Hugging Face directory by
// memory-mapping it, and write files (single or sharded) with the same layout.
//
// Format (huggingface/safetensors): an 8-byte little-endian header length N, N bytes
// of UTF-8 JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {str: str}}, then the data section. Offsets are relative to the data
// section; like the reference reader we require the tensors to cover the data section
// exactly, without holes, overlaps or trailing bytes.
//
// Parsing is the trust boundary: every malformed input is a Status whose message names
// the file and, where there is one, the tensor. Codes:
//   DATA_LOSS         the file is shorter than its header says (truncated).
//   OUT_OF_RANGE      a tensor's data_offsets reach past the end of the data section.
//   INVALID_ARGUMENT  anything else malformed (JSON, dtype, shape, sizes, layout).
//   NOT_FOUND         a missing file or tensor.
//
// Thread model: a parsed SafetensorsFile / SafetensorsSet is immutable, so const
// methods may be called from any number of threads. Writers are single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "model/internal/format_util.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace dsi {

// Largest header we parse (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsEntry {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;  // outermost-first
    uint64_t begin = 0;          // byte offsets within the data section, begin <= end
    uint64_t end = 0;
};

// One safetensors file. Owns its mapping (or borrows bytes, see parse_bytes); views
// point into it and live as long as this object (moving it keeps them valid).
class SafetensorsFile {
public:
    static Result<SafetensorsFile> open(Env* env, const std::string& path);
    // Takes ownership of a mapping (from Env::map_file); its path names errors.
    static Result<SafetensorsFile> parse(MappedFile file);
    // Borrows `bytes`: REQUIRES they outlive the result. Errors name `path`.
    static Result<SafetensorsFile> parse_bytes(std::span<const uint8_t> bytes,
                                               std::string path = "<memory>");

    // Entries in data order (ascending begin).
    const std::vector<SafetensorsEntry>& entries() const { return entries_; }
    // nullptr when absent.
    const SafetensorsEntry* find(std::string_view name) const;
    // NOT_FOUND naming the file and tensor when absent.
    Result<TensorView> view(std::string_view name) const;
    // REQUIRES: `entry` is one of entries().
    TensorView view(const SafetensorsEntry& entry) const;
    // The "__metadata__" map (empty when the header has none).
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    const std::string& path() const { return source_.path; }
    // Size of the data section in bytes.
    uint64_t data_bytes() const { return data_.size(); }

private:
    SafetensorsFile() = default;
    static Result<SafetensorsFile> parse_impl(internal::SourceBytes source);

    internal::SourceBytes source_;
    std::span<const uint8_t> data_;  // the data section
    std::vector<SafetensorsEntry> entries_;
    std::map<std::string, size_t, std::less<>> index_;  // name -> entries_ index
    std::map<std::string, std::string> metadata_;
};

// Builds one safetensors file: header JSON padded with spaces so the data section
// starts 8-aligned, then tensor data in insertion order, packed without gaps (the
// reference reader rejects gaps). Mistakes in add() (duplicate or reserved name,
// dtype without a safetensors name, byte count not matching shape) are reported by
// serialize()/write(), naming the tensor.
// Memory: the file is assembled in one buffer before Env::write_file, so peak memory
// is the file size plus copied tensors; use add_borrowed and shards for big models.
class SafetensorsWriter {
public:
    SafetensorsWriter();

    // Copies `bytes`.
    void add(std::string name, DType dtype, std::vector<int64_t> shape,
             std::span<const uint8_t> bytes);
    // Borrows `bytes`: REQUIRES they stay alive and unchanged until the last
    // serialize()/write() call returns.
    void add_borrowed(std::string name, DType dtype, std::vector<int64_t> shape,
                      std::span<const uint8_t> bytes);
    void set_metadata(std::string key, std::string value);

    size_t num_tensors() const { return queue_.tensors().size(); }
    uint64_t data_bytes() const { return queue_.data_bytes(); }

    // The whole file.
    Result<std::string> serialize() const;
    Status write(Env* env, const std::string& path) const;

private:
    internal::TensorQueue queue_;
    std::map<std::string, std::string> metadata_;
};

// Sharded Hugging Face layout: model-0000k-of-0000n.safetensors plus
// model.safetensors.index.json {"metadata": {"total_size": N}, "weight_map": {...}}.
inline constexpr std::string_view kSafetensorsSingleFile = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexFile = "model.safetensors.index.json";

// All tensors of a checkpoint directory, from one file or many shards, memory-mapped.
class SafetensorsSet {
public:
    // Reads `dir`/model.safetensors.index.json when present (every tensor in its
    // weight_map must exist in the named shard), else `dir`/model.safetensors.
    static Result<SafetensorsSet> open_dir(Env* env, const std::string& dir);

    // NOT_FOUND naming the directory and tensor when absent.
    Result<TensorView> view(std::string_view name) const;
    bool has(std::string_view name) const;
    // nullptr when absent; the entry's offsets are within the shard `file_of(name)`.
    const SafetensorsEntry* find(std::string_view name) const;
    const SafetensorsFile* file_of(std::string_view name) const;
    // Sorted tensor names.
    std::vector<std::string> names() const;
    const std::vector<SafetensorsFile>& files() const { return files_; }
    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
    std::vector<SafetensorsFile> files_;
    std::map<std::string, size_t, std::less<>> file_of_;  // tensor -> files_ index
};

// A tensor handed to write_sharded_safetensors; `bytes` are borrowed for the call.
struct SafetensorsTensor {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    std::span<const uint8_t> bytes;
};

// Writes `tensors` into `dir` (created if needed), in order, starting a new shard
// whenever the next tensor would push the current one past `max_shard_bytes` (a
// tensor larger than that gets a shard of its own). As Hugging Face does, a
// checkpoint that fits one shard is written as model.safetensors without an index;
// otherwise as model-0000k-of-0000n.safetensors plus the index. `metadata` goes into
// every shard. Peak memory is about one shard. REQUIRES: max_shard_bytes > 0.
Status write_sharded_safetensors(Env* env, const std::string& dir,
                                 std::span<const SafetensorsTensor> tensors,
                                 uint64_t max_shard_bytes,
                                 const std::map<std::string, std::string>& metadata = {});

}  // namespace dsi
