#pragma once
// SIMD helpers for kernel sources (compiled per ISA level; never include from a baseline file).
// This is the one file that knows what xsimd 8.1 lacks: explicit FMA on AVX-512, horizontal
// reductions by name, and widening/narrowing conversions between f32 and 16-bit floats. The
// few raw intrinsics below fill exactly those gaps, each behind the Arch it belongs to.

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ditops/tensor.hpp>
#include <limits>
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

// ---- f32 <-> storage type conversions ---------------------------------------------------------

/// Loads F32<Arch>::size elements of T (float, bf16 or f16) as floats.
template <class Arch, class T>
inline F32<Arch> load(const T* src) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return F32<Arch>::load_unaligned(src);
  } else if constexpr (std::is_same_v<T, bf16>) {
    // bf16 is the upper half of a float: widen 16 -> 32 bits and shift into place.
    if constexpr (kIsAvx512<Arch>) {
      const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    } else if constexpr (kIsAvx2<Arch>) {
      const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    } else {
      // Interleaving zeros below each value places it in the upper half of a 32-bit lane.
      const __m128i half = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
      return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), half));
    }
  } else {
    static_assert(std::is_same_v<T, f16>);
    if constexpr (kIsAvx512<Arch>) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
    } else if constexpr (kIsAvx2<Arch>) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    } else {
      // SSE levels have no F16C; convert lane by lane.
      alignas(16) float lanes[4];
      for (int i = 0; i < 4; ++i) lanes[i] = src[i].to_float();
      return F32<Arch>::load_aligned(lanes);
    }
  }
}

/// bf16 bit patterns (in the low 16 bits of each lane) of v, rounded to nearest even. With
/// kMayBeNaN false the caller guarantees v has no NaN, which saves the three ops per vector
/// that keep a NaN one (measured on AVX2: bf16 RMSNorm rows 1.2x faster without them).
template <class Arch, bool kMayBeNaN = true>
inline U32<Arch> bf16_bits(F32<Arch> v) noexcept {
  const U32<Arch> bits = xsimd::bitwise_cast<U32<Arch>>(v);
  const U32<Arch> rounded = (bits + U32<Arch>(0x7fffu) + ((bits >> 16) & U32<Arch>(1u))) >> 16;
  if constexpr (!kMayBeNaN) return rounded;
  // NaN would carry into the exponent or the sign bit when rounded (a NaN with a low payload
  // only would become inf); keep it a quiet NaN instead. isnan, not v != v: xsimd 8.1's
  // AVX and AVX-512 != is the ordered compare, false for NaN, which let NaN through here.
  const U32<Arch> quiet_nan = (bits >> 16) | U32<Arch>(0x40u);
  const F32<Arch> chosen = xsimd::select(xsimd::isnan(v), xsimd::bitwise_cast<F32<Arch>>(quiet_nan),
                                         xsimd::bitwise_cast<F32<Arch>>(rounded));
  return xsimd::bitwise_cast<U32<Arch>>(chosen);
}

/// The 16 bf16 (rounded to nearest even) of an AVX-512 vector, packed into 256 bits: one
/// vcvtneps2bf16 where the CPU has AVX512-BF16, else the integer rounding of bf16_bits.
template <class Arch>
inline __m256i avx512_bf16_pack(F32<Arch> v) noexcept {
  if constexpr (kHasBf16Vnni<Arch>) {
    return (__m256i)_mm512_cvtneps_pbh(v);
  } else {
    return _mm512_cvtepi32_epi16(simd::bf16_bits<Arch>(v));
  }
}

/// Stores F32<Arch>::size floats as T (float, bf16 rounded to nearest even, or f16).
template <class Arch, class T>
inline void store(T* dst, F32<Arch> v) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    v.store_unaligned(dst);
  } else if constexpr (std::is_same_v<T, bf16>) {
    if constexpr (kIsAvx512<Arch>) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), simd::avx512_bf16_pack<Arch>(v));
    } else if constexpr (kIsAvx2<Arch>) {
      const __m256i bits = simd::bf16_bits<Arch>(v);
      // packus works within 128-bit lanes; gather the two useful quarters into the low half.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(packed));
    } else {
      // SSE2 has only the signed 32 -> 16 pack: bias into signed range and back.
      const __m128i bits = simd::bf16_bits<Arch>(v);
      const __m128i bias = _mm_set1_epi32(0x8000);
      const __m128i packed = _mm_packs_epi32(_mm_sub_epi32(bits, bias), _mm_setzero_si128());
      _mm_storel_epi64(reinterpret_cast<__m128i*>(dst),
                       _mm_add_epi16(packed, _mm_set1_epi16(static_cast<short>(0x8000))));
    }
  } else {
    static_assert(std::is_same_v<T, f16>);
    if constexpr (kIsAvx512<Arch>) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                          _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if constexpr (kIsAvx2<Arch>) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                       _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      alignas(16) float lanes[4];
      v.store_aligned(lanes);
      for (int i = 0; i < 4; ++i) dst[i] = f16::from_float(lanes[i]);
    }
  }
}

/// Bytes one store<Arch, T>() writes; streaming stores need dst aligned to it.
template <class Arch, class T>
inline constexpr std::size_t kStoreBytes = F32<Arch>::size * sizeof(T);
/// Streaming stores pay off only for whole cache lines: a line written partly by them and
/// partly by ordinary stores is flushed from the write-combining buffer half empty.
inline constexpr std::size_t kCacheLineBytes = 64;

