// ErasureCoder: k data + m parity chunks with ISA-L (Cauchy matrix over GF(2^8)), so a
// block striped over k+m servers survives any m of them failing (S-KV-2: 10+2 in
// production; a read needs any k chunks).
// Thread model: immutable after construction; encode/decode are safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace dsi::kvstore {

inline constexpr int kMaxErasureChunks = 64;

class ErasureCoder {
public:
    // REQUIRES: validate(k, m).is_ok().
    ErasureCoder(int k, int m);
    // kInvalidArgument unless k >= 1, m >= 0, k + m <= kMaxErasureChunks.
    static Status validate(int k, int m);

    int k() const { return k_; }
    int m() const { return m_; }

    // Fills parity[0..m) from data[0..k), every chunk `len` bytes.
    void encode(std::span<const uint8_t* const> data, std::span<uint8_t* const> parity,
                size_t len) const;
    // chunks[0..k+m): present[i] says whether chunks[i] holds chunk i. Rebuilds every
    // missing *data* chunk in place (the buffers must exist). kDataLoss if fewer than k
    // chunks are present.
    Status decode(std::span<uint8_t* const> chunks, std::span<const bool> present,
                  size_t len) const;

private:
    int k_;
    int m_;
    std::vector<uint8_t> matrix_;  // (k+m) x k encode matrix, identity on top
    std::vector<uint8_t> tables_;  // ec_init_tables of the parity rows
};

}  // namespace dsi::kvstore
