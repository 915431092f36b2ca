#include "tokenizer/internal/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "tokenizer/internal/unicode.h"

namespace dsi::tokenizer_internal {
namespace {

// Pieces up to this many bytes merge with the in-place quadratic scan.
constexpr size_t kSmallPiece = 48;

// merge_large keeps per-thread scratch buffers up to this many symbols.
constexpr size_t kKeepScratchSymbols = 1 << 16;

// Per-thread memo of short pieces: direct-mapped, overwritten on collision.
constexpr size_t kCacheBytes = 22;
constexpr size_t kCacheIds = 8;
constexpr size_t kCacheSlots = 8192;

struct CacheEntry {
    uint64_t instance = 0;  // 0: empty
    uint8_t len = 0;
    uint8_t num_ids = 0;
    char bytes[kCacheBytes];
    int32_t ids[kCacheIds];
};

std::atomic<uint64_t> g_next_instance{1};

inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

// 64-bit hash of any length for the whole-token table (never 0).
inline uint64_t hash_bytes(const char* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = mix(h ^ w) * 0x9E3779B97F4A7C15ULL;
    }
    if (i < n) {
        uint64_t w = 0;
        std::memcpy(&w, p + i, n - i);
        h = mix(h ^ w) * 0x9E3779B97F4A7C15ULL;
    }
    h = mix(h);
    return h ? h : 1;
}

inline uint64_t hash_piece(const char* p, size_t n) {
    uint64_t w[3] = {0, 0, 0};
    std::memcpy(w, p, n);  // n <= kCacheBytes < 24
    return mix(w[0] * 0x9E3779B97F4A7C15ULL ^ mix(w[1] + n) ^ (w[2] * 0xC2B2AE3D27D4EB4FULL));
}

CacheEntry* thread_cache() {
    thread_local std::unique_ptr<CacheEntry[]> cache(new CacheEntry[kCacheSlots]);
    return cache.get();
}

}  // namespace

uint32_t byte_to_char(uint8_t b) {
    // Printable bytes stand for themselves; the other 68 map to U+0100.. in order.
    static const auto* table = [] {
        auto* t = new uint32_t[256];
        uint32_t n = 0;
        for (uint32_t c = 0; c < 256; ++c) {
            const bool printable =
                (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
            t[c] = printable ? c : 0x100 + n++;
        }
        return t;
    }();
    return table[b];
}

int byte_of_char(uint32_t cp) {
    static const auto* table = [] {
        auto* t = new int16_t[0x144];
        std::fill(t, t + 0x144, int16_t{-1});
        for (uint32_t b = 0; b < 256; ++b) t[byte_to_char(static_cast<uint8_t>(b))] = int16_t(b);
        return t;
    }();
    return cp < 0x144 ? table[cp] : -1;
}

std::string byte_level_encode(std::string_view raw) {
    std::string out;
    out.reserve(raw.size() * 2);
    for (char c : raw) append_utf8(byte_to_char(static_cast<uint8_t>(c)), &out);
    return out;
}

Result<BpeModel> BpeModel::build(const std::unordered_map<std::string, int32_t>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges,
                                 bool ignore_merges) {
    BpeModel m;
    for (int b = 0; b < 256; ++b) {
        std::string ch;
        append_utf8(byte_to_char(static_cast<uint8_t>(b)), &ch);
        auto it = vocab.find(ch);
        if (it == vocab.end()) {
            return invalid_argument("BPE vocab lacks the byte-level symbol for byte " +
                                    std::to_string(b) + " ('" + ch + "')");
        }
        m.byte_ids_[b] = it->second;
    }
    for (const auto& [tok, id] : vocab) {
        if (static_cast<uint64_t>(id) > kIdMask) {
            return unimplemented("BPE vocab id " + std::to_string(id) + " of '" + tok +
                                 "' exceeds the supported 2^21");
        }
    }
    if (merges.size() > kMaxRank) {
        return unimplemented("BPE has more than 2^22 merges: " + std::to_string(merges.size()));
    }
    size_t cap = 16;
    while (cap < merges.size() * 2) cap <<= 1;
    m.table_.assign(cap, kEmpty);
    m.mask_ = cap - 1;
    m.merge_ids_.assign(merges.size(), -1);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const auto& [a, b] = merges[rank];
        auto ia = vocab.find(a);
        auto ib = vocab.find(b);
        auto inew = vocab.find(a + b);
        const std::string where = "merge #" + std::to_string(rank) + " '" + a + " " + b + "'";
        if (ia == vocab.end()) return invalid_argument(where + ": '" + a + "' is not in vocab");
        if (ib == vocab.end()) return invalid_argument(where + ": '" + b + "' is not in vocab");
        if (inew == vocab.end()) {
            return invalid_argument(where + ": merged token '" + a + b + "' is not in vocab");
        }
        // A repeated pair keeps its last rank, as HF's HashMap insert does.
        m.insert(ia->second, ib->second, static_cast<uint32_t>(rank));
        m.merge_ids_[rank] = inew->second;
    }
    m.num_merges_ = merges.size();
    m.ignore_merges_ = ignore_merges;
    if (ignore_merges) {
        for (const auto& [tok, id] : vocab) {
            std::string raw;
            bool ok = true;
            for (size_t i = 0; i < tok.size() && ok;) {
                const Utf8Step step = utf8_step(std::string_view(tok).substr(i));
                if (step.kind != Utf8Step::kValid) {
                    ok = false;
                    break;
                }
                size_t len;
                const int byte = byte_of_char(decode_utf8(tok.data(), i, &len));
                if (byte < 0) ok = false;
                raw.push_back(static_cast<char>(byte));
                i += len;
            }
            if (ok) m.raw_vocab_.emplace(std::move(raw), id);
        }
    }
    m.build_whole_tokens(vocab);
    m.instance_ = g_next_instance.fetch_add(1);
    return m;
}