/// Elements from dst to the next cache-line boundary (0 when aligned).
template <class T>
inline std::size_t elements_to_line(const T* dst) noexcept {
  const auto misalignment = reinterpret_cast<std::uintptr_t>(dst) % kCacheLineBytes;
  return misalignment ? (kCacheLineBytes - misalignment) / sizeof(T) : 0;
}

/// store() with a non-temporal (cache-bypassing) store when dst is aligned for one: for outputs
/// far larger than the caches it saves the read-for-ownership of every line. SSE levels stream
/// f32 only (SSE2 has no 16-byte streaming store for packed 16-bit results worth the detour).
/// Callers issue stream_fence() before the data is handed to another thread.
template <class Arch, class T>
inline void store_stream(T* dst, F32<Arch> v) noexcept {
  if (reinterpret_cast<std::uintptr_t>(dst) % kStoreBytes<Arch, T> != 0) {
    return simd::store<Arch>(dst, v);
  }
  if constexpr (std::is_same_v<T, float>) {
    if constexpr (kIsAvx512<Arch>) {
      _mm512_stream_ps(dst, v);
    } else if constexpr (kIsAvx2<Arch>) {
      _mm256_stream_ps(dst, v);
    } else {
      _mm_stream_ps(dst, v);
    }
  } else if constexpr (kIsAvx512<Arch>) {
    const __m256i half = std::is_same_v<T, bf16>
                             ? simd::avx512_bf16_pack<Arch>(v)
                             : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), half);
  } else if constexpr (kIsAvx2<Arch> && std::is_same_v<T, f16>) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    simd::store<Arch>(dst, v);
  }
}

// ---- integer dot products ------------------------------------------------------------------

template <class Arch>
using I32 = xsimd::batch<std::int32_t, Arch>;

/// Per-lane sum of the two int16 products of a and b (pmaddwd), exact in int32.
template <class Arch>
inline I32<Arch> madd_int16(I32<Arch> a, I32<Arch> b) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    return _mm512_madd_epi16(a, b);
  } else if constexpr (kIsAvx2<Arch>) {
    return _mm256_madd_epi16(a, b);
  } else {
    return _mm_madd_epi16(a, b);
  }
}

/// Whether the int8 dot products below run on pmaddubsw: the SSE4.2 and AVX2 levels (SSSE3
/// has it and psignb; AVX-512 has no vpsignb, and its VNNI variant has vpdpbusd instead).
template <class Arch>
inline constexpr bool kHasMaddubs = kIsAvx2<Arch> || std::is_base_of_v<xsimd::ssse3, Arch>;

/// The largest u8 operand dot_u8s8 multiplies exactly by any s8 operand: pmaddubsw saturates
/// its int16 sums of two products, which hold 2 x 127 x 128 = 32512 but not 2 x 255 x 128.
template <class Arch>
inline constexpr int kDotU8Max = kHasMaddubs<Arch> ? 127 : 255;

/// The even (sign-extended low) and odd (high) bytes of each 16-bit half of v, as int16: the
/// pmaddwd emulation's widening (an arithmetic 16-bit shift sign-extends).
template <class Arch>
inline void widen_s8(I32<Arch> v, I32<Arch>& even, I32<Arch>& odd) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    even = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8);
    odd = _mm512_srai_epi16(v, 8);
  } else if constexpr (kIsAvx2<Arch>) {
    even = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
    odd = _mm256_srai_epi16(v, 8);
  } else {
    even = _mm_srai_epi16(_mm_slli_epi16(v, 8), 8);
    odd = _mm_srai_epi16(v, 8);
  }
}

/// acc + the per-lane sum of the 2 int16 pair sums of pmaddubsw(unsigned(a), signed(b)).
template <class Arch>
inline I32<Arch> add_maddubs(I32<Arch> acc, I32<Arch> a, I32<Arch> b) noexcept {
  const I32<Arch> int16_ones(0x00010001);
  if constexpr (kIsAvx2<Arch>) {
    return acc + madd_int16<Arch>(_mm256_maddubs_epi16(a, b), int16_ones);
  } else {
    return acc + madd_int16<Arch>(_mm_maddubs_epi16(a, b), int16_ones);
  }
}

/// acc + the per-lane sum of the 4 byte products unsigned(a) x signed(b), exact for a <=
/// kDotU8Max: vpdpbusd (the non-saturating form) with AVX512-VNNI; pmaddubsw, then pmaddwd by
/// ones, on the SSE4.2 and AVX2 levels; elsewhere bytes widened to int16 pairs through pmaddwd
/// (bytes 0 and 2, then 1 and 3).
template <class Arch>
inline I32<Arch> dot_u8s8(I32<Arch> acc, I32<Arch> a, I32<Arch> b) noexcept {
  if constexpr (kHasBf16Vnni<Arch>) {
    // Inline asm, not _mm512_dpbusd_epi32: around the intrinsic GCC 12 copied every
    // accumulator to a scratch register and back (2 moves per vpdpbusd) and, with 24
    // accumulators, stored them to the stack each iteration (1.5x slower int8 attention).
    // Register operands only: given "vm", GCC reloaded a vector reused by several rows from
    // memory for every instruction (MLA QK: 3x the loads).
    __m512i sum = acc;
    asm("vpdpbusd %2, %1, %0"
        : "+v"(sum)
        : "v"(static_cast<__m512i>(a)), "v"(static_cast<__m512i>(b)));
    return sum;
  } else if constexpr (kHasMaddubs<Arch>) {
    return add_maddubs<Arch>(acc, a, b);
  } else {
    const I32<Arch> low_bytes(0x00ff00ff);
    const I32<Arch> a_even = a & low_bytes, a_odd = (a >> 8) & low_bytes;
    I32<Arch> b_even, b_odd;
    widen_s8<Arch>(b, b_even, b_odd);
    return acc + madd_int16<Arch>(a_even, b_even) + madd_int16<Arch>(a_odd, b_odd);
  }
}

