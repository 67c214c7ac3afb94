#pragma once
// The rotations of RoPE on fp32 vectors and the rows they write, for the kernels compiled per
// ISA level (the RoPE row kernel and the fused RMSNorm + RoPE one): one definition of the
// arithmetic and the stores, so both round and place their results alike.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/row_chunks.hpp"

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

/// The cos/sin rows of the current row as the kernel reads them: the tables themselves.
template <class C>
class DirectTables {
 public:
  using Element = C;
  static constexpr bool kNegatedSin = false;
  void fetch(const C* cos, const C* sin, std::size_t) noexcept {
    cos_ = cos;
    sin_ = sin;
  }
  const C* cos() const noexcept { return cos_; }
  const C* sin() const noexcept { return sin_; }

 private:
  const C* cos_ = nullptr;
  const C* sin_ = nullptr;
};

/// Rows of at most this many elements have their 16-bit cos/sin rows widened (WidenedTables).
constexpr std::size_t kMaxWidenedDim = 1024;

/// 16-bit cos/sin rows widened to fp32 in an L1 buffer, once for each run of rows that reads
/// the same table row (BSND's N heads of a position): the rotation then loads floats, not
/// converting the table for every head (8 of the 12 conversions per 32 f16 elements of
/// rotate-half). fetch() widens again whenever the table row differs from the one held. The
/// sin row is stored with the sign the rotation would give it (kNegatedSin): negated in its
/// first half for rotate-half, on even lanes for the interleaved mode; that saves a negation per
/// vector of every row that reads it.
template <class Arch, class C>
class WidenedTables {
 public:
  using Element = float;
  static constexpr bool kNegatedSin = true;
  explicit WidenedTables(RotatedMode mode) noexcept : mode_(mode) {}
  void fetch(const C* cos, const C* sin, std::size_t dim) noexcept {
    if (cos == cos_src_ && sin == sin_src_) return;
    cos_src_ = cos;
    sin_src_ = sin;
    const RopeVector<Arch> none(0.f), all(-0.f);
    widen(cos, cos_, 0, dim, none);
    if (mode_ == RotatedMode::rotated_half) {
      widen(sin, sin_, 0, dim / 2, all);
      widen(sin, sin_, dim / 2, dim, none);
    } else {
      widen(sin, sin_, 0, dim, even_signs());
    }
  }
  const float* cos() const noexcept { return cos_; }
  const float* sin() const noexcept { return sin_; }

 private:
  /// dst[i] = src[i] ^ sign for i in [from, to), whole vectors from `from` (the buffers have
  /// room for a partial one at the end, which a later call may overwrite).
  static void widen(const C* src, float* dst, std::size_t from, std::size_t to,
                    RopeVector<Arch> sign) noexcept {
    constexpr std::size_t kLanes = RopeVector<Arch>::size;
    std::size_t i = from;
    for (; i + kLanes <= to; i += kLanes)
      (simd::load<Arch>(src + i) ^ sign).store_unaligned(dst + i);
    if (i < to) (simd::load_chunk<Arch>(src, i, to - i) ^ sign).store_unaligned(dst + i);
  }

  /// -0.0 on even lanes: the sign InterleavedRotation gives sin there.
  static RopeVector<Arch> even_signs() noexcept {
    alignas(64) float lanes[RopeVector<Arch>::size];
    for (std::size_t lane = 0; lane < RopeVector<Arch>::size; ++lane)
      lanes[lane] = lane % 2 ? 0.f : -0.f;
    return RopeVector<Arch>::load_aligned(lanes);
  }

  RotatedMode mode_;
  const C* cos_src_ = nullptr;
  const C* sin_src_ = nullptr;
  // A partial vector at the end of a half may spill kLanes - 1 floats past it.
  alignas(simd::kCacheLineBytes) float cos_[kMaxWidenedDim + 16];
  alignas(simd::kCacheLineBytes) float sin_[kMaxWidenedDim + 16];
};

}  // namespace ditops::rope
