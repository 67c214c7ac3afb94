// Peak probes compiled with AVX2 + FMA flags, for dispatch at the avx2 level (and the int8 peak
// on avx512 without the VNNI variant). Twelve chains in registers, as in bench/peak_avx512.cpp.

#include <immintrin.h>

#include "bench/limits.hpp"

namespace ditops::bench {
namespace {
constexpr int kChains = 12;
}

double fma_loop_avx2(std::int64_t iterations) {
#define DECLARE(i) __m256 acc##i = _mm256_set1_ps(0.001f * i);
  DITOPS_TWELVE(DECLARE)
#undef DECLARE
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.0001f);
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) acc##i = _mm256_fmadd_ps(acc##i, a, b);
    DITOPS_TWELVE(STEP)
#undef STEP
    DITOPS_KEEP(acc);
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

// The u8 x s8 sequence an AVX2 int8 GEMM uses (AVX2 has no vpdpbusd): vpmaddubsw (32 byte
// products summed in pairs to int16), vpmaddwd by ones (pairs of those to int32), vpaddd into the
// accumulator. The AVX2 int8 attention and MLA kernels run this sequence (simd::dot_u8s8 and
// dot_s8s8, the latter with a vpsignb for the sign trick; int8 attention's P·V adds two
// vpmaddubsw results before one vpmaddwd), so their fraction of it says what is left. Each chain's
// accumulator is also its u8 operand, so the chains stay distinct (the same constant operands
// would be one product, computed once) without more live registers than AVX2 has; twelve chains
// still cover the sequence's 7-11 cycle latency at one step per cycle.
double int8_loop_avx2(std::int64_t iterations) {
#define DECLARE(i) __m256i acc##i = _mm256_set1_epi8(static_cast<char>(i + 1));
  DITOPS_TWELVE(DECLARE)
#undef DECLARE
  const __m256i b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) \
  acc##i = _mm256_add_epi32(acc##i, _mm256_madd_epi16(_mm256_maddubs_epi16(acc##i, b), ones));
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
  return static_cast<double>(iterations) * kChains * 32 * 2;  // 32 u8*s8 multiply-adds per step
}

}  // namespace ditops::bench
