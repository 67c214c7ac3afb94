#pragma once
// RMSNorm and LayerNorm kernels: the problems the public entries validated, and the per-ISA row
// kernels.

#include <cstddef>
#include <cstdint>
#include <ditops/tensor.hpp>

#include "ops/core/rows.hpp"

namespace ditops::norm {

/// Operand indices in NormProblem::rows.
enum NormOperand { kX = 0, kResidual = 1, kOut = 2, kSumOut = 3 };

struct NormProblem {
  DType dtype = DType::f32;  ///< of x, residual, out and sum_out
  std::int64_t dim = 0;      ///< D, the normalized (contiguous) dimension
  core::RowLayout rows;      ///< leading shape; strides per NormOperand
  const void* x = nullptr;
  const void* residual = nullptr;  ///< null: plain rms_norm
  const float* weight = nullptr;   ///< D floats, or null for no weight
  bool weight_finite = true;       ///< no weight is NaN or infinite (or there is none)
  float eps = 0.f;
  void* out = nullptr;
  void* sum_out = nullptr;  ///< written iff residual is set
  bool stream = false;      ///< write out and sum_out with streaming (non-temporal) stores
};

/// Rows one pass normalizes together: short rows (up to 1 KiB) four at a time, so that the four
/// reductions, square roots and divisions overlap and the loop overhead is shared; longer rows
/// one at a time. Depends on the row only, never on the thread split, so results do not either.
inline int rows_per_pass(std::int64_t dim, DType dtype) noexcept {
  constexpr std::int64_t kShortRowBytes = 1024;
  return dim * dtype_size(dtype) <= kShortRowBytes ? 4 : 1;
}

/// Normalizes rows [begin, end). scratch: rows_per_pass(dim) * D floats private to the calling
/// thread (holds x + residual in fp32 for the second pass, unless sum_out is f32 and stays in
/// cache). Defined per ISA in norm_kernel.cpp.
template <class Arch>
void rms_norm_rows(const NormProblem& problem, std::int64_t begin, std::int64_t end,
                   float* scratch) noexcept;

/// A LayerNorm (with AdaLN modulation when scale is set) the public entry validated.
struct LayerNormProblem {
  /// Operand indices in rows.
  enum Operand { kInput = 0, kOutput = 1, kScale = 2, kShift = 3 };
  DType dtype = DType::f32;             ///< of x and out
  DType modulation_dtype = DType::f32;  ///< of scale and shift: f32 or dtype
  std::int64_t dim = 0;                 ///< D, the normalized (contiguous) dimension
  core::RowLayout rows;                 ///< leading shape; strides per Operand
  const void* x = nullptr;
  void* out = nullptr;
  const float* weight = nullptr;  ///< D floats, or null (1); set whenever scale is
  const float* bias = nullptr;    ///< D floats, or null (0); set whenever scale is
  bool affine_finite = true;      ///< no weight or bias is NaN or infinite
  const void* scale = nullptr;    ///< a row of D per row of x, or null (no modulation)
  const void* shift = nullptr;    ///< set exactly when scale is
  /// Consecutive rows share their scale and shift rows (broadcast over the sequence): the kernel
  /// folds them into the weight and bias once per run of such rows, instead of per row.
  bool modulation_repeats = false;
  float eps = 0.f;
  bool stream = false;  ///< write out with streaming (non-temporal) stores
};

/// Floats one row takes in scratch: D rounded up to whole cache lines (rows widened to floats
/// are stored in whole vectors, on aligned addresses).
inline std::size_t scratch_row_floats(std::int64_t dim) noexcept {
  return (static_cast<std::size_t>(dim) + 15) / 16 * 16;
}

/// Floats of scratch layer_norm_rows needs per thread: the weight and bias folded with a
/// repeating modulation, then, for 16-bit x, the rows of one pass widened to floats.
inline std::size_t layer_norm_scratch_floats(const LayerNormProblem& problem) noexcept {
  const std::size_t row = scratch_row_floats(problem.dim);
  return (problem.modulation_repeats ? 2 * row : 0) +
         (problem.dtype == DType::f32
              ? 0
              : static_cast<std::size_t>(rows_per_pass(problem.dim, problem.dtype)) * row);
}

/// Normalizes rows [begin, end). scratch: layer_norm_scratch_floats floats private to the
/// calling thread. Defined per ISA in norm_kernel.cpp.
template <class Arch>
void layer_norm_rows(const LayerNormProblem& problem, std::int64_t begin, std::int64_t end,
                     float* scratch) noexcept;

}  // namespace ditops::norm
