// FP32 FMA peak probe for CPUs without AVX-512 (AVX2 + FMA flags).

#include <immintrin.h>

#include "bench/limits.hpp"

namespace ditops::bench {

double fma_loop_avx2(std::int64_t iterations) {
  constexpr int kChains = 12;
#define DECLARE(i) __m256 acc##i = _mm256_set1_ps(0.001f * i);
  DITOPS_TWELVE(DECLARE)
#undef DECLARE
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.0001f);
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) acc##i = _mm256_fmadd_ps(acc##i, a, b);
    DITOPS_TWELVE(STEP)
#undef STEP
    __asm__ volatile(""
                     : "+x"(acc0), "+x"(acc1), "+x"(acc2), "+x"(acc3), "+x"(acc4), "+x"(acc5),
                       "+x"(acc6), "+x"(acc7), "+x"(acc8), "+x"(acc9), "+x"(acc10), "+x"(acc11));
  }
  __m256 sum = _mm256_setzero_ps();
#define SUM(i) sum = _mm256_add_ps(sum, acc##i);
  DITOPS_TWELVE(SUM)
#undef SUM
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  volatile float sink = lanes[0];
  (void)sink;
  return static_cast<double>(iterations) * kChains * 8 * 2;
}

}  // namespace ditops::bench
