#pragma once
// The rotations of RoPE on fp32 vectors and the rows they write, for the kernels compiled per
// ISA level (the RoPE row kernel and the fused RMSNorm + RoPE one): one definition of the
// arithmetic and the stores, so both round and place their results alike.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ops/core/simd.hpp"

namespace ditops::rope {

template <class Arch>
using RopeVector = simd::F32<Arch>;

/// Lane permutation [1, 0, 3, 2, ...]: the partner of each element of an interleaved pair.
struct PairSwap {
  static constexpr unsigned get(unsigned index, unsigned) { return index ^ 1u; }
};

/// Rotate-half: out[i] = x[i]*cos[i] - x[i+h]*sin[i] for i < h (the first half), and
/// out[i+h] = x[i+h]*cos[i+h] + x[i]*sin[i+h] (the second); x1 = x[i..], x2 = x[i+h..].
template <class Arch>
inline RopeVector<Arch> first_half(RopeVector<Arch> x1, RopeVector<Arch> x2, RopeVector<Arch> c1,
                                   RopeVector<Arch> s1) noexcept {
  return simd::fmadd<Arch>(x1, c1, -(x2 * s1));
}
template <class Arch>
inline RopeVector<Arch> second_half(RopeVector<Arch> x1, RopeVector<Arch> x2, RopeVector<Arch> c2,
                                    RopeVector<Arch> s2) noexcept {
  return simd::fmadd<Arch>(x2, c2, x1 * s2);
}

/// Interleaved: out[2j] = x[2j]*cos[2j] - x[2j+1]*sin[2j];
/// out[2j+1] = x[2j+1]*cos[2j+1] + x[2j]*sin[2j+1].
template <class Arch>
class InterleavedRotation {
 public:
  InterleavedRotation() noexcept {
    // -0.0 on even lanes flips the sign of sin there: rot(x) = [-x1, x0, -x3, x2, ...].
    alignas(64) float sign_lanes[RopeVector<Arch>::size];
    for (std::size_t lane = 0; lane < RopeVector<Arch>::size; ++lane)
      sign_lanes[lane] = lane % 2 ? 0.f : -0.f;
    sign_ = RopeVector<Arch>::load_aligned(sign_lanes);
  }
  RopeVector<Arch> operator()(RopeVector<Arch> v, RopeVector<Arch> c,
                              RopeVector<Arch> s) const noexcept {
    constexpr auto kSwap =
        xsimd::make_batch_constant<xsimd::batch<std::uint32_t, Arch>, PairSwap>();
    return simd::fmadd<Arch>(v, c, xsimd::swizzle(v, kSwap) * (s ^ sign_));
  }