/// |v| per byte (-128 gives 128 read as u8) on pmaddubsw levels, the operand dot_s8s8 takes
/// as a_magnitude; elsewhere v itself (the emulation does not use it).
template <class Arch>
inline I32<Arch> magnitude_s8(I32<Arch> v) noexcept {
  if constexpr (kIsAvx2<Arch>) {
    return _mm256_abs_epi8(v);
  } else if constexpr (kHasMaddubs<Arch>) {
    return _mm_abs_epi8(v);
  } else {
    return v;
  }
}

/// acc + the per-lane sum of the 4 byte products signed(a) x signed(b), with a_magnitude =
/// magnitude_s8(a); exact when b's bytes are in [-127, 127] (the sign trick would turn a b of
/// -128 into -128 again; a may be -128: 2 x 128 x 127 fits int16). pmaddubsw levels: |a| as
/// u8 times b carrying a's sign (psignb, ggml's q8_0 trick); elsewhere both widened to int16
/// through pmaddwd. The VNNI variant multiplies u8 by s8 (dot_u8s8) instead.
template <class Arch>
inline I32<Arch> dot_s8s8(I32<Arch> acc, I32<Arch> a_magnitude, I32<Arch> a, I32<Arch> b) noexcept {
  static_assert(!kHasBf16Vnni<Arch>, "the VNNI kernels use dot_u8s8");
  if constexpr (kIsAvx2<Arch>) {
    return add_maddubs<Arch>(acc, a_magnitude, _mm256_sign_epi8(b, a));
  } else if constexpr (kHasMaddubs<Arch>) {
    return add_maddubs<Arch>(acc, a_magnitude, _mm_sign_epi8(b, a));
  } else {
    I32<Arch> a_even, a_odd, b_even, b_odd;
    widen_s8<Arch>(a, a_even, a_odd);
    widen_s8<Arch>(b, b_even, b_odd);
    return acc + madd_int16<Arch>(a_even, b_even) + madd_int16<Arch>(a_odd, b_odd);
  }
}

/// The byte type of the broadcast rows of dot_tile: u8 (dot_u8s8), s8 (dot_s8s8), or u8 of
/// at most kDotU6Max, for which pmaddubsw levels add two words' int16 sums before one pmaddwd
/// (2 x 2 x 63 x 128 = 32256 fits int16): 3 multiply uops per two words instead of 4.
enum class RowBytes : std::uint8_t { u8, s8, u6 };

/// The largest row byte of dot_tile with RowBytes::u6.
template <class Arch>
inline constexpr int kDotU6Max = kHasMaddubs<Arch> ? 63 : kDotU8Max<Arch>;

/// acc + the per-lane sum of the 8 byte products of two word pairs a0 x b0 and a1 x b1
/// (unsigned a at most kDotU6Max, signed b): both pmaddubsw sums added in int16, then one
/// pmaddwd by ones.
template <class Arch>
inline I32<Arch> dot_u6s8_pair(I32<Arch> acc, I32<Arch> a0, I32<Arch> b0, I32<Arch> a1,
                               I32<Arch> b1) noexcept {
  const I32<Arch> int16_ones(0x00010001);
  if constexpr (kIsAvx2<Arch>) {
    const __m256i sums =
        _mm256_add_epi16(_mm256_maddubs_epi16(a0, b0), _mm256_maddubs_epi16(a1, b1));
    return acc + madd_int16<Arch>(sums, int16_ones);
  } else {
    const __m128i sums = _mm_add_epi16(_mm_maddubs_epi16(a0, b0), _mm_maddubs_epi16(a1, b1));
    return acc + madd_int16<Arch>(sums, int16_ones);
  }
}

