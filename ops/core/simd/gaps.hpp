#pragma once
// SIMD helpers for kernel sources (compiled per ISA level; never include from a baseline file).
// ops/core/simd/ is the one place that knows what xsimd 8.1 lacks: explicit FMA on AVX-512,
// horizontal reductions by name, and widening/narrowing conversions between f32 and 16-bit
// floats. The few raw intrinsics in it fill exactly those gaps, each behind the Arch it
// belongs to. This header is the layer the others build on: the vector types, the ISA tests,
// and the float gaps (FMA, reductions, exp2, prefetch).

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <xsimd/xsimd.hpp>

#include "ops/core/arch.hpp"

namespace ditops::simd {

template <class Arch>
using F32 = xsimd::batch<float, Arch>;
template <class Arch>
using U32 = xsimd::batch<std::uint32_t, Arch>;

template <class Arch>
inline constexpr bool kIsAvx512 = std::is_base_of_v<xsimd::avx512f, Arch>;
template <class Arch>
inline constexpr bool kIsAvx2 = std::is_base_of_v<xsimd::avx2, Arch>;
/// The avx512 kernel variant with AVX512-BF16 and AVX512-VNNI (ops/core/isa.hpp).
template <class Arch>
inline constexpr bool kHasBf16Vnni = std::is_base_of_v<avx512_bf16, Arch>;
/// The avx2 kernel variant with AVX-VNNI (ops/core/isa.hpp), or its software model.
template <class Arch>
inline constexpr bool kHasAvxVnni = std::is_base_of_v<avx2_vnni, Arch>;

/// a*b + c with one rounding where the ISA has FMA (xsimd 8.1 lowers AVX-512 fma to mul+add
/// under -ffp-contract=off); two roundings on SSE levels, which have no FMA.
template <class Arch>
inline F32<Arch> fmadd(F32<Arch> a, F32<Arch> b, F32<Arch> c) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    return _mm512_fmadd_ps(a, b, c);
  } else {
    return xsimd::fma(a, b, c);
  }
}

/// Sum of the lanes (xsimd 8.1 spells it hadd; 9.0 renamed it reduce_add).
template <class Arch>
inline float reduce_add(F32<Arch> v) noexcept {
  return xsimd::hadd(v);
}

/// Largest lane (xsimd 8.1 has no reduce_max).
template <class Arch>
inline float reduce_max(F32<Arch> v) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    return _mm512_reduce_max_ps(v);
  } else {
    alignas(64) float lanes[F32<Arch>::size];
    v.store_aligned(lanes);
    float best = lanes[0];
    for (std::size_t i = 1; i < F32<Arch>::size; ++i) best = lanes[i] > best ? lanes[i] : best;
    return best;
  }
}

/// Lane i of the result is the sum of the lanes of rows[i] (rows: F32<Arch>::size vectors).
template <class Arch>
inline F32<Arch> transpose_sum(const F32<Arch>* rows) noexcept {
  // Not xsimd::haddp: its 8.1 AVX-512 version orders the lanes wrongly.
  alignas(64) float sums[F32<Arch>::size];
  for (std::size_t i = 0; i < F32<Arch>::size; ++i) sums[i] = reduce_add<Arch>(rows[i]);
  return F32<Arch>::load_aligned(sums);
}

/// 2^x for x <= 0 (softmax after subtracting the running maximum), exactly 0 below 2^-126
/// and for x = -inf. Cephes exp2f: x = n + f with |f| <= 1/2, 2^f by a degree-6 polynomial
/// (relative error about 2e-7, i.e. ~2 ulp), 2^n built in the exponent field. It replaces
/// xsimd::exp, whose range checks and ldexp cost twice as much in the attention inner loop.
template <class Arch>
inline F32<Arch> exp2_nonpositive(F32<Arch> x) noexcept {
  using B = F32<Arch>;
  using I = xsimd::batch<std::int32_t, Arch>;
  const auto underflow = x < B(-126.f);
  const B clamped = xsimd::max(x, B(-126.f));
  // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
  const B shifter(12582912.f);
  const B rounded = clamped + shifter;
  const B n = rounded - shifter;
  const B f = clamped - n;
  B p(1.535336188319500e-4f);
  p = simd::fmadd<Arch>(p, f, B(1.339887440266574e-3f));
  p = simd::fmadd<Arch>(p, f, B(9.618437357674640e-3f));
  p = simd::fmadd<Arch>(p, f, B(5.550332471162809e-2f));
  p = simd::fmadd<Arch>(p, f, B(2.402264791363012e-1f));
  p = simd::fmadd<Arch>(p, f, B(6.931472028550421e-1f));
  p = simd::fmadd<Arch>(p, f, B(1.f));
  const I exponent = (xsimd::bitwise_cast<I>(rounded) - xsimd::bitwise_cast<I>(shifter)) << 23;
  const B scaled = xsimd::bitwise_cast<B>(xsimd::bitwise_cast<I>(p) + exponent);
  return xsimd::select(underflow, B(0.f), scaled);
}

/// Asks for the cache line holding `address` (xsimd 8.1 has no prefetch).
template <class T>
inline void prefetch(const T* address) noexcept {
  _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T0);
}

}  // namespace ditops::simd
