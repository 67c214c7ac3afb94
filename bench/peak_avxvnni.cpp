// The int8 peak probe of the avx2+vnni kernel variant, compiled with AVX2 + AVX-VNNI flags: one
// VEX vpdpbusd per step (32 u8 x s8 multiply-adds into int32), twelve chains in registers as in
// bench/peak_avx512.cpp. It runs only where that variant is dispatched (bench/limits.cpp).

#include <immintrin.h>

#include "bench/limits.hpp"

namespace ditops::bench {
namespace {
constexpr int kChains = 12;
}

double vnni_loop_avx2(std::int64_t iterations) {
#define DECLARE(i) __m256i acc##i = _mm256_setzero_si256();
  DITOPS_TWELVE(DECLARE)
#undef DECLARE
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) acc##i = _mm256_dpbusd_avx_epi32(acc##i, a, b);
    DITOPS_TWELVE(STEP)
#undef STEP
    DITOPS_KEEP(acc);
  }
  __m256i sum = _mm256_setzero_si256();
#define SUM(i) sum = _mm256_add_epi32(sum, acc##i);
  DITOPS_TWELVE(SUM)
#undef SUM
  volatile int sink = _mm256_extract_epi32(sum, 0);
  (void)sink;
  return static_cast<double>(iterations) * kChains * 32 * 2;  // 32 u8*s8 MACs per instruction
}

}  // namespace ditops::bench