/// The int8 register tile of the int8 attention and MLA kernels: acc[r][c] += the word of row
/// r at word w (rows + r * row_bytes + w * word_row_bytes; bytes as kRowBytes) times the V
/// consecutive s8 vectors of word w (vectors + w * word_bytes), exact int32 within the ranges
/// of dot_u8s8 / dot_s8s8, for w < words. Accumulators are plain register arrays: GCC kept
/// arrays of xsimd integer batches in memory (a store and a reload around every vpdpbusd).
template <class Arch, int R, int V, RowBytes kRowBytes>
[[gnu::always_inline]] inline void dot_tile(
    const void* rows, std::int64_t row_bytes, std::int64_t word_row_bytes,
    const std::int8_t* vectors, std::int64_t word_bytes, std::int64_t words,
    typename I32<Arch>::register_type (&acc)[R][V]) noexcept {
  using Reg = typename I32<Arch>::register_type;
  constexpr std::int64_t kLanes = I32<Arch>::size;
  const auto* row_base = static_cast<const std::uint8_t*>(rows);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) acc[r][c] = I32<Arch>(0);
  }
  const auto row_word = [&](int r, std::int64_t word) {
    std::int32_t bytes;
    std::memcpy(&bytes, row_base + r * row_bytes + word * word_row_bytes, sizeof bytes);
    return Reg(I32<Arch>(bytes));
  };
  std::int64_t first_single = 0;
  if constexpr (kRowBytes == RowBytes::u6 && kHasMaddubs<Arch>) {
    for (; first_single + 2 <= words; first_single += 2) {
      Reg vector0[V], vector1[V];
      const auto* at = reinterpret_cast<const std::int32_t*>(vectors + first_single * word_bytes);
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) {
        vector0[c] = I32<Arch>::load_aligned(at + c * kLanes);
        vector1[c] = I32<Arch>::load_aligned(at + word_bytes / 4 + c * kLanes);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const Reg row0 = row_word(r, first_single), row1 = row_word(r, first_single + 1);
#pragma GCC unroll 4
        for (int c = 0; c < V; ++c) {
          acc[r][c] = dot_u6s8_pair<Arch>(acc[r][c], row0, vector0[c], row1, vector1[c]);
        }
      }
    }
  }
  for (std::int64_t word = first_single; word < words; ++word) {
    Reg vector[V];
    const auto* at = reinterpret_cast<const std::int32_t*>(vectors + word * word_bytes);
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) vector[c] = I32<Arch>::load_aligned(at + c * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Reg row = row_word(r, word);
      const Reg magnitude = magnitude_s8<Arch>(row);  // unused unless s8
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) {
        if constexpr (kRowBytes == RowBytes::s8) {
          acc[r][c] = dot_s8s8<Arch>(acc[r][c], magnitude, row, vector[c]);
        } else {
          acc[r][c] = dot_u8s8<Arch>(acc[r][c], row, vector[c]);
        }
      }
    }
  }
}

/// Largest lane of an int32 vector.
template <class Arch>
inline std::int32_t reduce_max(I32<Arch> v) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    return _mm512_reduce_max_epi32(v);
  } else if constexpr (kIsAvx2<Arch> || std::is_base_of_v<xsimd::sse4_1, Arch>) {
    // Halving shuffles (pmaxsd is SSE4.1) rather than a store and a scalar loop: the int8
    // softmax takes one block max per row and block of 64 scores.
    __m128i top;
    if constexpr (kIsAvx2<Arch>) {
      top = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    } else {
      top = v;
    }
    top = _mm_max_epi32(top, _mm_shuffle_epi32(top, 0x4e));
    top = _mm_max_epi32(top, _mm_shuffle_epi32(top, 0xb1));
    return _mm_cvtsi128_si32(top);
  } else {
    alignas(64) std::int32_t lanes[I32<Arch>::size];
    v.store_aligned(lanes);
    std::int32_t best = lanes[0];
    for (std::size_t i = 1; i < I32<Arch>::size; ++i) best = lanes[i] > best ? lanes[i] : best;
    return best;
  }
}

/// Sum of the lanes of an int32 vector (wrapping, as the lanes' own adds).
template <class Arch>
inline std::int32_t reduce_add(I32<Arch> v) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    return _mm512_reduce_add_epi32(v);
  } else {
    alignas(64) std::int32_t lanes[I32<Arch>::size];
    v.store_aligned(lanes);
    std::uint32_t sum = 0;
    for (std::size_t i = 0; i < I32<Arch>::size; ++i) sum += static_cast<std::uint32_t>(lanes[i]);
    return static_cast<std::int32_t>(sum);
  }
}

/// The scale of symmetric int8 quantization of values whose largest magnitude is `top`:
/// top / 127, or 1 when that is not a normal float (all zero, or so small that 1 / scale
/// would overflow): every value then quantizes to 0.
inline float int8_scale(float top) noexcept {
  const float scale = top / 127.f;
  return scale >= std::numeric_limits<float>::min() ? scale : 1.f;
}

/// The low byte of each int32 lane (values known to fit) to dst, F32<Arch>::size bytes.
/// SSE and AVX2 have no truncating narrow: the low bytes (0..255, masked) go through the
/// saturating packs, which keep them as they are (a store and a byte loop cost the AVX2 int8
/// attention 3 % when its softmax narrowed P with it; that now uses store_u8_x4).
template <class Arch>
inline void store_low_bytes(void* dst, I32<Arch> v) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    _mm_storeu_si128(static_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(v));
  } else if constexpr (kIsAvx2<Arch>) {
    const __m256i words = _mm256_packs_epi32(v & I32<Arch>(0xff), I32<Arch>(0));
    const __m256i bytes = _mm256_packus_epi16(words, words);  // 4 bytes per 128-bit lane
    const __m128i low8 =
        _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1));
    _mm_storel_epi64(static_cast<__m128i*>(dst), low8);
  } else {
    const __m128i words = _mm_packs_epi32(v & I32<Arch>(0xff), _mm_setzero_si128());
    const std::int32_t bytes = _mm_cvtsi128_si32(_mm_packus_epi16(words, words));
    std::memcpy(dst, &bytes, sizeof bytes);
  }
}

/// The lanes of four int32 vectors, each in [0, 255], as 4 x lanes consecutive bytes at dst
/// (a's lanes first): two saturating packs and, on AVX2, one lane permute for 32 bytes, where
/// store_low_bytes per vector takes six instructions and a 4- or 8-byte store each.
template <class Arch>
inline void store_u8_x4(void* dst, I32<Arch> a, I32<Arch> b, I32<Arch> c, I32<Arch> d) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    auto* bytes = static_cast<std::uint8_t*>(dst);
    store_low_bytes<Arch>(bytes, a);
    store_low_bytes<Arch>(bytes + 16, b);
    store_low_bytes<Arch>(bytes + 32, c);
    store_low_bytes<Arch>(bytes + 48, d);
  } else if constexpr (kIsAvx2<Arch>) {
    // Per 128-bit lane the packs interleave 4 lanes of a, b, c, d: dwords a0 b0 c0 d0 | a1 b1
    // c1 d1, where x0 / x1 are x's low / high four lanes.
    const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256(
        static_cast<__m256i*>(dst),
        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  } else {
    _mm_storeu_si128(static_cast<__m128i*>(dst),
                     _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d)));
  }
}

