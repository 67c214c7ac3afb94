#pragma once
// Merging the partial results of a row whose keys were split across tasks (split-KV): each
// split s brings its normalized output O_s and its base-2 log-sum-exp L_s; the row's output is
// sum_s 2^(L_s - L) O_s with L = log2(sum_s 2^L_s). Shared by the attention and MLA kernels.
// Kernel sources only (it instantiates SIMD batches per ISA).

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/core/log2_domain.hpp"
#include "ops/core/simd/gaps.hpp"

namespace ditops::core {

/// What a merge leaves besides the weighted sum: the largest L_s and sum_s 2^(L_s - top). The
/// output is the sum divided by total; the base-2 LSE is top + log2(total). total is 0 when no
/// split saw a key (every L_s = -inf).
struct LseWeights {
  float top = kMinusInf;
  float total = 0.f;
};

/// merged[0, n) = sum_s 2^(lse[s * lse_stride] - top) * partial[s * partial_stride + i] for
/// `splits` splits. n is a multiple of 16 (the widest vector); merged is 64-byte aligned.
/// A split with weight 0 is skipped, so an empty split's output is never read.
template <class Arch>
LseWeights merge_by_lse(const float* partial, std::int64_t partial_stride, const float* lse,
                        std::int64_t lse_stride, std::int64_t splits, std::int64_t n,
                        float* merged) noexcept {
  using B = simd::F32<Arch>;
  constexpr std::int64_t kLanes = B::size;
  LseWeights w;
  for (std::int64_t s = 0; s < splits; ++s) w.top = std::max(w.top, lse[s * lse_stride]);
  for (std::int64_t i = 0; i < n; i += kLanes) B(0.f).store_aligned(merged + i);
  if (!(w.top > kMinusInf)) return w;
  for (std::int64_t s = 0; s < splits; ++s) {
    const float weight = std::exp2(lse[s * lse_stride] - w.top);
    if (weight == 0.f) continue;
    w.total += weight;
    const float* part = partial + s * partial_stride;
    for (std::int64_t i = 0; i < n; i += kLanes) {
      simd::fmadd<Arch>(B(weight), B::load_unaligned(part + i), B::load_aligned(merged + i))
          .store_aligned(merged + i);
    }
  }
  return w;
}

}  // namespace ditops::core
