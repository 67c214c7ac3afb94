// Fused RMSNorm + RoPE kernel, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// Memory-bound, as each half alone: a group (one head of D, or a token's N heads) is read from
// memory once for its sum of squares and once more from L1 (a group of 3072 bf16 is 6 KiB) to
// normalize and rotate it, and written once; the unfused pair reads and writes every element
// twice. Rows are rotated by the RoPE kernel's own row code (rotate_half, rotate_interleaved
// in ops/rope/rotation.hpp: pieces along out's cache lines; rows that share lines are staged
// through simd::LineStager when streaming) with x * inv_rms * weight as their input. Each piece
// reads every input it needs before writing its output, so out may be x.

#include "ops/rope/norm_rope_kernel.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "ops/core/arch.hpp"
#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/row_chunks.hpp"
#include "ops/core/simd/streaming.hpp"
#include "ops/rope/rotation.hpp"

namespace ditops::rope {
namespace {

template <class Arch>
using B = simd::F32<Arch>;

/// Sum of the squares of `count` contiguous elements, in two accumulators (two dependency
/// chains) whose lanes are added at the end.
template <class Arch, class T>
float sum_squares(const T* x, std::size_t count) {
  constexpr std::size_t kLanes = B<Arch>::size;
  B<Arch> even(0.f), odd(0.f);
  std::size_t i = 0;
  for (; i + 2 * kLanes <= count; i += 2 * kLanes) {
    const B<Arch> a = simd::load<Arch>(x + i), b = simd::load<Arch>(x + i + kLanes);
    even = simd::fmadd<Arch>(a, a, even);
    odd = simd::fmadd<Arch>(b, b, odd);
  }
  for (; i < count; i += kLanes) {
    const B<Arch> a = simd::load_chunk<Arch>(x, i, std::min(kLanes, count - i));
    even = simd::fmadd<Arch>(a, a, even);
  }
  return simd::reduce_add<Arch>(even + odd);
}

/// Whether a group's fp32 sum of squares cannot give its scale: overflowed (|x| beyond ~1e19),
/// underflowed where eps does not dominate (|x| below ~1e-20), NaN, or mean + eps overflows.
/// Such groups go through normalize_rotate_in_double.
inline bool sum_out_of_range(float sum, float eps, std::size_t count) {
  return !(sum <= 0x1p126f) || (sum < 0x1p-100f && eps < 0x1p-80f) ||
         !(sum / static_cast<float>(count) + eps <= std::numeric_limits<float>::max());
}

/// The normalized values of one row: x * inv_rms (* weight when kWeighted).
template <class Arch, bool kWeighted, class T>
struct Normalized {
  const T* x;
  const float* weight;
  B<Arch> scale;
  B<Arch> operator()(std::size_t i) const noexcept {
    B<Arch> v = simd::load<Arch>(x + i) * scale;
    if constexpr (kWeighted) v *= simd::load<Arch>(weight + i);
    return v;
  }
  /// Elements [i, i + count) (count <= lanes; the other lanes 0).
  B<Arch> chunk(std::size_t i, std::size_t count) const noexcept {
    B<Arch> v = simd::load_chunk<Arch>(x, i, count) * scale;
    if constexpr (kWeighted) v *= simd::load_chunk<Arch>(weight, i, count);
    return v;
  }
};

/// A group whose fp32 sum of squares is out of range, in double, where every float's square
/// fits and 1 / rms may exceed FLT_MAX. Rare, so scalar code; each rotation pair is read before
/// it is written (in place). NaN and infinity propagate as in the vector path.
template <class T, class C>
void normalize_rotate_in_double(const NormRopeProblem& p, const T* x, const C* cos, const C* sin,
                                T* out) {
  const auto dim = static_cast<std::size_t>(p.dim);
  double sum = 0;
  for (std::int64_t h = 0; h < p.heads; ++h) {
    for (std::size_t i = 0; i < dim; ++i) {
      const double v = to_float(x[h * p.head_strides[kNormX] + i]);
      sum += v * v;
    }
  }
  const double inv_rms = 1.0 / std::sqrt(sum / static_cast<double>(p.heads * p.dim) + p.eps);
  const bool half = p.mode == RotatedMode::rotated_half;
  const std::size_t pairs = dim / 2;
  for (std::int64_t h = 0; h < p.heads; ++h) {
    const T* row = x + h * p.head_strides[kNormX];
    const C* cos_row = cos + h * p.head_strides[kNormCos];
    const C* sin_row = sin + h * p.head_strides[kNormSin];
    T* out_row = out + h * p.head_strides[kNormOut];
    const float* weight = p.weight ? p.weight + h * p.dim : nullptr;
    const auto normalized = [&](std::size_t i) {
      const double v = to_float(row[i]) * inv_rms;
      return weight ? v * weight[i] : v;
    };
    for (std::size_t k = 0; k < pairs; ++k) {
      // A rotation pair: i is rotated by -sin, j by +sin.
      const std::size_t i = half ? k : 2 * k, j = half ? k + pairs : 2 * k + 1;
      const double a = normalized(i), b = normalized(j);
      const double rotated_i = a * to_float(cos_row[i]) - b * to_float(sin_row[i]);
      const double rotated_j = b * to_float(cos_row[j]) + a * to_float(sin_row[j]);
      out_row[i] = from_float<T>(static_cast<float>(rotated_i));
      out_row[j] = from_float<T>(static_cast<float>(rotated_j));
    }
  }
}

/// Groups one pass normalizes together: short 16-bit groups (up to 1 KiB) four at a time, so
/// that the four reductions, square roots and divisions overlap instead of each group's rotation
/// waiting on its own (bf16 FLUX q, [1, 4096, 24, 128], 1 thread on AVX2: 18.5 -> 17.1 ms);
/// f32 groups one at a time, which four at a time slowed by 7-15% (as four interleaved rows did
/// RoPE's f32 rows: more streams for the prefetcher to follow). Each group's values do not
/// depend on it.
template <class T>
int groups_per_pass(std::size_t count) noexcept {
  constexpr std::size_t kShortGroupBytes = 1024;
  return sizeof(T) == 2 && count * sizeof(T) <= kShortGroupBytes ? 4 : 1;
}

template <class Arch, bool kWeighted, class T, class C, class Tables>
void norm_rope_typed(const NormRopeProblem& p, std::int64_t begin, std::int64_t end,
                     Tables& tables) {
  constexpr int kMaxPass = 4;
  const auto dim = static_cast<std::size_t>(p.dim);
  const auto count = static_cast<std::size_t>(p.heads * p.dim);
  const int per_pass = groups_per_pass<T>(count);
  core::RowWalker<4> walker(p.groups, begin);
  // Rows (heads) that share cache lines are computed into the stager's buffer and streamed from
  // there; a token's heads follow one another in out, so each completes its predecessor's line.
  simd::LineStager<Arch, T> stager(dim, p.stream);
  for (std::int64_t first = begin; first < end;) {
    const int groups = static_cast<int>(std::min<std::int64_t>(per_pass, end - first));
    const T* xs[kMaxPass];
    T* outs[kMaxPass];
    const C* coss[kMaxPass];
    const C* sins[kMaxPass];
    float sums[kMaxPass];
    for (int g = 0; g < groups; ++g, walker.next()) {
      xs[g] = static_cast<const T*>(p.x) + walker.offset(kNormX);
      outs[g] = static_cast<T*>(p.out) + walker.offset(kNormOut);
      coss[g] = static_cast<const C*>(p.cos) + walker.offset(kNormCos);
      sins[g] = static_cast<const C*>(p.sin) + walker.offset(kNormSin);
      sums[g] = sum_squares<Arch>(xs[g], count);
    }
    float inv_rms[kMaxPass];
    for (int g = 0; g < groups; ++g) {
      inv_rms[g] = 1.f / std::sqrt(sums[g] / static_cast<float>(count) + p.eps);
    }
    for (int g = 0; g < groups; ++g) {
      if (sum_out_of_range(sums[g], p.eps, count)) [[unlikely]] {
        stager.finish();  // its pending line, before this group's rows are written directly
        normalize_rotate_in_double<T, C>(p, xs[g], coss[g], sins[g], outs[g]);
        continue;
      }
      const B<Arch> scale(inv_rms[g]);
      for (std::int64_t h = 0; h < p.heads; ++h) {
        const Normalized<Arch, kWeighted, T> row{xs[g] + h * p.head_strides[kNormX],
                                                 kWeighted ? p.weight + h * p.dim : nullptr, scale};
        T* dst = stager.begin_row(outs[g] + h * p.head_strides[kNormOut]);
        tables.fetch(coss[g] + h * p.head_strides[kNormCos], sins[g] + h * p.head_strides[kNormSin],
                     dim);
        if (p.mode == RotatedMode::rotated_half) {
          rotate_half<Arch, Tables::kNegatedSin>(row, tables.cos(), tables.sin(), dst, dim,
                                                 stager.streams_in_place());
        } else {
          rotate_interleaved<Arch, Tables::kNegatedSin>(row, tables.cos(), tables.sin(), dst, dim,
                                                        stager.streams_in_place());
        }
        stager.end_row();
      }
    }
    first += groups;
  }
  stager.finish();
  if (p.stream) simd::stream_fence<Arch>();
}

template <class Arch, class T, class C, class Tables>
void norm_rope_weighted(const NormRopeProblem& p, std::int64_t begin, std::int64_t end,
                        Tables& tables) {
  if (p.weight) {
    norm_rope_typed<Arch, true, T, C>(p, begin, end, tables);
  } else {
    norm_rope_typed<Arch, false, T, C>(p, begin, end, tables);
  }
}

/// Whether consecutive rows read one cos/sin row: a group's heads (tables broadcast over them),
/// or, one head per group, consecutive groups (tables broadcast along the innermost group dim).
inline bool rows_share_tables(const NormRopeProblem& p) {
  if (p.heads > 1) return p.head_strides[kNormCos] == 0 && p.head_strides[kNormSin] == 0;
  const int inner = p.groups.dims - 1;
  return inner >= 0 && p.groups.shape[inner] > 1 && p.groups.strides[kNormCos][inner] == 0 &&
         p.groups.strides[kNormSin][inner] == 0;
}

/// 16-bit tables that runs of rows share are widened once per run (WidenedTables, as the RoPE
/// kernel does); others are read as they are.
template <class Arch, class T, class C>
void norm_rope_tables(const NormRopeProblem& p, std::int64_t begin, std::int64_t end) {
  if constexpr (!std::is_same_v<C, float>) {
    if (static_cast<std::size_t>(p.dim) <= kMaxWidenedDim && rows_share_tables(p)) {
      WidenedTables<Arch, C> tables(p.mode);
      return norm_rope_weighted<Arch, T, C>(p, begin, end, tables);
    }
  }
  DirectTables<C> tables;
  norm_rope_weighted<Arch, T, C>(p, begin, end, tables);
}

template <class Arch, class T>
void norm_rope_for(const NormRopeProblem& p, std::int64_t begin, std::int64_t end) {
  if (p.table_dtype == DType::f32) {
    norm_rope_tables<Arch, T, float>(p, begin, end);
  } else {
    norm_rope_tables<Arch, T, T>(p, begin, end);
  }
}

}  // namespace

template <class Arch>
void norm_rope_groups(const NormRopeProblem& problem, std::int64_t begin,
                      std::int64_t end) noexcept {
  switch (problem.dtype) {
    case DType::bf16:
      return norm_rope_for<Arch, bf16>(problem, begin, end);
    case DType::f16:
      return norm_rope_for<Arch, f16>(problem, begin, end);
    default:
      return norm_rope_tables<Arch, float, float>(problem, begin, end);
  }
}

template void norm_rope_groups<KernelArch>(const NormRopeProblem&, std::int64_t,
                                           std::int64_t) noexcept;

}  // namespace ditops::rope