/// Asks for the cache line holding `address` (xsimd 8.1 has no prefetch).
template <class T>
inline void prefetch(const T* address) noexcept {
  _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T0);
}

/// Orders earlier streaming stores before later stores (they are weakly ordered).
template <class Arch>
inline void stream_fence() noexcept {
  _mm_sfence();
}

/// float value of one stored element, inline (the hot tail paths must not call out).
template <class T>
inline float scalar_to_float(T value) noexcept {
  if constexpr (std::is_same_v<T, bf16>) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(value.bits) << 16);
  } else {
    return to_float(value);
  }
}

/// AVX2 lane mask (all ones in lanes < count) for maskload/maskstore.
template <class Arch>
inline __m256i avx2_lane_mask(std::size_t count) noexcept {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// Loads the first `count` (< lanes) elements of src; the other lanes hold `fill`. Never reads
/// past src + count: AVX-512 and AVX2 (f32) use masked loads, which do not fault on masked-off
/// lanes (xsimd 8.1 has none); other cases go element by element.
template <class Arch, class T>
inline F32<Arch> load_partial(const T* src, std::size_t count, float fill) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    const auto mask = static_cast<__mmask16>((1u << count) - 1);
    const __m512 fill_vector = _mm512_set1_ps(fill);
    if constexpr (std::is_same_v<T, float>) {
      return _mm512_mask_loadu_ps(fill_vector, mask, src);
    } else {
      const __m256i half = _mm256_maskz_loadu_epi16(mask, src);
      const __m512 wide =
          std::is_same_v<T, bf16>
              ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16))
              : _mm512_cvtph_ps(half);
      return _mm512_mask_blend_ps(mask, fill_vector, wide);
    }
  } else if constexpr (kIsAvx2<Arch> && std::is_same_v<T, float>) {
    const __m256i mask = avx2_lane_mask<Arch>(count);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(src, mask),
                            _mm256_castsi256_ps(mask));
  } else {
    alignas(64) float lanes[F32<Arch>::size];
    for (std::size_t i = 0; i < F32<Arch>::size; ++i) {
      lanes[i] = i < count ? scalar_to_float(src[i]) : fill;
    }
    return F32<Arch>::load_aligned(lanes);
  }
}

/// Stores the first `count` (<= lanes) lanes of v; writes nothing past dst + count.
template <class Arch, class T>
inline void store_partial(T* dst, F32<Arch> v, std::size_t count) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    const auto mask = static_cast<__mmask16>((1u << count) - 1);
    if constexpr (std::is_same_v<T, float>) {
      _mm512_mask_storeu_ps(dst, mask, v);
    } else {
      const __m256i half = std::is_same_v<T, bf16>
                               ? simd::avx512_bf16_pack<Arch>(v)
                               : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_mask_storeu_epi16(dst, mask, half);
    }
  } else if constexpr (kIsAvx2<Arch> && std::is_same_v<T, float>) {
    // Halves, pairs and singles rather than vmaskmovps, which AMD Zen 2 and 3 run as microcode:
    // RMSNorm of D = 128 f32 rows 16 bytes off a cache line (as std::vector's large
    // allocations are) took 1.9x as long as aligned rows with it, the partial ends of every
    // row being masked stores.
    if (count >= 8) return _mm256_storeu_ps(dst, v);
    __m128 part = _mm256_castps256_ps128(v);
    if (count & 4) {
      _mm_storeu_ps(dst, part);
      part = _mm256_extractf128_ps(v, 1);
      dst += 4;
    }
    if (count & 2) {
      _mm_storel_pi(reinterpret_cast<__m64*>(dst), part);
      part = _mm_movehl_ps(part, part);
      dst += 2;
    }
    if (count & 1) _mm_store_ss(dst, part);
  } else {
    alignas(64) float lanes[F32<Arch>::size];
    v.store_aligned(lanes);
    for (std::size_t i = 0; i < count; ++i) dst[i] = from_float<T>(lanes[i]);
  }
}

// ---- row chunks: full vectors, with partial vectors at the ends -----------------------------

/// Writes elements [i, i + count) of a row: store_partial for a short piece, else store or
/// (when `stream`) store_stream.
template <class Arch, class T>
inline void store_chunk(T* dst, std::size_t i, std::size_t count, F32<Arch> v, bool stream) {
  if (count < F32<Arch>::size) {
    simd::store_partial<Arch>(dst + i, v, count);
  } else if (stream) {
    simd::store_stream<Arch>(dst + i, v);
  } else {
    simd::store<Arch>(dst + i, v);
  }
}

/// Elements [i, i + count) of src (count <= lanes; the rest of the vector is 0).
template <class Arch, class T>
inline F32<Arch> load_chunk(const T* src, std::size_t i, std::size_t count) {
  return count < F32<Arch>::size ? simd::load_partial<Arch>(src + i, count, 0.f)
                                 : simd::load<Arch>(src + i);
}

