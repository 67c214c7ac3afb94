// RMSNorm and LayerNorm row kernels, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// Memory-bound: each row is read once from memory and once more from L1 (D <= ~8K floats fit
// L1/L2), so the work per element must stay a few vector ops or the conversions of 16-bit types
// show. Short rows go several per pass (rows_per_pass): their reductions, square roots and
// divisions overlap instead of each row's second pass waiting on its own. Results are stored two
// vectors at a time (bf16 packs a pair in one store) and, for outputs far beyond the caches, with
// streaming stores.
//
// Plain RMSNorm of short contiguous f32 rows (q/k norms: D = 64, 128) has a path of its own on
// AVX2 (FramedRows): aligned vectors whatever the buffers' offset, and x prefetched 1 KiB ahead.
// Measured on an AMD EPYC Zen 3 (2 cores, shared with other work), [98304, 128] with weight, one
// thread, medians of alternating runs: while other work loaded the memory, 16 bytes past a line
// 13.0 ms through the path above (loads across lines, streamed rows staged), 10.6 in the frame
// without prefetching, 7.9 with it, line-aligned 9.9 -> 7.8 (ONNX Runtime ~10.3); on a quiet
// machine all of them ~7.5 ms.

#include "ops/norm/norm_kernel.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/core/arch.hpp"
#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/partial.hpp"
#include "ops/core/simd/row_chunks.hpp"
#include "ops/core/simd/streaming.hpp"