void BpeModel::insert(int32_t left, int32_t right, uint32_t rank) {
    const uint64_t key = (uint64_t(uint32_t(left)) << kIdBits) | uint32_t(right);
    for (uint64_t h = mix(key) & mask_;; h = (h + 1) & mask_) {
        uint64_t& s = table_[h];
        if (s == kEmpty || (s & kKeyMask) == key) {
            s = key | (uint64_t(rank) << (2 * kIdBits));
            return;
        }
    }
}

inline uint32_t BpeModel::rank_of(int32_t left, int32_t right) const {
    const uint64_t key = (uint64_t(uint32_t(left)) << kIdBits) | uint32_t(right);
    for (uint64_t h = mix(key) & mask_;; h = (h + 1) & mask_) {
        const uint64_t s = table_[h];
        if ((s & kKeyMask) == key) return static_cast<uint32_t>(s >> (2 * kIdBits));
        if (s == kEmpty) return kNoRank;
    }
}

void BpeModel::build_whole_tokens(const std::unordered_map<std::string, int32_t>& vocab) {
    // Raw bytes of every byte-level token; kept when BPE gives back that token.
    std::vector<std::pair<std::string, int32_t>> found;
    std::vector<int32_t> ids;
    for (const auto& [tok, id] : vocab) {
        std::string raw;
        bool ok = true;
        for (size_t i = 0; i < tok.size() && ok;) {
            if (utf8_step(std::string_view(tok).substr(i)).kind != Utf8Step::kValid) break;
            size_t len;
            const int byte = byte_of_char(decode_utf8(tok.data(), i, &len));
            ok = byte >= 0;
            raw.push_back(static_cast<char>(byte));
            i += len;
        }
        if (!ok || raw.size() < 2 || raw.size() > 255) continue;
        ids.clear();
        encode_piece_uncached(raw, &ids);
        if (ids.size() == 1 && ids[0] == id) found.emplace_back(std::move(raw), id);
    }
    size_t cap = 16;
    while (cap < found.size() * 2) cap <<= 1;
    whole_table_.assign(cap, WholeSlot{0, -1, 0});
    whole_offsets_.assign(1, 0);
    for (const auto& [raw, id] : found) {
        const uint64_t h = hash_bytes(raw.data(), raw.size());
        const auto entry = static_cast<uint32_t>(whole_offsets_.size() - 1);
        whole_bytes_ += raw;
        whole_offsets_.push_back(static_cast<uint32_t>(whole_bytes_.size()));
        for (size_t i = h & (cap - 1);; i = (i + 1) & (cap - 1)) {
            if (whole_table_[i].hash == 0) {
                whole_table_[i] = WholeSlot{h, id, entry};
                break;
            }
        }
    }
}

