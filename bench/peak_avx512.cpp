// Peak probes compiled with AVX-512 (+BF16, VNNI) flags; called only when the CPU has them.
// Twelve independent accumulators cover the 4-cycle latency of two FMA pipes with room to spare.

#include <immintrin.h>

#include "bench/limits.hpp"

namespace ditops::bench {
namespace {
constexpr int kChains = 12;
}

double fma_loop_avx512(std::int64_t iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.0001f);
  for (std::int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[5]), "+v"(acc[11]));  // keep the loop
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return static_cast<double>(iterations) * kChains * 16 * 2;
}

double bf16_loop_avx512(std::int64_t iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3a83);  // ~0.001
  for (std::int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[5]), "+v"(acc[11]));
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return static_cast<double>(iterations) * kChains * 32 * 2;  // 32 MACs per instruction
}

double vnni_loop_avx512(std::int64_t iterations) {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_si512();
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (std::int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[5]), "+v"(acc[11]));
  }
  __m512i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_epi32(sum, acc[c]);
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return static_cast<double>(iterations) * kChains * 64 * 2;  // 64 u8*s8 MACs per instruction
}

}  // namespace ditops::bench