namespace ditops::norm {
namespace {

template <class Arch>
using B = simd::F32<Arch>;

/// The operands of one row (residual and sum_out only when fused).
template <class T>
struct RowOperands {
  const T* x;
  const T* residual;
  T* out;
  T* sum_out;
};

/// Reduces one row of x to a float: step(acc, v, i) folds each vector v (elements from i) into
/// one of two accumulators (two dependency chains), whose lanes are summed at the end. A partial
/// last vector holds `fill` in its missing lanes, which step must count as 0.
template <class Arch, class T, class Step>
float reduce_row(const T* x, std::size_t dim, float fill, const Step& step) {
  constexpr std::size_t kLanes = B<Arch>::size;
  B<Arch> even(0.f), odd(0.f);
  std::size_t i = 0;
  for (; i + 2 * kLanes <= dim; i += 2 * kLanes) {
    even = step(even, simd::load<Arch>(x + i), i);
    odd = step(odd, simd::load<Arch>(x + i + kLanes), i + kLanes);
  }
  // Less than two vectors left: one (maybe partial), then maybe a partial one.
  const auto piece = [&](std::size_t at) {
    const std::size_t count = std::min(kLanes, dim - at);
    return count < kLanes ? simd::load_partial<Arch>(x + at, count, fill)
                          : simd::load<Arch>(x + at);
  };
  if (i < dim) {
    even = step(even, piece(i), i);
    if (i + kLanes < dim) odd = step(odd, piece(i + kLanes), i + kLanes);
  }
  return simd::reduce_add<Arch>(even + odd);
}

/// Sum of the squares of one row of x.
template <class Arch, class T>
float sum_squares(const T* x, std::size_t dim) {
  return reduce_row<Arch>(x, dim, 0.f, [](B<Arch> acc, B<Arch> v, std::size_t) {
    return simd::fmadd<Arch>(v, v, acc);
  });
}

/// Fused pass 1 of one row: h = x + residual to sum_out (rounded to T) and, when `h` is another
/// buffer, to h in fp32 for pass 2. Its sum of squares is taken from h afterwards (in L1), not on
/// the way: the pieces here follow sum_out's cache lines, and a sum split along them would round
/// differently wherever sum_out starts.
template <class Arch, class T>
void add_row(const RowOperands<T>& row, std::size_t dim, bool stream, float* h, bool h_is_sum_out) {
  constexpr std::size_t kLanes = B<Arch>::size;
  simd::for_each_piece<Arch>(
      row.sum_out, dim, stream,
      [&](std::size_t i, auto whole_lines) {
        const B<Arch> a = simd::load<Arch>(row.x + i) + simd::load<Arch>(row.residual + i);
        const B<Arch> b =
            simd::load<Arch>(row.x + i + kLanes) + simd::load<Arch>(row.residual + i + kLanes);
        simd::store_pair<Arch>(row.sum_out + i, a, b, whole_lines);
        if (!h_is_sum_out) simd::store_pair<Arch>(h + i, a, b, false);
      },
      [&](std::size_t i, std::size_t count, auto whole_line) {
        const B<Arch> a = simd::load_chunk<Arch>(row.x, i, count) +
                          simd::load_chunk<Arch>(row.residual, i, count);
        simd::store_chunk<Arch>(row.sum_out, i, count, a, whole_line);
        if (!h_is_sum_out) simd::store_chunk<Arch>(h, i, count, a, false);
      });
}

/// Pass 2 of one row: out = src * inv_rms (* weight when kWeighted). src is x, or h in fp32 when
/// fused. With kPrefetch (long rows), the next row's inputs (next_x, and next_residual unless
/// null) are prefetched on the way: its pass 1 then finds them in cache, and this pass's
/// arithmetic overlaps the transfer. Rows under 1 KiB are left to the hardware prefetcher, which
/// follows consecutive short rows well (measured: prefetching there cost ~20% at D = 128 f32).
/// kMayBeNaN false: the row and the weight are finite, so the results hold no NaN. The options
/// are template parameters so the loop tests none of them per piece.
template <class Arch, bool kWeighted, bool kPrefetch, bool kMayBeNaN, class T, class S>
void scale_row(const S* src, T* out, const float* weight, float inv_rms, std::size_t dim,
               bool stream, const T* next_x, const T* next_residual) {
  constexpr std::size_t kLanes = B<Arch>::size;
  const B<Arch> scale(inv_rms);
  simd::for_each_piece<Arch>(
      out, dim, stream,
      [&](std::size_t i, auto whole_lines) {
        if constexpr (kPrefetch) {
          simd::prefetch(next_x + i);
          simd::prefetch(next_x + i + kLanes);
          if (next_residual) {
            simd::prefetch(next_residual + i);
            simd::prefetch(next_residual + i + kLanes);
          }
        }
        B<Arch> a = simd::load<Arch>(src + i) * scale;
        B<Arch> b = simd::load<Arch>(src + i + kLanes) * scale;
        if constexpr (kWeighted) {
          a *= simd::load<Arch>(weight + i);
          b *= simd::load<Arch>(weight + i + kLanes);
        }
        simd::store_pair<Arch, T, kMayBeNaN>(out + i, a, b, whole_lines);
      },
      [&](std::size_t i, std::size_t count, auto whole_line) {
        if constexpr (kPrefetch) {
          simd::prefetch(next_x + i);
          if (next_residual) simd::prefetch(next_residual + i);
        }
        B<Arch> y = simd::load_chunk<Arch>(src, i, count) * scale;
        if constexpr (kWeighted) y *= simd::load_chunk<Arch>(weight, i, count);
        simd::store_chunk<Arch>(out, i, count, y, whole_line);
      });
}

/// Whether a row's fp32 sum of squares (of x; for LayerNorm, of its deviations from the mean)
/// cannot give its scale: it overflowed (|x| beyond ~1e19), underflowed where eps does not
/// dominate (|x| below ~1e-20; the output would be inf or NaN), is NaN, or its mean plus eps
/// overflows (eps near FLT_MAX: the output would be 0).
inline bool sum_out_of_range(float sum, float eps, std::size_t dim) {
  return !(sum <= 0x1p126f) || (sum < 0x1p-100f && eps < 0x1p-80f) ||
         !(sum / static_cast<float>(dim) + eps <= std::numeric_limits<float>::max());
}

/// Such a row again in double, where every float's square fits, scaled in double too (1 / rms
/// may exceed FLT_MAX). Rare rows, so scalar code; NaN and infinity propagate as in the vector
/// path. src: x, or h in fp32 when fused.
template <class T, class S>
void normalize_row_in_double(const S* src, T* out, const float* weight, float eps,
                             std::size_t dim) {
  double sum = 0;
  for (std::size_t i = 0; i < dim; ++i) {
    const double v = to_float(src[i]);
    sum += v * v;
  }
  const double inv_rms = 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
  for (std::size_t i = 0; i < dim; ++i) {
    double y = to_float(src[i]) * inv_rms;
    if (weight) y *= weight[i];
    out[i] = from_float<T>(static_cast<float>(y));
  }
}

/// scale_row with the options of this row chosen once (kMayBeNaN matters to bf16 only).
template <class Arch, bool kMayBeNaN, class T, class S>
void scale_row(const S* src, T* out, const float* weight, float inv_rms, std::size_t dim,
               bool stream, const T* next_x, const T* next_residual) {
  if (weight && next_x) {
    scale_row<Arch, true, true, kMayBeNaN>(src, out, weight, inv_rms, dim, stream, next_x,
                                           next_residual);
  } else if (weight) {
    scale_row<Arch, true, false, kMayBeNaN>(src, out, weight, inv_rms, dim, stream, next_x,
                                            next_residual);
  } else if (next_x) {
    scale_row<Arch, false, true, kMayBeNaN>(src, out, weight, inv_rms, dim, stream, next_x,
                                            next_residual);
  } else {
    scale_row<Arch, false, false, kMayBeNaN>(src, out, weight, inv_rms, dim, stream, next_x,
                                             next_residual);
  }
}

template <class Arch, class T, class S>
void scale_row(const S* src, T* out, const float* weight, float inv_rms, std::size_t dim,
               bool stream, const T* next_x, const T* next_residual, bool may_be_nan) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (!may_be_nan) {
      return scale_row<Arch, false>(src, out, weight, inv_rms, dim, stream, next_x, next_residual);
    }
  }
  scale_row<Arch, true>(src, out, weight, inv_rms, dim, stream, next_x, next_residual);
}

/// Where the outputs of rows go: sum_out (the fused residual sum) and out, each through its own
/// stager (rows that share cache lines are streamed from its buffer).
template <class Arch, class T>
struct RowTargets {
  simd::LineStager<Arch, T> sum_out, out;
  RowTargets(std::size_t dim, const NormProblem& p)
      : sum_out(dim, p.stream && p.residual), out(dim, p.stream) {}
};