int32_t BpeModel::whole_token(std::string_view piece) const {
    if (whole_table_.empty()) return -1;
    const uint64_t h = hash_bytes(piece.data(), piece.size());
    const size_t mask = whole_table_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const WholeSlot& s = whole_table_[i];
        if (s.hash == 0) return -1;
        if (s.hash == h) {
            const uint32_t b = whole_offsets_[s.entry];
            const uint32_t e = whole_offsets_[s.entry + 1];
            if (std::string_view(whole_bytes_).substr(b, e - b) == piece) return s.id;
        }
    }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
    const size_t n = piece.size();
    if (n == 1) {
        out->push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
        return;
    }
    if (n > kCacheBytes) {
        const int32_t id = ignore_merges_ ? -1 : whole_token(piece);
        if (id >= 0) {
            out->push_back(id);
        } else {
            encode_piece_uncached(piece, out);
        }
        return;
    }
    CacheEntry& e = thread_cache()[hash_piece(piece.data(), n) & (kCacheSlots - 1)];
    if (e.instance == instance_ && e.len == n && std::memcmp(e.bytes, piece.data(), n) == 0) {
        out->insert(out->end(), e.ids, e.ids + e.num_ids);
        return;
    }
    const size_t before = out->size();
    const int32_t id = ignore_merges_ ? -1 : whole_token(piece);
    if (id >= 0) {
        out->push_back(id);
    } else {
        encode_piece_uncached(piece, out);
    }
    const size_t num_ids = out->size() - before;
    if (num_ids <= kCacheIds) {
        e.instance = instance_;
        e.len = static_cast<uint8_t>(n);
        e.num_ids = static_cast<uint8_t>(num_ids);
        std::memcpy(e.bytes, piece.data(), n);
        std::copy(out->begin() + static_cast<std::ptrdiff_t>(before), out->end(), e.ids);
    }
}

void BpeModel::encode_piece_uncached(std::string_view piece, std::vector<int32_t>* out) const {
    const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
    const size_t n = piece.size();
    if (n == 0) return;
    if (ignore_merges_) {
        auto it = raw_vocab_.find(std::string(piece));
        if (it != raw_vocab_.end()) {
            out->push_back(it->second);
            return;
        }
    }
    if (n == 1) {
        out->push_back(byte_ids_[p[0]]);
    } else if (n <= kSmallPiece) {
        merge_small(p, n, out);
    } else {
        merge_large(p, n, out);
    }
}