/// Two vectors (lo, then hi) as 16-bit T (bf16 rounded to nearest even, or f16) in one register
/// of the vector width (AVX2 and AVX-512). kMayBeNaN as for bf16_bits.
template <class Arch, class T, bool kMayBeNaN = true>
inline auto pack_16bit_pair(F32<Arch> lo, F32<Arch> hi) noexcept {
  static_assert(!std::is_same_v<T, float> && (kIsAvx512<Arch> || kIsAvx2<Arch>));
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  if constexpr (kIsAvx512<Arch>) {
    if constexpr (std::is_same_v<T, bf16>) {
      return _mm512_inserti64x4(_mm512_castsi256_si512(simd::avx512_bf16_pack<Arch>(lo)),
                                simd::avx512_bf16_pack<Arch>(hi), 1);
    } else {
      return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(lo, kRound)),
                                _mm512_cvtps_ph(hi, kRound), 1);
    }
  } else if constexpr (std::is_same_v<T, bf16>) {
    // packus interleaves the 128-bit lanes of its operands: [lo0-3 hi0-3 | lo4-7 hi4-7].
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(simd::bf16_bits<Arch, kMayBeNaN>(lo),
                                                        simd::bf16_bits<Arch, kMayBeNaN>(hi)),
                                    0xD8);
  } else {
    return _mm256_set_m128i(_mm256_cvtps_ph(hi, kRound), _mm256_cvtps_ph(lo, kRound));
  }
}

/// Stores two vectors (lo, then hi: 2 * F32<Arch>::size floats) as T, with non-temporal stores
/// when `stream` and dst is aligned for them. kMayBeNaN false: neither vector holds a NaN
/// (bf16_bits; used by AVX2's bf16 rounding). bf16 on AVX2 packs both vectors with one pack and
/// one permute into one 32-byte store, which AVX2 can also stream (a single vector packs into
/// 16 bytes and pays the pack and the permute alone).
template <class Arch, class T, bool kMayBeNaN = true>
inline void store_pair(T* dst, F32<Arch> lo, F32<Arch> hi, bool stream) noexcept {
  if constexpr (kIsAvx2<Arch> && std::is_same_v<T, bf16>) {
    const __m256i packed = simd::pack_16bit_pair<Arch, T, kMayBeNaN>(lo, hi);
    auto* target = reinterpret_cast<__m256i*>(dst);
    if (stream && reinterpret_cast<std::uintptr_t>(dst) % 32 == 0) {
      _mm256_stream_si256(target, packed);
    } else {
      _mm256_storeu_si256(target, packed);
    }
  } else if (stream) {
    simd::store_stream<Arch>(dst, lo);
    simd::store_stream<Arch>(dst + F32<Arch>::size, hi);
  } else {
    simd::store<Arch>(dst, lo);
    simd::store<Arch>(dst + F32<Arch>::size, hi);
  }
}

/// Walks [0, dim) of a row written to dst: pair(i, stream) for pieces [i, i + 2 lanes) and
/// single(i, count, stream) for pieces of at most one vector. With `stream`, the pieces that
/// cover whole cache lines of dst get stream = std::true_type (a constant, so the callee's store
/// needs no test per piece); the (at most two) partial lines at the ends of the row are written
/// with ordinary stores, in single pieces. Without, every piece gets std::false_type.
template <class Arch, class T, class Pair, class Single>
inline void for_each_piece(const T* dst, std::size_t dim, bool stream, const Pair& pair,
                           const Single& single) {
  constexpr std::size_t kLanes = F32<Arch>::size;
  constexpr std::size_t kLineElements = kCacheLineBytes / sizeof(T);
  // Plain loops rather than a helper lambda: GCC 12 kept such a lambda out of line, a call per
  // piece, which short rows (D = 128) pay for every row.
  constexpr std::true_type whole_lines;
  constexpr std::false_type ordinary;
  std::size_t i = 0;
  if (stream) {
    const std::size_t head = std::min(dim, elements_to_line(dst));
    const std::size_t body_end = head + (dim - head) / kLineElements * kLineElements;
    for (; i < head; i += kLanes) single(i, std::min(kLanes, head - i), ordinary);
    for (i = head; i + 2 * kLanes <= body_end; i += 2 * kLanes) pair(i, whole_lines);
    for (; i < body_end; i += kLanes) single(i, kLanes, whole_lines);  // a line of one vector
  } else {
    for (; i + 2 * kLanes <= dim; i += 2 * kLanes) pair(i, ordinary);
  }
  for (; i < dim; i += kLanes) single(i, std::min(kLanes, dim - i), ordinary);
}

// ---- streaming rows that share cache lines -------------------------------------------------

/// Rows of at most this many bytes are staged by LineStager; in longer ones the two partial lines
/// at the ends are a small share of the row's lines.
inline constexpr std::size_t kMaxStagedRowBytes = 4096;

/// Streams the outputs of rows that share cache lines with their neighbours. A row that does
/// not start on a line, or does not fill whole lines (a row of 128 f32 16 bytes past a line, as
/// malloc and numpy place large arrays), begins and ends in lines that neighbouring rows write
/// too; streaming its whole lines and writing those partial lines with ordinary stores mixes the
/// two kinds of store on neighbouring lines and loses the write-combining (measured: RoPE f32
/// over such rows at half the speed of line-aligned ones). Such a row is computed instead into a
/// line-aligned staging buffer, at the same offset within a line as its destination, with
/// ordinary stores (L1); then every line of it that is complete is streamed to its destination,
/// and its last, incomplete line stays in the buffer for the next row, which completes it when
/// it continues in memory (else it is written with ordinary stores). The first line of a
/// thread's range and the last one are written with ordinary stores.
///
/// Rows that start on a line and fill whole lines are written in place (begin_row returns dst),
/// as are rows longer than kMaxStagedRowBytes and every row when not streaming: the caller
/// streams those itself when streams_in_place() says so. The values a row computes do not
/// depend on where they are written, so staged and direct rows are bit for bit the same.
template <class Arch, class T>
class LineStager {
 public:
  LineStager(std::size_t dim, bool stream) noexcept
      : row_bytes_(dim * sizeof(T)), stream_(stream) {}
  LineStager(const LineStager&) = delete;
  LineStager& operator=(const LineStager&) = delete;
  ~LineStager() { finish(); }