/// Normalizes the Rows rows at the walker and moves it past them; `more_rows`: rows follow in
/// this thread's range (worth prefetching for long rows).
template <class Arch, class T, int Rows>
void normalize_rows(const NormProblem& p, core::RowWalker<4>& walker, bool more_rows,
                    float* scratch, RowTargets<Arch, T>& targets) {
  const auto dim = static_cast<std::size_t>(p.dim);
  RowOperands<T> rows[Rows];
  for (int r = 0; r < Rows; ++r, walker.next()) {
    rows[r].x = static_cast<const T*>(p.x) + walker.offset(kX);
    rows[r].out = static_cast<T*>(p.out) + walker.offset(kOut);
    if (p.residual) {
      rows[r].residual = static_cast<const T*>(p.residual) + walker.offset(kResidual);
      rows[r].sum_out = static_cast<T*>(p.sum_out) + walker.offset(kSumOut);
    }
  }

  // Pass 1: sums of squares (of h = x + residual when fused, storing h on the way). An f32
  // sum_out that stays in cache is h itself; otherwise h goes to scratch (narrow types round h
  // in sum_out; streamed stores leave it in memory).
  float sums[Rows];
  const bool h_is_sum_out = std::is_same_v<T, float> && !p.stream;
  const auto h_of = [&](int r) {
    return h_is_sum_out ? reinterpret_cast<float*>(rows[r].sum_out) : scratch + r * dim;
  };
  // The rows are read one after the other, in memory order (interleaving short rows vector by
  // vector measured ~15% slower at D = 128 f32: the hardware prefetcher follows one stream).
  for (int r = 0; r < Rows; ++r) {
    if (p.residual) {
      RowOperands<T> row = rows[r];
      row.sum_out = targets.sum_out.begin_row(rows[r].sum_out);
      add_row<Arch>(row, dim, targets.sum_out.streams_in_place(), h_of(r), h_is_sum_out);
      targets.sum_out.end_row();
      sums[r] = sum_squares<Arch>(h_of(r), dim);
    } else {
      sums[r] = sum_squares<Arch>(rows[r].x, dim);
    }
  }
  float inv_rms[Rows];
  for (int r = 0; r < Rows; ++r) {
    inv_rms[r] = 1.f / std::sqrt(sums[r] / static_cast<float>(dim) + p.eps);
  }

  // Pass 2: scale (and weight) each row, now in L1.
  const T* next_x = nullptr;
  const T* next_residual = nullptr;
  if (more_rows && dim * sizeof(T) >= 1024) {
    next_x = static_cast<const T*>(p.x) + walker.offset(kX);
    if (p.residual) next_residual = static_cast<const T*>(p.residual) + walker.offset(kResidual);
  }
  for (int r = 0; r < Rows; ++r) {
    T* out = targets.out.begin_row(rows[r].out);
    const bool stream = targets.out.streams_in_place();
    if (sum_out_of_range(sums[r], p.eps, dim)) {
      if (p.residual) {
        normalize_row_in_double(static_cast<const float*>(h_of(r)), out, p.weight, p.eps, dim);
      } else {
        normalize_row_in_double(rows[r].x, out, p.weight, p.eps, dim);
      }
    } else if (p.residual) {  // in range: the row is finite
      scale_row<Arch>(static_cast<const float*>(h_of(r)), out, p.weight, inv_rms[r], dim, stream,
                      next_x, next_residual, !p.weight_finite);
    } else {
      scale_row<Arch>(rows[r].x, out, p.weight, inv_rms[r], dim, stream, next_x, next_residual,
                      !p.weight_finite);
    }
    targets.out.end_row();
  }
}

template <class Arch, class T, int Rows>
void norm_rows(const NormProblem& p, std::int64_t begin, std::int64_t end, float* scratch) {
  core::RowWalker<4> walker(p.rows, begin);
  RowTargets<Arch, T> targets(static_cast<std::size_t>(p.dim), p);
  std::int64_t row = begin;
  for (; row + Rows <= end; row += Rows) {
    normalize_rows<Arch, T, Rows>(p, walker, row + Rows < end, scratch, targets);
  }
  for (; row < end; ++row) normalize_rows<Arch, T, 1>(p, walker, row + 1 < end, scratch, targets);
  targets.sum_out.finish();
  targets.out.finish();
  if (p.stream) simd::stream_fence<Arch>();
}

// ---- short f32 rows in the output's vector frame (AVX2) ---------------------------------------
//
// Short rows that do not start on a vector boundary (D = 128 f32 rows 16 bytes past a line, as
// malloc and numpy place large arrays) cost up to a quarter more than aligned ones through the path
// above: every other load splits across two lines (pass 1 from memory, pass 2 from L1), and
// streamed rows go through LineStager's copy. When x and out share their offset within a vector
// and their rows follow one another, both are walked instead in aligned vectors, the vector
// where two rows meet holding the end of one and the start of the next: no load splits, every
// whole vector is stored (or streamed) in place, and only the first and the last vector of a
// thread's range are partial. A row's two accumulators of squares then hold those of the
// aligned run rotated by the offset, lane for lane with the same terms in the same order: their
// sum is rotated back before its lanes are added, and the weight is rotated alike, so that the
// results are bit for bit those of the aligned run. Pass 1 prefetches x well ahead (unlike the
// path above: a prefetch of just the next row only duplicates the hardware prefetcher's).

template <class Arch>
inline constexpr bool kHasVectorFrame = simd::kIsAvx2<Arch> && !simd::kIsAvx512<Arch>;

/// Whether the rows of `operand` follow one another in memory (row r at r * dim elements).
template <class Arch>  // a template: only AVX2 uses it (clang flags unused internal functions)
bool rows_contiguous(const core::RowLayout& rows, int operand, std::int64_t dim) {
  std::int64_t expected = dim;
  for (int d = rows.dims - 1; d >= 0; --d) {
    if (rows.shape[d] != 1 && rows.strides[operand][d] != expected) return false;
    expected *= rows.shape[d];
  }
  return true;
}

/// Whether FramedRows runs the problem: plain RMSNorm of f32 rows of whole vector pairs that a
/// 4-row pass takes, x and out contiguous and at the same offset within a vector (0 included:
/// aligned rows take the frame's tighter loop and its prefetching too).
template <class Arch>  // a template for the reason rows_contiguous is
bool runs_framed(const NormProblem& p) {
  constexpr std::uintptr_t kVectorBytes = 32;
  const auto x = reinterpret_cast<std::uintptr_t>(p.x);
  const auto out = reinterpret_cast<std::uintptr_t>(p.out);
  return p.dtype == DType::f32 && !p.residual && p.dim % 16 == 0 &&
         rows_per_pass(p.dim, p.dtype) == 4 && x % kVectorBytes == out % kVectorBytes &&
         out % sizeof(float) == 0 && rows_contiguous<Arch>(p.rows, kX, p.dim) &&
         rows_contiguous<Arch>(p.rows, kOut, p.dim);
}

