#include "kvstore/erasure.h"

#include <isa-l/erasure_code.h>

namespace dsi::kvstore {

Status ErasureCoder::validate(int k, int m) {
    if (k < 1 || m < 0 || k + m > kMaxErasureChunks) {
        return invalid_argument("erasure coding needs k >= 1, m >= 0, k + m <= 64");
    }
    return Status::ok();
}

ErasureCoder::ErasureCoder(int k, int m) : k_(k), m_(m) {
    DSI_CHECK(validate(k, m).is_ok());
    matrix_.resize(static_cast<size_t>((k + m) * k));
    // Cauchy: every k x k submatrix is invertible, so any k chunks suffice (S-KV-2).
    gf_gen_cauchy1_matrix(matrix_.data(), k + m, k);
    tables_.resize(static_cast<size_t>(32 * k * std::max(m, 1)));
    if (m > 0) {
        ec_init_tables(k, m, matrix_.data() + k * k, tables_.data());
    }
}

void ErasureCoder::encode(std::span<const uint8_t* const> data, std::span<uint8_t* const> parity,
                          size_t len) const {
    DSI_CHECK_EQ(data.size(), static_cast<size_t>(k_));
    DSI_CHECK_EQ(parity.size(), static_cast<size_t>(m_));
    if (m_ == 0 || len == 0) {
        return;
    }
    ec_encode_data(static_cast<int>(len), k_, m_, const_cast<uint8_t*>(tables_.data()),
                   const_cast<uint8_t**>(data.data()), const_cast<uint8_t**>(parity.data()));
}

Status ErasureCoder::decode(std::span<uint8_t* const> chunks, std::span<const bool> present,
                            size_t len) const {
    const int n = k_ + m_;
    DSI_CHECK_EQ(chunks.size(), static_cast<size_t>(n));
    DSI_CHECK_EQ(present.size(), static_cast<size_t>(n));
    std::vector<int> missing;
    for (int i = 0; i < k_; ++i) {
        if (!present[i]) {
            missing.push_back(i);
        }
    }
    if (missing.empty()) {
        return Status::ok();
    }
    std::vector<int> rows;  // the first k present chunks
    for (int i = 0; i < n && static_cast<int>(rows.size()) < k_; ++i) {
        if (present[i]) {
            rows.push_back(i);
        }
    }
    if (static_cast<int>(rows.size()) < k_) {
        return data_loss("erasure decode: fewer than k chunks");
    }
    const size_t kk = static_cast<size_t>(k_);
    std::vector<uint8_t> b(kk * kk);
    std::vector<uint8_t> inv(kk * kk);
    for (size_t r = 0; r < kk; ++r) {
        for (size_t c = 0; c < kk; ++c) {
            b[r * kk + c] = matrix_[static_cast<size_t>(rows[r]) * kk + c];
        }
    }
    if (gf_invert_matrix(b.data(), inv.data(), k_) != 0) {
        return internal_error("erasure decode: singular matrix");
    }
    // Missing data chunk e = inv row e applied to the present chunks.
    std::vector<uint8_t> decode_matrix(missing.size() * kk);
    for (size_t i = 0; i < missing.size(); ++i) {
        for (size_t c = 0; c < kk; ++c) {
            decode_matrix[i * kk + c] = inv[static_cast<size_t>(missing[i]) * kk + c];
        }
    }
    std::vector<uint8_t> tables(32 * kk * missing.size());
    ec_init_tables(k_, static_cast<int>(missing.size()), decode_matrix.data(), tables.data());
    std::vector<uint8_t*> src(kk);
    for (size_t r = 0; r < kk; ++r) {
        src[r] = chunks[static_cast<size_t>(rows[r])];
    }
    std::vector<uint8_t*> out;
    for (int e : missing) {
        out.push_back(chunks[static_cast<size_t>(e)]);
    }
    ec_encode_data(static_cast<int>(len), k_, static_cast<int>(missing.size()), tables.data(),
                   src.data(), out.data());
    return Status::ok();
}

}  // namespace dsi::kvstore
