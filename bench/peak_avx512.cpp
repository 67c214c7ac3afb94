// Peak probes compiled with AVX-512 (+BF16, VNNI) flags; called only when dispatch runs them
// (bench/limits.cpp).
// Twelve independent accumulators, each a named variable kept in a register (an array of
// accumulators ends up on the stack, and the store-to-load latency then caps the probe at one
// instruction per cycle), cover the 4-5 cycle latency of two vector pipes with room to spare.
// DITOPS_KEEP marks every accumulator as read and written each iteration so the compiler can
// neither drop nor merge the chains.

#include <immintrin.h>

#include "bench/limits.hpp"

namespace ditops::bench {
namespace {
constexpr int kChains = 12;
}

double fma_loop_avx512(std::int64_t iterations) {
#define DECLARE(i) __m512 acc##i = _mm512_set1_ps(0.001f * i);
  DITOPS_TWELVE(DECLARE)
#undef DECLARE
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.0001f);
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) acc##i = _mm512_fmadd_ps(acc##i, a, b);
    DITOPS_TWELVE(STEP)
#undef STEP
    DITOPS_KEEP(acc);
  }
  __m512 sum = _mm512_setzero_ps();
#define SUM(i) sum = _mm512_add_ps(sum, acc##i);
  DITOPS_TWELVE(SUM)
#undef SUM
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return static_cast<double>(iterations) * kChains * 16 * 2;
}

double bf16_loop_avx512(std::int64_t iterations) {
#define DECLARE(i) __m512 acc##i = _mm512_setzero_ps();
  DITOPS_TWELVE(DECLARE)
#undef DECLARE
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3a83);  // ~0.001
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) acc##i = _mm512_dpbf16_ps(acc##i, a, b);
    DITOPS_TWELVE(STEP)
#undef STEP
    DITOPS_KEEP(acc);
  }
  __m512 sum = _mm512_setzero_ps();
#define SUM(i) sum = _mm512_add_ps(sum, acc##i);
  DITOPS_TWELVE(SUM)
#undef SUM
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return static_cast<double>(iterations) * kChains * 32 * 2;  // 32 MACs per instruction
}

double vnni_loop_avx512(std::int64_t iterations) {
#define DECLARE(i) __m512i acc##i = _mm512_setzero_si512();
  DITOPS_TWELVE(DECLARE)
#undef DECLARE
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) acc##i = _mm512_dpbusd_epi32(acc##i, a, b);
    DITOPS_TWELVE(STEP)
#undef STEP
    DITOPS_KEEP(acc);
  }
  __m512i sum = _mm512_setzero_si512();
#define SUM(i) sum = _mm512_add_epi32(sum, acc##i);
  DITOPS_TWELVE(SUM)
#undef SUM
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return static_cast<double>(iterations) * kChains * 64 * 2;  // 64 u8*s8 MACs per instruction
}

}  // namespace ditops::bench