/// Rows [begin, end) of a runs_framed problem, in aligned vectors of 8 floats.
template <class Arch, bool kWeighted, bool kStream>
class FramedRows {
 public:
  static constexpr std::size_t kMaxDim = 256;  // rows_per_pass's short f32 rows
  static constexpr std::size_t kCacheLineFloats = simd::kCacheLineBytes / sizeof(float);
  /// How far ahead of pass 1 x is prefetched. Measured on Zen 3 (AVX2), [98304, 128] f32, one
  /// thread, memory loaded by other work: 512 B ahead 0.93x the time without, 1 KiB 0.78x,
  /// 2 KiB 0.85x.
  static constexpr std::size_t kPrefetchBytes = 1024;

  FramedRows(const NormProblem& p, std::int64_t begin, std::int64_t end) noexcept
      : p_(p),
        dim_(static_cast<std::size_t>(p.dim)),
        rows_(static_cast<std::size_t>(end - begin)),
        x_(static_cast<const float*>(p.x) + begin * p.dim),
        out_(static_cast<float*>(p.out) + begin * p.dim) {
    const auto start = reinterpret_cast<std::uintptr_t>(out_) % 32;
    shift_ = static_cast<int>(start / sizeof(float));
    frame_x_ = reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(x_) - start);
    frame_out_ = reinterpret_cast<float*>(reinterpret_cast<std::uintptr_t>(out_) - start);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i shift = _mm256_set1_epi32(shift_);
    before_ = _mm256_cmpgt_epi32(shift, lane);  // the lanes of a vector before a row starts
    from_ = _mm256_xor_si256(before_, _mm256_set1_epi32(-1));
    unrotate_ = _mm256_and_si256(_mm256_add_epi32(lane, shift), _mm256_set1_epi32(7));
    if constexpr (kWeighted) {
      const auto shift_elements = static_cast<std::size_t>(shift_);
      for (std::size_t j = 0; j < dim_; ++j) {
        weight_[j] = p.weight[(j + dim_ - shift_elements) % dim_];
      }
    }
  }

  /// Normalizes the Rows rows from `row` (in the range): sums, then scales.
  template <int Rows>
  void normalize(std::size_t row) noexcept {
    float sums[Rows], inv_rms[Rows];
    for (int r = 0; r < Rows; ++r) sums[r] = sum_squares(row + r);
    for (int r = 0; r < Rows; ++r) {
      inv_rms[r] = 1.f / std::sqrt(sums[r] / static_cast<float>(dim_) + p_.eps);
    }
    for (int r = 0; r < Rows; ++r) {
      // A row out of range is computed in double before any of it is written (x may be out).
      const bool redo_this = sum_out_of_range(sums[r], p_.eps, dim_);
      if (redo_this) {
        normalize_row_in_double(x_ + (row + r) * dim_, redone_[(row + r) % 2], p_.weight, p_.eps,
                                dim_);
      }
      scale(row + r, inv_rms[r]);
      if (redo_this) redo_row_ = row + r + 1;
    }
  }

  /// Writes the end of the range's last row (its last vector, partial) and redoes that row if it
  /// must be. Then fences the streaming stores.
  void finish() noexcept {
    const std::size_t at = rows_ * dim_;
    const B<Arch> v = _mm256_maskload_ps(frame_x_ + at, before_);
    _mm256_maskstore_ps(frame_out_ + at, before_, product(v, B<Arch>(previous_scale_), 0));
    redo();
    if constexpr (kStream) simd::stream_fence<Arch>();
  }

 private:
  /// Sum of the squares of a row, as reduce_row adds them for the row on an aligned address.
  float sum_squares(std::size_t row) const noexcept {
    const float* x = frame_x_ + row * dim_;
    // The row kPrefetchBytes ahead, a line at a time: the hardware prefetcher alone leaves
    // one thread's stream of short rows short of the memory's bandwidth.
    for (std::size_t i = 0; i < dim_; i += kCacheLineFloats) {
      simd::prefetch(x + i + kPrefetchBytes / sizeof(float));
    }
    const B<Arch> head = row == 0
                             ? _mm256_maskload_ps(x, from_)  // nothing before the range
                             : _mm256_and_ps(B<Arch>::load_aligned(x), _mm256_castsi256_ps(from_));
    const B<Arch> tail =
        row + 1 == rows_
            ? _mm256_maskload_ps(x + dim_, before_)  // nothing past it
            : _mm256_and_ps(B<Arch>::load_aligned(x + dim_), _mm256_castsi256_ps(before_));
    // Vectors 0, 2, ... and dim / 8 (of the vector pairs in the frame) in one accumulator, the
    // odd ones in the other; dim / 8 is even.
    B<Arch> even = simd::fmadd<Arch>(head, head, B<Arch>(0.f)), odd(0.f);
    std::size_t i = 8;
    for (; i + 8 < dim_; i += 16) {
      const B<Arch> a = B<Arch>::load_aligned(x + i), b = B<Arch>::load_aligned(x + i + 8);
      odd = simd::fmadd<Arch>(a, a, odd);
      even = simd::fmadd<Arch>(b, b, even);
    }
    const B<Arch> last = B<Arch>::load_aligned(x + i);
    odd = simd::fmadd<Arch>(last, last, odd);
    even = simd::fmadd<Arch>(tail, tail, even);
    const B<Arch> sum = even + odd;
    return simd::reduce_add<Arch>(B<Arch>(_mm256_permutevar8x32_ps(sum, unrotate_)));
  }

  /// v * scale, times the weight's vector k in the frame.
  B<Arch> product(B<Arch> v, B<Arch> scale, std::size_t k) const noexcept {
    B<Arch> y = v * scale;
    if constexpr (kWeighted) y *= B<Arch>::load_aligned(weight_ + 8 * k);
    return y;
  }

  static void store(float* dst, B<Arch> v) noexcept {
    if constexpr (kStream) {
      _mm256_stream_ps(dst, v);
    } else {
      v.store_aligned(dst);
    }
  }

  /// Writes a row but the part of its last vector that the next row shares.
  void scale(std::size_t row, float inv_rms) noexcept {
    const float* x = frame_x_ + row * dim_;
    float* out = frame_out_ + row * dim_;
    const B<Arch> row_scale(inv_rms);
    if (row == 0) {
      _mm256_maskstore_ps(out, from_, product(_mm256_maskload_ps(x, from_), row_scale, 0));
    } else {
      const B<Arch> scales =
          _mm256_blendv_ps(B<Arch>(previous_scale_), row_scale, _mm256_castsi256_ps(from_));
      store(out, product(B<Arch>::load_aligned(x), scales, 0));
    }
    redo();  // the previous row is complete
    for (std::size_t k = 1; k < dim_ / 8; ++k) {
      store(out + 8 * k, product(B<Arch>::load_aligned(x + 8 * k), row_scale, k));
    }
    previous_scale_ = inv_rms;
  }

  /// Overwrites a complete row whose sum of squares was out of range with its results in
  /// double (after the streaming stores of what it replaces).
  void redo() noexcept {
    if (redo_row_ == 0) return;
    if constexpr (kStream) simd::stream_fence<Arch>();
    const std::size_t row = redo_row_ - 1;
    std::memcpy(out_ + row * dim_, redone_[row % 2], dim_ * sizeof(float));
    redo_row_ = 0;
  }

  const NormProblem& p_;
  std::size_t dim_, rows_;
  const float* x_;  ///< the range's first row
  float* out_;
  int shift_ = 0;         ///< lanes from the vector boundary before a row to its start
  const float* frame_x_;  ///< the vector boundary before x_
  float* frame_out_;
  __m256i before_, from_, unrotate_;
  float previous_scale_ = 0.f;
  std::size_t redo_row_ = 0;  ///< 1 + the row to overwrite once complete (0: none)
  float redone_[2][kMaxDim];  ///< rows out of range in double, by parity (one may be pending)
  alignas(32) float weight_[kWeighted ? kMaxDim : 8];
};

