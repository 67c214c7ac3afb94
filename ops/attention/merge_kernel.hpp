#pragma once
// The attention-state merge kernel: per row, two partial attention outputs weighted by their
// log-sum-exps (ditops::merge_attention_states).

#include <cstdint>
#include <ditops/tensor.hpp>

#include "ops/core/rows.hpp"

namespace ditops::attention {

/// Operand indices in MergeProblem::rows (the leading dims are [B, S, N] for all six).
enum MergeOperand { kOutA = 0, kOutB = 1, kOut = 2, kLseA = 3, kLseB = 4, kLse = 5 };

struct MergeProblem {
  DType dtype_a = DType::f32, dtype_b = DType::f32, dtype_out = DType::f32;
  std::int64_t dim = 0;  ///< D, contiguous
  core::RowLayout rows;  ///< strides per MergeOperand
  const void* out_a = nullptr;
  const void* out_b = nullptr;
  void* out = nullptr;
  const float* lse_a = nullptr;
  const float* lse_b = nullptr;
  float* lse = nullptr;
};

/// Rows [begin, end). Defined per ISA in merge_kernel.cpp.
template <class Arch>
void merge_attention_rows(const MergeProblem& problem, std::int64_t begin,
                          std::int64_t end) noexcept;

}  // namespace ditops::attention