 private:
  RopeVector<Arch> sign_;
};

/// A row of T read as fp32 vectors: the plain input of rotate_half and rotate_interleaved.
template <class Arch, class T>
struct RowLoads {
  const T* x;
  RopeVector<Arch> operator()(std::size_t i) const noexcept { return simd::load<Arch>(x + i); }
  /// Elements [i, i + count) (count <= lanes; the other lanes 0).
  RopeVector<Arch> chunk(std::size_t i, std::size_t count) const noexcept {
    return simd::load_chunk<Arch>(x, i, count);
  }
};

/// Rotate-half of one row, stored piece by piece (both halves of a piece together); x is the
/// row's input as fp32 vectors (RowLoads, or the normalized row of the fused kernel). With
/// kNegatedSin, sin[0, D/2) holds -sin (WidenedTables): the first half is then x1*cos + x2*(-sin),
/// second_half's arithmetic with the halves swapped, the same bits as first_half without its
/// negation.
template <class Arch, bool kNegatedSin = false, class X, class T, class C>
void rotate_half(const X& x, const C* cos, const C* sin, T* out, std::size_t dim, bool stream) {
  constexpr std::size_t kLanes = RopeVector<Arch>::size;
  const std::size_t half = dim / 2;
  const auto first_half = [](RopeVector<Arch> x1, RopeVector<Arch> x2, RopeVector<Arch> c1,
                             RopeVector<Arch> s1) {
    if constexpr (kNegatedSin) {
      return rope::second_half<Arch>(x2, x1, c1, s1);
    } else {
      return rope::first_half<Arch>(x1, x2, c1, s1);
    }
  };
  // Pieces follow the cache lines of the first half; the second half streams along only when
  // it starts at the same offset within a line.
  const bool same_line_phase = half * sizeof(T) % simd::kCacheLineBytes == 0;
  simd::for_each_piece<Arch>(
      out, half, stream,
      [&](std::size_t i, auto whole) {
        const RopeVector<Arch> x1a = x(i), x1b = x(i + kLanes);
        const RopeVector<Arch> x2a = x(half + i), x2b = x(half + i + kLanes);
        simd::store_pair<Arch>(
            out + i, first_half(x1a, x2a, simd::load<Arch>(cos + i), simd::load<Arch>(sin + i)),
            first_half(x1b, x2b, simd::load<Arch>(cos + i + kLanes),
                       simd::load<Arch>(sin + i + kLanes)),
            whole);
        simd::store_pair<Arch>(
            out + half + i,
            second_half<Arch>(x1a, x2a, simd::load<Arch>(cos + half + i),
                              simd::load<Arch>(sin + half + i)),
            second_half<Arch>(x1b, x2b, simd::load<Arch>(cos + half + i + kLanes),
                              simd::load<Arch>(sin + half + i + kLanes)),
            whole && same_line_phase);
      },
      [&](std::size_t i, std::size_t n, auto whole) {
        const RopeVector<Arch> x1 = x.chunk(i, n), x2 = x.chunk(half + i, n);
        simd::store_chunk<Arch>(out, i, n,
                                first_half(x1, x2, simd::load_chunk<Arch>(cos, i, n),
                                           simd::load_chunk<Arch>(sin, i, n)),
                                whole);
        simd::store_chunk<Arch>(out + half, i, n,
                                second_half<Arch>(x1, x2, simd::load_chunk<Arch>(cos + half, i, n),
                                                  simd::load_chunk<Arch>(sin + half, i, n)),
                                whole && same_line_phase);
      });
}

/// InterleavedRotation with sin already signed (-sin on even lanes, as WidenedTables stores it):
/// the same arithmetic, less the sign flip.
template <class Arch>
struct SignedSinRotation {
  RopeVector<Arch> operator()(RopeVector<Arch> v, RopeVector<Arch> c,
                              RopeVector<Arch> signed_sin) const noexcept {
    constexpr auto kSwap =
        xsimd::make_batch_constant<xsimd::batch<std::uint32_t, Arch>, PairSwap>();
    return simd::fmadd<Arch>(v, c, xsimd::swizzle(v, kSwap) * signed_sin);
  }
};

/// Interleaved rotation of one row (x as for rotate_half), stored piece by piece (kNegatedSin: sin
/// signed, as SignedSinRotation takes it).
template <class Arch, bool kNegatedSin = false, class X, class T, class C>
void rotate_interleaved(const X& x, const C* cos, const C* sin, T* out, std::size_t dim,
                        bool stream) {
  constexpr std::size_t kLanes = RopeVector<Arch>::size;
  const std::conditional_t<kNegatedSin, SignedSinRotation<Arch>, InterleavedRotation<Arch>> rotated;
  // Pairs must not straddle pieces, so the first (line-alignment) piece must be even-sized; when
  // out sits an odd number of elements off a line boundary, do not stream.
  const bool align = stream && simd::elements_to_line(out) % 2 == 0;
  simd::for_each_piece<Arch>(
      out, dim, align,
      [&](std::size_t i, auto whole) {
        simd::store_pair<Arch>(out + i,
                               rotated(x(i), simd::load<Arch>(cos + i), simd::load<Arch>(sin + i)),
                               rotated(x(i + kLanes), simd::load<Arch>(cos + i + kLanes),
                                       simd::load<Arch>(sin + i + kLanes)),
                               whole);
      },
      [&](std::size_t i, std::size_t n, auto whole) {
        simd::store_chunk<Arch>(out, i, n,
                                rotated(x.chunk(i, n), simd::load_chunk<Arch>(cos, i, n),
                                        simd::load_chunk<Arch>(sin, i, n)),
                                whole);
      });
}

}  // namespace ditops::rope