template <class Arch, bool kWeighted, bool kStream>
void rms_norm_framed(const NormProblem& p, std::int64_t begin, std::int64_t end) {
  FramedRows<Arch, kWeighted, kStream> rows(p, begin, end);
  const auto count = static_cast<std::size_t>(end - begin);
  std::size_t row = 0;
  for (; row + 4 <= count; row += 4) rows.template normalize<4>(row);
  for (; row < count; ++row) rows.template normalize<1>(row);
  rows.finish();
}

template <class Arch>
void rms_norm_framed(const NormProblem& p, std::int64_t begin, std::int64_t end) {
  if (p.weight && p.stream) return rms_norm_framed<Arch, true, true>(p, begin, end);
  if (p.weight) return rms_norm_framed<Arch, true, false>(p, begin, end);
  if (p.stream) return rms_norm_framed<Arch, false, true>(p, begin, end);
  rms_norm_framed<Arch, false, false>(p, begin, end);
}

template <class Arch, class T>
void norm_rows_by_length(const NormProblem& p, std::int64_t begin, std::int64_t end,
                         float* scratch) {
  if constexpr (std::is_same_v<T, float> && kHasVectorFrame<Arch>) {
    if (runs_framed<Arch>(p)) return rms_norm_framed<Arch>(p, begin, end);
  }
  if (rows_per_pass(p.dim, p.dtype) == 4) {
    norm_rows<Arch, T, 4>(p, begin, end, scratch);
  } else {
    norm_rows<Arch, T, 1>(p, begin, end, scratch);
  }
}

// ---- LayerNorm and AdaLN ----------------------------------------------------------------------
//
// Three passes over each row: its sum (read from memory; a 16-bit row is widened into floats
// in scratch on the way, so that the other passes do not convert it again), the sum of squared
// deviations from the mean (from L1; two-pass, since E[x^2] - mean^2 cancels catastrophically
// for rows whose mean is large beside their spread), and the output (from L1). With modulation
// broadcast over the sequence, weight * (1 + scale) and bias * (1 + scale) + shift are folded once
// per batch element, so every row costs what plain LayerNorm costs; per-token scale and shift rows
// are streamed and applied per element.

/// Sum of one row of x. With `copy` (narrow T), the row is also stored there as floats, whole
/// vectors (copy holds D rounded up to a cache line, aligned): the later passes read floats from
/// L1 instead of converting every element twice more.
template <class Arch, class T>
float row_sum(const T* x, std::size_t dim, float* copy) {
  if (!copy) {
    return reduce_row<Arch>(x, dim, 0.f,
                            [](B<Arch> acc, B<Arch> v, std::size_t) { return acc + v; });
  }
  return reduce_row<Arch>(x, dim, 0.f, [&](B<Arch> acc, B<Arch> v, std::size_t i) {
    v.store_aligned(copy + i);
    return acc + v;
  });
}

