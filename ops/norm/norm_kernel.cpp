// RMSNorm row kernel, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// Memory-bound: each row is read once from memory and once more from L1 (D <= ~8K floats fit
// L1/L2), so the work per element is a few vector ops. Four accumulators hide the FMA latency
// of the sum of squares (one chain would cap it at one vector per 4 cycles).

#include "ops/norm/norm_kernel.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/core/arch.hpp"
#include "ops/core/simd.hpp"

namespace ditops::norm {
namespace {

template <class Arch, class T>
void norm_rows(const NormProblem& p, std::int64_t begin, std::int64_t end, float* scratch) {
  using B = simd::F32<Arch>;
  constexpr std::size_t kLanes = B::size;
  const auto dim = static_cast<std::size_t>(p.dim);
  const std::size_t unrolled_end = dim - dim % (4 * kLanes);

  core::RowWalker<4> walker(p.rows, begin);
  for (std::int64_t row = begin; row < end; ++row, walker.next()) {
    const T* x = static_cast<const T*>(p.x) + walker.offset(kX);
    T* out = static_cast<T*>(p.out) + walker.offset(kOut);

    // Pass 1: sum of squares (of h = x + residual when fused, storing h on the way).
    B acc0(0.f), acc1(0.f), acc2(0.f), acc3(0.f);
    const float* h_f32 = nullptr;  // fused: h in fp32, which pass 2 normalizes
    if (p.residual) {
      const T* residual = static_cast<const T*>(p.residual) + walker.offset(kResidual);
      T* sum_out = static_cast<T*>(p.sum_out) + walker.offset(kSumOut);
      // An f32 sum_out that stays in cache is h itself; otherwise keep h in scratch (narrow
      // types round h in sum_out; streamed stores leave it in memory).
      float* h =
          std::is_same_v<T, float> && !p.stream ? reinterpret_cast<float*>(sum_out) : scratch;
      simd::for_each_chunk<Arch>(
          sum_out, dim, p.stream, [&](std::size_t i, std::size_t count, bool stream) {
            const B sum =
                simd::load_chunk<Arch>(x, i, count) + simd::load_chunk<Arch>(residual, i, count);
            simd::store_chunk<Arch>(sum_out, i, count, sum, stream);
            if (h != reinterpret_cast<float*>(sum_out))
              simd::store_chunk<Arch>(h, i, count, sum, false);
            acc0 = simd::fmadd<Arch>(sum, sum, acc0);
          });
      h_f32 = h;
    } else {
      for (std::size_t i = 0; i < unrolled_end; i += 4 * kLanes) {
        const B v0 = simd::load<Arch>(x + i);
        const B v1 = simd::load<Arch>(x + i + kLanes);
        const B v2 = simd::load<Arch>(x + i + 2 * kLanes);
        const B v3 = simd::load<Arch>(x + i + 3 * kLanes);
        acc0 = simd::fmadd<Arch>(v0, v0, acc0);
        acc1 = simd::fmadd<Arch>(v1, v1, acc1);
        acc2 = simd::fmadd<Arch>(v2, v2, acc2);
        acc3 = simd::fmadd<Arch>(v3, v3, acc3);
      }
      for (std::size_t i = unrolled_end; i < dim; i += kLanes) {
        const B v = simd::load_chunk<Arch>(x, i, std::min(kLanes, dim - i));
        acc1 = simd::fmadd<Arch>(v, v, acc1);
      }
    }
    const float sum_squares = simd::reduce_add<Arch>((acc0 + acc1) + (acc2 + acc3));
    if (!(sum_squares <= 0x1p126f) || (sum_squares < 0x1p-100f && p.eps < 0x1p-80f)) {
      // The fp32 sum of squares overflowed (|x| beyond ~1e19), underflowed where eps does not
      // dominate (|x| below ~1e-20), or is NaN: this row again in double, where every float's
      // square fits, scaled in double too (1 / rms may exceed FLT_MAX). Such rows are rare, so
      // scalar code; NaN and infinity propagate as in the vector path.
      double sum = 0;
      for (std::size_t i = 0; i < dim; ++i) {
        const double v = h_f32 ? h_f32[i] : static_cast<double>(to_float(x[i]));
        sum += v * v;
      }
      const double inv_rms_wide = 1.0 / std::sqrt(sum / static_cast<double>(dim) + p.eps);
      for (std::size_t i = 0; i < dim; ++i) {
        double y = (h_f32 ? h_f32[i] : static_cast<double>(to_float(x[i]))) * inv_rms_wide;
        if (p.weight) y *= p.weight[i];
        out[i] = from_float<T>(static_cast<float>(y));
      }
      continue;
    }
    const float inv_rms = 1.f / std::sqrt(sum_squares / static_cast<float>(dim) + p.eps);

    // Pass 2: scale (and weight) the row, now in L1, while prefetching the next row's inputs:
    // pass 1 of that row then finds them in cache instead of waiting on memory, and this
    // pass's arithmetic overlaps the transfer. Rows under 1 KiB are left to the hardware
    // prefetcher, which follows consecutive short rows well (measured: prefetching there cost
    // ~20% at D = 128 f32).
    const B scale(inv_rms);
    const T* next_x = nullptr;
    const T* next_residual = nullptr;
    if (row + 1 < end && dim * sizeof(T) >= 1024) {
      core::RowWalker<4> next = walker;
      next.next();
      next_x = static_cast<const T*>(p.x) + next.offset(kX);
      if (p.residual) next_residual = static_cast<const T*>(p.residual) + next.offset(kResidual);
    }
    simd::for_each_chunk<Arch>(out, dim, p.stream,
                               [&](std::size_t i, std::size_t count, bool stream) {
                                 if (next_x) simd::prefetch(next_x + i);
                                 if (next_residual) simd::prefetch(next_residual + i);
                                 B y = (h_f32 ? simd::load_chunk<Arch>(h_f32, i, count)
                                              : simd::load_chunk<Arch>(x, i, count)) *
                                       scale;
                                 if (p.weight) y = y * simd::load_chunk<Arch>(p.weight, i, count);
                                 simd::store_chunk<Arch>(out, i, count, y, stream);
                               });
  }
  if (p.stream) simd::stream_fence<Arch>();
}

}  // namespace

template <class Arch>
void rms_norm_rows(const NormProblem& problem, std::int64_t begin, std::int64_t end,
                   float* scratch) noexcept {
  switch (problem.dtype) {
    case DType::bf16:
      return norm_rows<Arch, bf16>(problem, begin, end, scratch);
    case DType::f16:
      return norm_rows<Arch, f16>(problem, begin, end, scratch);
    default:
      return norm_rows<Arch, float>(problem, begin, end, scratch);
  }
}

template void rms_norm_rows<KernelArch>(const NormProblem&, std::int64_t, std::int64_t,
                                        float*) noexcept;

}  // namespace ditops::norm
