#pragma once
// The CFG combine kernel: out = uncond + scale · (cond - uncond) over rows of D elements.

#include <cstdint>
#include <ditops/tensor.hpp>

#include "ops/core/rows.hpp"

namespace ditops::guidance {

/// Operand indices in CombineProblem::rows.
enum CombineOperand { kCond = 0, kUncond = 1, kOut = 2 };

struct CombineProblem {
  DType dtype = DType::f32;  ///< of every operand
  std::int64_t dim = 0;      ///< D, contiguous
  core::RowLayout rows;      ///< leading shape; strides per CombineOperand
  const void* cond = nullptr;
  const void* uncond = nullptr;
  void* out = nullptr;
  float scale = 1.f;
};

/// Rows [begin, end). Defined per ISA in guidance_kernel.cpp.
template <class Arch>
void cfg_combine_rows(const CombineProblem& problem, std::int64_t begin, std::int64_t end) noexcept;

}  // namespace ditops::guidance