/// Sum of the squared deviations of one row from `mean`.
template <class Arch>
float centered_sum_squares(const float* row, std::size_t dim, float mean) {
  const B<Arch> center(mean);
  return reduce_row<Arch>(row, dim, mean, [&](B<Arch> acc, B<Arch> v, std::size_t) {
    const B<Arch> deviation = v - center;
    return simd::fmadd<Arch>(deviation, deviation, acc);
  });
}

/// t * gain + offset over elements [i, i + count) of the D-float gain and offset (either may be
/// left out: kGain, kOffset).
template <class Arch, bool kGain, bool kOffset>
B<Arch> apply_affine(B<Arch> t, const float* gain, const float* offset, std::size_t i,
                     std::size_t count) {
  if constexpr (kGain && kOffset) {
    return simd::fmadd<Arch>(t, simd::load_chunk<Arch>(gain, i, count),
                             simd::load_chunk<Arch>(offset, i, count));
  } else if constexpr (kGain) {
    return t * simd::load_chunk<Arch>(gain, i, count);
  } else if constexpr (kOffset) {
    return t + simd::load_chunk<Arch>(offset, i, count);
  } else {
    return t;
  }
}

/// Pass 3 of a row (x, or its floats): out = (x - mean) * inv_std * gain + offset. gain and
/// offset are the weight and the bias, or their fold with a broadcast scale and shift.
/// Prefetching, kMayBeNaN and the options as in scale_row.
template <class Arch, bool kGain, bool kOffset, bool kPrefetch, bool kMayBeNaN, class T>
void normalize_affine_row(const float* x, T* out, const float* gain, const float* offset,
                          float mean, float inv_std, std::size_t dim, bool stream,
                          const T* next_x) {
  constexpr std::size_t kLanes = B<Arch>::size;
  const B<Arch> center(mean), scale(inv_std);
  simd::for_each_piece<Arch>(
      out, dim, stream,
      [&](std::size_t i, auto whole_lines) {
        if constexpr (kPrefetch) {
          simd::prefetch(next_x + i);
          simd::prefetch(next_x + i + kLanes);
        }
        const B<Arch> a = (simd::load<Arch>(x + i) - center) * scale;
        const B<Arch> b = (simd::load<Arch>(x + i + kLanes) - center) * scale;
        simd::store_pair<Arch, T, kMayBeNaN>(
            out + i, apply_affine<Arch, kGain, kOffset>(a, gain, offset, i, kLanes),
            apply_affine<Arch, kGain, kOffset>(b, gain, offset, i + kLanes, kLanes), whole_lines);
      },
      [&](std::size_t i, std::size_t count, auto whole_line) {
        if constexpr (kPrefetch) simd::prefetch(next_x + i);
        const B<Arch> t = (simd::load_chunk<Arch>(x, i, count) - center) * scale;
        simd::store_chunk<Arch>(out, i, count,
                                apply_affine<Arch, kGain, kOffset>(t, gain, offset, i, count),
                                whole_line);
      });
}

/// normalize_affine_row with the options of this row chosen once.
template <class Arch, bool kPrefetch, bool kMayBeNaN, class T>
void normalize_affine_row(const float* x, T* out, const float* gain, const float* offset,
                          float mean, float inv_std, std::size_t dim, bool stream,
                          const T* next_x) {
  if (gain && offset) {
    normalize_affine_row<Arch, true, true, kPrefetch, kMayBeNaN>(x, out, gain, offset, mean,
                                                                 inv_std, dim, stream, next_x);
  } else if (gain) {
    normalize_affine_row<Arch, true, false, kPrefetch, kMayBeNaN>(x, out, gain, offset, mean,
                                                                  inv_std, dim, stream, next_x);
  } else if (offset) {
    normalize_affine_row<Arch, false, true, kPrefetch, kMayBeNaN>(x, out, gain, offset, mean,
                                                                  inv_std, dim, stream, next_x);
  } else {
    normalize_affine_row<Arch, false, false, kPrefetch, kMayBeNaN>(x, out, gain, offset, mean,
                                                                   inv_std, dim, stream, next_x);
  }
}

template <class Arch, class T>
void normalize_affine_row(const float* x, T* out, const float* gain, const float* offset,
                          float mean, float inv_std, std::size_t dim, bool stream, const T* next_x,
                          bool may_be_nan) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (!may_be_nan) {
      if (next_x) {
        return normalize_affine_row<Arch, true, false>(x, out, gain, offset, mean, inv_std, dim,
                                                       stream, next_x);
      }
      return normalize_affine_row<Arch, false, false>(x, out, gain, offset, mean, inv_std, dim,
                                                      stream, next_x);
    }
  }
  if (next_x) {
    return normalize_affine_row<Arch, true, true>(x, out, gain, offset, mean, inv_std, dim, stream,
                                                  next_x);
  }
  normalize_affine_row<Arch, false, true>(x, out, gain, offset, mean, inv_std, dim, stream, next_x);
}

/// Pass 3 of a row with its own scale and shift rows (per-token modulation):
/// out = ((x - mean) * inv_std * weight + bias) * (1 + scale) + shift.
template <class Arch, bool kPrefetch, class T, class S>
void normalize_modulated_row(const float* x, T* out, const float* weight, const float* bias,
                             const S* scale_row, const S* shift_row, float mean, float inv_std,
                             std::size_t dim, bool stream, const T* next_x) {
  constexpr std::size_t kLanes = B<Arch>::size;
  const B<Arch> center(mean), scale(inv_std), one(1.f);
  const auto modulate = [&](B<Arch> v, std::size_t i, std::size_t count) {
    const B<Arch> affine =
        apply_affine<Arch, true, true>((v - center) * scale, weight, bias, i, count);
    return simd::fmadd<Arch>(affine, simd::load_chunk<Arch>(scale_row, i, count) + one,
                             simd::load_chunk<Arch>(shift_row, i, count));
  };
  simd::for_each_piece<Arch>(
      out, dim, stream,
      [&](std::size_t i, auto whole_lines) {
        if constexpr (kPrefetch) {
          simd::prefetch(next_x + i);
          simd::prefetch(next_x + i + kLanes);
        }
        simd::store_pair<Arch>(out + i, modulate(simd::load<Arch>(x + i), i, kLanes),
                               modulate(simd::load<Arch>(x + i + kLanes), i + kLanes, kLanes),
                               whole_lines);
      },
      [&](std::size_t i, std::size_t count, auto whole_line) {
        if constexpr (kPrefetch) simd::prefetch(next_x + i);
        simd::store_chunk<Arch>(
            out, i, count, modulate(simd::load_chunk<Arch>(x, i, count), i, count), whole_line);
      });
}

