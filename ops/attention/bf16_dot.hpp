#pragma once
// AVX512-BF16 dot products for flash_bf16 (ops/attention/bf16_dot.cpp, compiled with
// -mavx512bf16 in an object of its own: the avx512 dispatch level does not require BF16).
// Call only when bf16_dot_available().

#include <cstdint>

namespace ditops::attention {

/// scores[r][j] (r < rows <= 6, j < 64, row stride 64) = sum_d q[r][d] * K[j][d], with
/// q: rows of q_stride bf16 words, K^T packed as [ceil(dk / 2)][64 keys][2] bf16 words
/// (pairs of consecutive d per key, zero padded).
void qk_tile_bf16(const std::uint16_t* q, std::int64_t q_stride, const std::uint16_t* kt,
                  std::int64_t dk, int rows, float* scores) noexcept;

}  // namespace ditops::attention