  /// Where to compute the row that will be stored at `dst` (dst itself, or the staging buffer).
  T* begin_row(T* dst) noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(dst);
    const std::size_t phase = address % kCacheLineBytes;
    staged_ = stream_ && row_bytes_ <= kMaxStagedRowBytes && address % alignof(T) == 0 &&
              (phase != 0 || row_bytes_ % kCacheLineBytes != 0);
    if (!staged_) {
      flush();
      return dst;
    }
    // The pending bytes are the start of this row's first line when the row continues them.
    if (pending_ && pending_line_ + pending_to_ != address) flush();
    valid_from_ = pending_ ? pending_from_ : phase;
    valid_to_ = phase + row_bytes_;
    pending_ = false;
    line_ = address - phase;
    return reinterpret_cast<T*>(buffer_ + phase);
  }

  /// Whether the caller streams the current row itself (a row written in place while streaming).
  bool streams_in_place() const noexcept { return stream_ && !staged_; }

  /// Streams the complete lines of a staged row and keeps its incomplete last line pending.
  void end_row() noexcept {
    if (!staged_) return;
    const std::size_t whole_end = valid_to_ / kCacheLineBytes * kCacheLineBytes;
    auto* target = reinterpret_cast<std::byte*>(line_);
    for (std::size_t at = 0; at < whole_end; at += kCacheLineBytes) {
      if (at >= valid_from_) {
        move_line<true>(target + at, buffer_ + at);
      } else {  // the row's first line, begun by bytes this stager does not hold
        std::memcpy(target + valid_from_, buffer_ + valid_from_, kCacheLineBytes - valid_from_);
      }
    }
    if (whole_end < valid_to_) {
      pending_from_ = std::max(valid_from_, whole_end) - whole_end;
      pending_to_ = valid_to_ - whole_end;
      pending_line_ = line_ + whole_end;
      move_line<false>(buffer_, buffer_ + whole_end);  // a whole line: no call, no byte count
      pending_ = true;
    }
  }

  /// Writes the pending bytes, if any (ordinary stores). Call before stream_fence.
  void finish() noexcept { flush(); }

 private:
  void flush() noexcept {
    if (!pending_) return;
    std::memcpy(reinterpret_cast<std::byte*>(pending_line_) + pending_from_,
                buffer_ + pending_from_, pending_to_ - pending_from_);
    pending_ = false;
  }

  /// Copies one line-aligned line (its bits, as floats), streamed to memory or not.
  template <bool kStream>
  static void move_line(std::byte* dst, const std::byte* src) noexcept {
    constexpr std::size_t kVectorBytes = F32<Arch>::size * sizeof(float);
    for (std::size_t at = 0; at < kCacheLineBytes; at += kVectorBytes) {
      const auto v = F32<Arch>::load_aligned(reinterpret_cast<const float*>(src + at));
      if constexpr (kStream) {
        store_stream<Arch>(reinterpret_cast<float*>(dst + at), v);
      } else {
        v.store_aligned(reinterpret_cast<float*>(dst + at));
      }
    }
  }

  std::size_t row_bytes_;
  bool stream_;
  bool staged_ = false;
  std::uintptr_t line_ = 0;  ///< the line of the current row's first byte
  /// The current row's bytes in the buffer (from valid_from_ when earlier bytes are pending).
  std::size_t valid_from_ = 0, valid_to_ = 0;
  bool pending_ = false;  ///< buffer_[pending_from_, pending_to_) awaits pending_line_
  std::size_t pending_from_ = 0, pending_to_ = 0;
  std::uintptr_t pending_line_ = 0;
  alignas(kCacheLineBytes) std::byte buffer_[kMaxStagedRowBytes + 2 * kCacheLineBytes];
};

/// Streams a run of output written as whole vectors in memory order (AVX2 and AVX-512) when it
/// starts part way into a vector's alignment: each vector is joined with the one before it by
/// one permute (two on AVX2) into the aligned vector that spans their seam, and that is
/// streamed, so no byte goes through memory twice. A row that starts where the previous one
/// ended continues the run: a thread's range of contiguous rows (RoPE's BSND rows of 128 f32 16
/// bytes past a line, as malloc and numpy place them) has only two partial vectors, at its ends,
/// written with ordinary masked stores. Line-aligned runs stream each vector as it comes. A run
/// must start on a 4-byte boundary (joins move whole 32-bit lanes; starts() tells).
template <class Arch>
inline constexpr bool kHasShiftedStreams = kIsAvx512<Arch> || kIsAvx2<Arch>;

/// The integer register of a vector width (not std::conditional_t: GCC drops the vector types'
/// attributes from template arguments).
template <bool kAvx512>
struct IntRegister {
  using type = __m256i;
};
template <>
struct IntRegister<true> {
  using type = __m512i;
};

