#pragma once
// f32 <-> storage type (float, bf16, f16) conversions for kernel sources: loads and stores of
// whole vectors, plain and streaming (non-temporal), scalar reads and 16-bit packs.

#include <immintrin.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <ditops/tensor.hpp>
#include <type_traits>

#include "ops/core/simd/gaps.hpp"

namespace ditops::simd {

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

}  // namespace ditops::simd
