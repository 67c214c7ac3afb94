#pragma once
// Rows as full vectors with partial ones at the ends, for kernel sources: chunk loads and
// stores, vector pairs, and the walk over a row's pieces that streams its whole cache lines.

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ditops/tensor.hpp>
#include <type_traits>

#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/partial.hpp"

namespace ditops::simd {

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

}  // namespace ditops::simd