template <class Arch>
class ShiftedStreamWriter {
 public:
  static_assert(kHasShiftedStreams<Arch>);
  using Bits = typename IntRegister<kIsAvx512<Arch>>::type;
  static constexpr std::size_t kVectorBytes = sizeof(Bits);
  static constexpr int kLanes = static_cast<int>(kVectorBytes / 4);

  ShiftedStreamWriter() = default;
  ShiftedStreamWriter(const ShiftedStreamWriter&) = delete;
  ShiftedStreamWriter& operator=(const ShiftedStreamWriter&) = delete;
  ~ShiftedStreamWriter() { finish(); }

  /// Whether a run can start at dst.
  static bool starts(const void* dst) noexcept {
    return reinterpret_cast<std::uintptr_t>(dst) % 4 == 0;
  }

  /// The next vectors go to dst (starts(dst)); a dst that does not continue the run ends it.
  void begin_row(void* dst) noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(dst);
    if (address == next_) return;
    finish();
    shift_ = static_cast<int>(address % kVectorBytes / 4);
    next_ = address;
    started_ = false;
    if constexpr (kIsAvx512<Arch>) {
      // Lane i of a join takes lane kLanes - shift + i of the two vectors (previous, current).
      join_index_ =
          _mm512_add_epi32(_mm512_set1_epi32(kLanes - shift_),
                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    } else {
      // Both vectors rotated up by shift lanes; the lanes below shift come from the previous.
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      rotate_index_ = _mm256_and_si256(_mm256_add_epi32(lane, _mm256_set1_epi32(kLanes - shift_)),
                                       _mm256_set1_epi32(kLanes - 1));
      from_previous_ = _mm256_cmpgt_epi32(_mm256_set1_epi32(shift_), lane);
    }
  }

  /// Writes the next kVectorBytes of the run.
  void push(Bits v) noexcept {
    const Bits joined = join(v);
    Bits* target = aligned_target();
    if (started_ || shift_ == 0) {
      stream(target, joined);
    } else {  // the run's first vector: its lanes from shift_ on
      store_lanes(target, joined, shift_, kLanes);
    }
    started_ = true;
    next_ += kVectorBytes;
  }

  /// Writes lo and hi (2 * F32<Arch>::size floats) as T.
  template <class T, bool kMayBeNaN = true>
  void push_pair(F32<Arch> lo, F32<Arch> hi) noexcept {
    if constexpr (std::is_same_v<T, float>) {
      push(bits(lo));
      push(bits(hi));
    } else {
      push(simd::pack_16bit_pair<Arch, T, kMayBeNaN>(lo, hi));
    }
  }

  /// Writes the run's last partial vector, if any. Call before stream_fence.
  void finish() noexcept {
    if (started_ && shift_ != 0) {
      store_lanes(aligned_target(), tail(), 0, shift_);
    }
    started_ = false;
    next_ = 0;
  }

 private:
  /// Where the next joined vector goes: the aligned vector holding next_ (shift_ lanes in).
  Bits* aligned_target() const noexcept {
    return reinterpret_cast<Bits*>(next_ - static_cast<std::uintptr_t>(shift_) * 4);
  }

  static Bits bits(F32<Arch> v) noexcept {
    if constexpr (kIsAvx512<Arch>) {
      return _mm512_castps_si512(v);
    } else {
      return _mm256_castps_si256(v);
    }
  }

  /// Lanes [0, shift) from the previous vector's last lanes, the rest from v's first ones.
  Bits join(Bits v) noexcept {
    if constexpr (kIsAvx512<Arch>) {
      const Bits joined = _mm512_permutex2var_epi32(previous_, join_index_, v);
      previous_ = v;
      return joined;
    } else {
      const Bits rotated = _mm256_permutevar8x32_epi32(v, rotate_index_);
      const Bits joined = _mm256_blendv_epi8(rotated, previous_, from_previous_);
      previous_ = rotated;
      return joined;
    }
  }
  /// The previous vector's last shift_ lanes in lanes [0, shift_).
  Bits tail() const noexcept {
    if constexpr (kIsAvx512<Arch>) {
      return _mm512_permutex2var_epi32(previous_, join_index_, previous_);
    } else {
      return previous_;  // rotated: its last lanes are already first
    }
  }

  static void stream(Bits* target, Bits v) noexcept {
    if constexpr (kIsAvx512<Arch>) {
      _mm512_stream_si512(target, v);
    } else {
      _mm256_stream_si256(target, v);
    }
  }
  /// Ordinary stores of lanes [from, to) of v.
  static void store_lanes(Bits* target, Bits v, int from, int to) noexcept {
    if constexpr (kIsAvx512<Arch>) {
      const auto mask = static_cast<__mmask16>(((1u << to) - 1) & ~((1u << from) - 1));
      _mm512_mask_storeu_epi32(target, mask, v);
    } else {
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i mask = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(from), lane),
                                               _mm256_cmpgt_epi32(_mm256_set1_epi32(to), lane));
      _mm256_maskstore_epi32(reinterpret_cast<int*>(target), mask, v);
    }
  }

  int shift_ = 0;            ///< the run's offset within a vector, in 32-bit lanes
  std::uintptr_t next_ = 0;  ///< where the run continues (0: no run)
  bool started_ = false;     ///< a vector of the run was pushed
  Bits previous_{};          ///< (AVX2: rotated by shift_)
  Bits join_index_{}, rotate_index_{}, from_previous_{};
};

}  // namespace ditops::simd
