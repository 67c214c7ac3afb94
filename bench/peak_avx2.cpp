// FP32 FMA peak probe for CPUs without AVX-512 (AVX2 + FMA flags).

#include <immintrin.h>

#include "bench/limits.hpp"

namespace ditops::bench {

double fma_loop_avx2(std::int64_t iterations) {
  constexpr int kChains = 12;
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * c);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.0001f);
  for (std::int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    __asm__ volatile("" : "+x"(acc[0]), "+x"(acc[5]), "+x"(acc[11]));
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  volatile float sink = lanes[0];
  (void)sink;
  return static_cast<double>(iterations) * kChains * 8 * 2;
}

}  // namespace ditops::bench