/// Folds a broadcast scale and shift row into the weight and bias: gain = weight * (1 + scale),
/// offset = bias * (1 + scale) + shift (D floats each). Returns whether all of them are finite.
template <class Arch, class S>
bool fold_modulation(const float* weight, const float* bias, const S* scale_row, const S* shift_row,
                     std::size_t dim, float* gain, float* offset) {
  constexpr std::size_t kLanes = B<Arch>::size;
  const B<Arch> one(1.f), zero(0.f);
  B<Arch> non_finite(0.f);  // 0 * v is NaN exactly where v is NaN or infinite
  for (std::size_t i = 0; i < dim; i += kLanes) {
    const std::size_t count = std::min(kLanes, dim - i);
    const B<Arch> factor = simd::load_chunk<Arch>(scale_row, i, count) + one;
    const B<Arch> g = simd::load_chunk<Arch>(weight, i, count) * factor;
    const B<Arch> h = simd::fmadd<Arch>(simd::load_chunk<Arch>(bias, i, count), factor,
                                        simd::load_chunk<Arch>(shift_row, i, count));
    simd::store_chunk<Arch>(gain, i, count, g, false);
    simd::store_chunk<Arch>(offset, i, count, h, false);
    non_finite = non_finite + g * zero + h * zero;
  }
  return !std::isnan(simd::reduce_add<Arch>(non_finite));
}

/// A row whose fp32 statistics are out of range (sum_out_of_range on its sum of squared
/// deviations; a NaN or infinite sum makes that NaN too), in double: mean, variance and output.
/// Rare rows, so scalar code; NaN and infinity propagate as in the vector path. weight, bias,
/// scale_row and shift_row may each be null (1, 0, 0, 0).
template <class T, class S>
void layer_norm_row_in_double(const T* x, T* out, const float* weight, const float* bias,
                              const S* scale_row, const S* shift_row, float eps, std::size_t dim) {
  double sum = 0;
  for (std::size_t i = 0; i < dim; ++i) sum += to_float(x[i]);
  const double mean = sum / static_cast<double>(dim);
  double squares = 0;
  for (std::size_t i = 0; i < dim; ++i) {
    const double deviation = to_float(x[i]) - mean;
    squares += deviation * deviation;
  }
  const double inv_std = 1.0 / std::sqrt(squares / static_cast<double>(dim) + eps);
  for (std::size_t i = 0; i < dim; ++i) {
    double y = (to_float(x[i]) - mean) * inv_std;
    if (weight) y *= weight[i];
    if (bias) y += bias[i];
    if (scale_row) y = y * (1.0 + to_float(scale_row[i])) + to_float(shift_row[i]);
    out[i] = from_float<T>(static_cast<float>(y));
  }
}

/// The weight and bias folded with the scale and shift rows they were last folded with.
struct FoldedModulation {
  const void* scale_row = nullptr;  ///< null: nothing folded yet
  const void* shift_row = nullptr;
  float* gain;
  float* offset;
  bool finite = true;
};

