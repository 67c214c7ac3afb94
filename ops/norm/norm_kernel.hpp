#pragma once
// RMSNorm kernels: the problem the public entry validated, and the per-ISA row kernel.

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

}  // namespace ditops::norm
