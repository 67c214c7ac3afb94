#pragma once
// Fused RMSNorm + RoPE kernel: the problem rms_norm_rotary_position_embedding validated, and the
// per-ISA group kernel.

#include <cstdint>
#include <ditops/rope.hpp>
#include <ditops/tensor.hpp>

#include "ops/core/rows.hpp"

namespace ditops::rope {

/// Operand indices in NormRopeProblem::groups and head_strides.
enum NormRopeOperand { kNormX = 0, kNormOut = 1, kNormCos = 2, kNormSin = 3 };

/// A norm group is `heads` consecutive rows of D (heads == 1: each head alone; heads == N: a
/// token's heads, contiguous in x and out). Every row of a group is normalized by the group's
/// rms, then rotated by its own table row.
struct NormRopeProblem {
  DType dtype = DType::f32;        ///< of x and out
  DType table_dtype = DType::f32;  ///< of cos and sin: f32 or dtype
  std::int64_t dim = 0;            ///< D (even)
  std::int64_t heads = 1;          ///< rows per group
  RotatedMode mode = RotatedMode::rotated_half;
  core::RowLayout groups;  ///< one row per group; cos/sin strides are 0 where they broadcast
  /// Element stride between the rows of a group, per operand (x and out: D; a table: its head
  /// stride, 0 when it broadcasts over heads). Unused when heads == 1.
  std::int64_t head_strides[4] = {0, 0, 0, 0};
  const void* x = nullptr;
  void* out = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  const float* weight = nullptr;  ///< heads * D floats, or null (no weight)
  float eps = 0.f;
  bool stream = false;  ///< write out with streaming (non-temporal) stores
};

/// Normalizes and rotates groups [begin, end). Defined per ISA in norm_rope_kernel.cpp.
template <class Arch>
void norm_rope_groups(const NormRopeProblem& problem, std::int64_t begin,
                      std::int64_t end) noexcept;

}  // namespace ditops::rope
