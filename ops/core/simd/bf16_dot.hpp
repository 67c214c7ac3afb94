#pragma once
// bf16 dot products of the AVX512-BF16 kernels (flash_bf16's products, the bf16 linear GEMM):
// vdpbf16ps on pairs of bf16 per 32-bit lane, fp32 accumulation, and the rounding of two fp32
// vectors to one vector of bf16 pairs.

#include <immintrin.h>

#include "ops/core/simd/gaps.hpp"

namespace ditops::simd {

/// acc + the per-lane dot products of the bf16 pairs of a and b (vdpbf16ps: both products are
/// exact in fp32, bf16 inputs that are denormal count as 0). Inline asm, as simd::dot_u8s8 for
/// vpdpbusd: around the intrinsic GCC 12 copies accumulators between registers (and spills
/// them with 24 live).
template <class Arch>
inline __m512 dot_bf16(__m512 acc, __m512i a, __m512i b) noexcept {
  static_assert(kHasBf16Vnni<Arch>);
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

/// low and high rounded to bf16 (nearest even) in one vector: words 0-15 from low, 16-31 from
/// high.
template <class Arch>
inline __m512i pack_bf16(F32<Arch> low, F32<Arch> high) noexcept {
  static_assert(kHasBf16Vnni<Arch>);
  return (__m512i)_mm512_cvtne2ps_pbh(high, low);
}

}  // namespace ditops::simd