/// Normalizes the Rows rows at the walker and moves it past them; `more_rows`: rows follow in
/// this thread's range (worth prefetching for long rows). S: the type of scale and shift.
/// widened: room for the rows as floats (scratch_row_floats each) when T is narrow.
template <class Arch, class T, class S, int Rows>
void layer_norm_pass(const LayerNormProblem& p, core::RowWalker<4>& walker, bool more_rows,
                     FoldedModulation& folded, float* widened, simd::LineStager<Arch, T>& target) {
  using Operand = LayerNormProblem::Operand;
  const auto dim = static_cast<std::size_t>(p.dim);
  const T* x[Rows];
  T* out[Rows];
  const S* scale_row[Rows] = {};
  const S* shift_row[Rows] = {};
  for (int r = 0; r < Rows; ++r, walker.next()) {
    x[r] = static_cast<const T*>(p.x) + walker.offset(Operand::kInput);
    out[r] = static_cast<T*>(p.out) + walker.offset(Operand::kOutput);
    if (p.scale) {
      scale_row[r] = static_cast<const S*>(p.scale) + walker.offset(Operand::kScale);
      shift_row[r] = static_cast<const S*>(p.shift) + walker.offset(Operand::kShift);
    }
  }
  // Each pass over the rows before the next, so that short rows' reductions overlap. Passes 2
  // and 3 read x as floats: x itself, or its copy widened in pass 1.
  float mean[Rows], squares[Rows], inv_std[Rows];
  const float* row[Rows];
  for (int r = 0; r < Rows; ++r) {
    if constexpr (std::is_same_v<T, float>) {
      row[r] = x[r];
      mean[r] = row_sum<Arch>(x[r], dim, nullptr) / static_cast<float>(dim);
    } else {
      float* copy = widened + r * scratch_row_floats(p.dim);
      row[r] = copy;
      mean[r] = row_sum<Arch>(x[r], dim, copy) / static_cast<float>(dim);
    }
  }
  for (int r = 0; r < Rows; ++r) squares[r] = centered_sum_squares<Arch>(row[r], dim, mean[r]);
  for (int r = 0; r < Rows; ++r) {
    inv_std[r] = 1.f / std::sqrt(squares[r] / static_cast<float>(dim) + p.eps);
  }

  const T* next_x = more_rows && dim * sizeof(T) >= 1024
                        ? static_cast<const T*>(p.x) + walker.offset(Operand::kInput)
                        : nullptr;
  for (int r = 0; r < Rows; ++r) {
    T* dst = target.begin_row(out[r]);
    const bool stream = target.streams_in_place();
    if (sum_out_of_range(squares[r], p.eps, dim)) {
      layer_norm_row_in_double(x[r], dst, p.weight, p.bias, scale_row[r], shift_row[r], p.eps, dim);
    } else if (p.scale && !p.modulation_repeats) {
      if (next_x) {
        normalize_modulated_row<Arch, true>(row[r], dst, p.weight, p.bias, scale_row[r],
                                            shift_row[r], mean[r], inv_std[r], dim, stream, next_x);
      } else {
        normalize_modulated_row<Arch, false>(row[r], dst, p.weight, p.bias, scale_row[r],
                                             shift_row[r], mean[r], inv_std[r], dim, stream,
                                             next_x);
      }
    } else if (p.scale) {
      if (folded.scale_row != scale_row[r] || folded.shift_row != shift_row[r]) {
        folded.finite = fold_modulation<Arch>(p.weight, p.bias, scale_row[r], shift_row[r], dim,
                                              folded.gain, folded.offset);
        folded.scale_row = scale_row[r];
        folded.shift_row = shift_row[r];
      }
      normalize_affine_row<Arch>(row[r], dst, folded.gain, folded.offset, mean[r], inv_std[r], dim,
                                 stream, next_x, !folded.finite);
    } else {
      normalize_affine_row<Arch>(row[r], dst, p.weight, p.bias, mean[r], inv_std[r], dim, stream,
                                 next_x, !p.affine_finite);
    }
    target.end_row();
  }
}

template <class Arch, class T, class S, int Rows>
void layer_norm_range(const LayerNormProblem& p, std::int64_t begin, std::int64_t end,
                      float* scratch) {
  const auto dim = static_cast<std::size_t>(p.dim);
  core::RowWalker<4> walker(p.rows, begin);
  simd::LineStager<Arch, T> target(dim, p.stream);
  // The scratch layout of layer_norm_scratch_floats: gain and offset (when the modulation
  // repeats), then the widened rows (narrow T).
  const std::size_t row_floats = scratch_row_floats(p.dim);
  const std::size_t folded_floats = p.modulation_repeats ? 2 * row_floats : 0;
  FoldedModulation folded{nullptr, nullptr, scratch, scratch ? scratch + row_floats : nullptr};
  float* widened = std::is_same_v<T, float> ? nullptr : scratch + folded_floats;
  std::int64_t row = begin;
  for (; row + Rows <= end; row += Rows) {
    layer_norm_pass<Arch, T, S, Rows>(p, walker, row + Rows < end, folded, widened, target);
  }
  for (; row < end; ++row) {
    layer_norm_pass<Arch, T, S, 1>(p, walker, row + 1 < end, folded, widened, target);
  }
  target.finish();
  if (p.stream) simd::stream_fence<Arch>();
}

template <class Arch, class T, class S>
void layer_norm_range_by_length(const LayerNormProblem& p, std::int64_t begin, std::int64_t end,
                                float* scratch) {
  if (rows_per_pass(p.dim, p.dtype) == 4) {
    layer_norm_range<Arch, T, S, 4>(p, begin, end, scratch);
  } else {
    layer_norm_range<Arch, T, S, 1>(p, begin, end, scratch);
  }
}

/// T's rows, with scale and shift in f32 or in T.
template <class Arch, class T>
void layer_norm_range_of(const LayerNormProblem& p, std::int64_t begin, std::int64_t end,
                         float* scratch) {
  if (p.modulation_dtype == DType::f32) {
    layer_norm_range_by_length<Arch, T, float>(p, begin, end, scratch);
  } else {
    layer_norm_range_by_length<Arch, T, T>(p, begin, end, scratch);
  }
}

}  // namespace

template <class Arch>
void rms_norm_rows(const NormProblem& problem, std::int64_t begin, std::int64_t end,
                   float* scratch) noexcept {
  switch (problem.dtype) {
    case DType::bf16:
      return norm_rows_by_length<Arch, bf16>(problem, begin, end, scratch);
    case DType::f16:
      return norm_rows_by_length<Arch, f16>(problem, begin, end, scratch);
    default:
      return norm_rows_by_length<Arch, float>(problem, begin, end, scratch);
  }
}

template void rms_norm_rows<KernelArch>(const NormProblem&, std::int64_t, std::int64_t,
                                        float*) noexcept;

template <class Arch>
void layer_norm_rows(const LayerNormProblem& problem, std::int64_t begin, std::int64_t end,
                     float* scratch) noexcept {
  switch (problem.dtype) {
    case DType::bf16:
      return layer_norm_range_of<Arch, bf16>(problem, begin, end, scratch);
    case DType::f16:
      return layer_norm_range_of<Arch, f16>(problem, begin, end, scratch);
    default:
      return layer_norm_range_of<Arch, float>(problem, begin, end, scratch);
  }
}

template void layer_norm_rows<KernelArch>(const LayerNormProblem&, std::int64_t, std::int64_t,
                                          float*) noexcept;

}  // namespace ditops::norm
