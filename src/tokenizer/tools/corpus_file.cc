#include "tokenizer/tools/corpus_file.h"

#include <cstring>

namespace dsi::tokenizer_tools {
namespace {

// Little-endian cursor over a file's bytes; fails instead of reading past the end.
class Reader {
public:
    explicit Reader(const std::string& data) : data_(data) {}
    bool done() const { return pos_ == data_.size(); }
    bool magic(const char* m) {
        const size_t n = std::strlen(m);
        if (data_.compare(0, n, m) != 0) return false;
        pos_ = n;
        return true;
    }
    bool u8(uint8_t* v) {
        if (pos_ + 1 > data_.size()) return false;
        *v = static_cast<uint8_t>(data_[pos_++]);
        return true;
    }
    bool u32(uint32_t* v) {
        if (pos_ + 4 > data_.size()) return false;
        *v = 0;
        for (int k = 3; k >= 0; --k) *v = (*v << 8) | static_cast<uint8_t>(data_[pos_ + k]);
        pos_ += 4;
        return true;
    }
    bool bytes(size_t n, std::string* out) {
        if (pos_ + n > data_.size()) return false;
        out->assign(data_, pos_, n);
        pos_ += n;
        return true;
    }
    bool ids(std::vector<int32_t>* out) {
        uint32_t n;
        if (!u32(&n) || pos_ + 4ull * n > data_.size()) return false;
        out->resize(n);
        for (uint32_t i = 0; i < n; ++i) {
            uint32_t v = 0;
            u32(&v);
            (*out)[i] = static_cast<int32_t>(v);
        }
        return true;
    }

private:
    const std::string& data_;
    size_t pos_ = 0;
};

}  // namespace

Result<std::vector<CorpusDoc>> read_corpus(Env* env, const std::string& path) {
    DSI_ASSIGN_OR_RETURN(std::string data, env->read_file(path));
    Reader r(data);
    if (!r.magic("DSTC1\n")) return invalid_argument(path + ": not a corpus file");
    std::vector<CorpusDoc> docs;
    while (!r.done()) {
        CorpusDoc d;
        uint32_t len;
        if (!r.u8(&d.kind) || !r.u32(&len) || !r.bytes(len, &d.bytes)) {
            return data_loss(path + ": truncated at document " + std::to_string(docs.size()));
        }
        docs.push_back(std::move(d));
    }
    return docs;
}

Result<std::vector<ReferenceIds>> read_reference_ids(Env* env, const std::string& path) {
    DSI_ASSIGN_OR_RETURN(std::string data, env->read_file(path));
    Reader r(data);
    if (!r.magic("DSTI1\n")) return invalid_argument(path + ": not a reference ids file");
    std::vector<ReferenceIds> out;
    while (!r.done()) {
        ReferenceIds ids;
        if (!r.ids(&ids.plain) || !r.ids(&ids.special)) {
            return data_loss(path + ": truncated at document " + std::to_string(out.size()));
        }
        out.push_back(std::move(ids));
    }
    return out;
}

}  // namespace dsi::tokenizer_tools
