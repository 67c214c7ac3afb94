#pragma once
// Partial vectors for kernel sources: loads and stores of the first `count` lanes, which
// never touch memory past them (row ends).

#include <immintrin.h>

#include <cstddef>
#include <ditops/tensor.hpp>
#include <type_traits>

#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"

namespace ditops::simd {

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

}  // namespace ditops::simd
