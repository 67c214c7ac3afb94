#pragma once
// The rotations of RoPE on fp32 vectors, for the kernels compiled per ISA level (the RoPE row
// kernel and the fused RMSNorm + RoPE one): one definition of the arithmetic both round alike.

#include <cstdint>

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

}  // namespace ditops::rope