void BpeModel::merge_small(const uint8_t* p, size_t n, std::vector<int32_t>* out) const {
    int32_t ids[kSmallPiece];
    uint32_t ranks[kSmallPiece];  // ranks[i]: merge of (ids[i], ids[i+1])
    for (size_t i = 0; i < n; ++i) ids[i] = byte_ids_[p[i]];
    for (size_t i = 0; i + 1 < n; ++i) ranks[i] = rank_of(ids[i], ids[i + 1]);
    size_t len = n;
    while (len > 1) {
        uint32_t best = kNoRank;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < len; ++i) {
            if (ranks[i] < best) {  // strict: the leftmost of equal ranks wins
                best = ranks[i];
                bi = i;
            }
        }
        if (best == kNoRank) break;
        ids[bi] = merge_ids_[best];
        // Drop symbol bi+1 and pair bi+1; pairs bi-1 and bi are recomputed.
        if (len > bi + 2) {
            std::memmove(ids + bi + 1, ids + bi + 2, (len - bi - 2) * sizeof(int32_t));
        }
        if (len > bi + 3) {
            std::memmove(ranks + bi + 1, ranks + bi + 2, (len - bi - 3) * sizeof(uint32_t));
        }
        --len;
        if (bi > 0) ranks[bi - 1] = rank_of(ids[bi - 1], ids[bi]);
        if (bi + 1 < len) ranks[bi] = rank_of(ids[bi], ids[bi + 1]);
    }
    out->insert(out->end(), ids, ids + len);
}

void BpeModel::merge_large(const uint8_t* p, size_t n, std::vector<int32_t>* out) const {
    // Same order as HF's heap (lowest rank, then leftmost position), found with a
    // min segment tree over positions: leaf i holds (rank << 32 | i) of the pair
    // starting at symbol i, or kNone. Each merge rewrites three leaves in
    // O(log n) with branch-free mins and leaves no stale entries, which is ~4x
    // faster than a heap on long pieces. Symbols form a linked list over the
    // original positions. Buffers are per thread (no allocation per piece).
    constexpr uint64_t kNone = ~0ULL;
    struct Sym {
        int32_t id;  // -1: merged into its left neighbour
        int32_t prev;
        int32_t next;
    };
    thread_local std::vector<Sym> syms;
    thread_local std::vector<uint64_t> tree;
    size_t size = 1;
    while (size < n) size <<= 1;
    syms.resize(n);
    tree.assign(2 * size, kNone);
    for (size_t i = 0; i < n; ++i) {
        syms[i] = Sym{byte_ids_[p[i]], static_cast<int32_t>(i) - 1,
                      i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
    }
    for (size_t i = 0; i + 1 < n; ++i) {
        const uint32_t rank = rank_of(syms[i].id, syms[i + 1].id);
        if (rank != kNoRank) tree[size + i] = (uint64_t(rank) << 32) | i;
    }
    for (size_t i = size - 1; i > 0; --i) tree[i] = std::min(tree[2 * i], tree[2 * i + 1]);
    auto set_leaf = [&](size_t i, uint64_t v) {
        i += size;
        tree[i] = v;
        for (i >>= 1; i > 0; i >>= 1) {
            const uint64_t m = std::min(tree[2 * i], tree[2 * i + 1]);
            if (tree[i] == m) break;  // unchanged here, so unchanged above
            tree[i] = m;
        }
    };
    auto pair_key = [&](int32_t pos) -> uint64_t {
        const int32_t next = syms[pos].next;
        if (next < 0) return kNone;
        const uint32_t rank = rank_of(syms[pos].id, syms[next].id);
        return rank == kNoRank ? kNone : (uint64_t(rank) << 32) | uint32_t(pos);
    };
    while (tree[1] != kNone) {
        const auto rank = static_cast<uint32_t>(tree[1] >> 32);
        const auto pos = static_cast<int32_t>(tree[1] & 0xFFFFFFFFu);
        Sym& left = syms[pos];
        const int32_t r = left.next;
        left.id = merge_ids_[rank];
        left.next = syms[r].next;
        if (left.next >= 0) syms[left.next].prev = pos;
        syms[r].id = -1;
        set_leaf(static_cast<size_t>(r), kNone);
        set_leaf(static_cast<size_t>(pos), pair_key(pos));
        if (left.prev >= 0) set_leaf(static_cast<size_t>(left.prev), pair_key(left.prev));
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
    if (n > kKeepScratchSymbols) {  // do not pin a huge piece's buffers to the thread
        std::vector<Sym>().swap(syms);
        std::vector<uint64_t>().swap(tree);
    }
}

}  // namespace dsi::tokenizer_internal
