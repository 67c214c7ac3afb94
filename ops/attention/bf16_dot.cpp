// vdpbf16ps Q·K^T tile for flash_bf16. Each instruction multiplies 16 key pairs by one
// broadcast query pair: 32 MACs, against 16 for an fp32 FMA, at fp32 accumulation.

#include "ops/attention/bf16_dot.hpp"

#include <immintrin.h>

#include <cstring>

namespace ditops::attention {

void qk_tile_bf16(const std::uint16_t* q, std::int64_t q_stride, const std::uint16_t* kt,
                  std::int64_t dk, int rows, float* scores) noexcept {
  constexpr int kRows = 6, kVecs = 4;  // 24 accumulators, as the fp32 tile
  __m512 acc[kRows][kVecs];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < kVecs; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const std::int64_t pairs = (dk + 1) / 2;
  for (std::int64_t pair = 0; pair < pairs; ++pair) {
    __m512i kv[kVecs];
#pragma GCC unroll 4
    for (int c = 0; c < kVecs; ++c) {
      kv[c] = _mm512_load_si512(kt + pair * 128 + c * 32);
    }
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      std::uint32_t both;
      std::memcpy(&both, q + r * q_stride + 2 * pair, sizeof both);
      const __m512i qb = _mm512_set1_epi32(static_cast<int>(both));
#pragma GCC unroll 4
      for (int c = 0; c < kVecs; ++c) {
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)qb, (__m512bh)kv[c]);
      }
    }
  }
  for (int r = 0; r < rows && r < kRows; ++r) {
    for (int c = 0; c < kVecs; ++c) _mm512_store_ps(scores + r * 64 + c * 16, acc[r][c]);
  }
}

}  // namespace ditops::attention
