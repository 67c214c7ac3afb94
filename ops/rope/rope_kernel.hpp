#pragma once
// RoPE kernels: the problem the public entry validated, and the per-ISA row kernel.

#include <cstdint>
#include <ditops/rope.hpp>
#include <ditops/tensor.hpp>

#include "ops/core/rows.hpp"

namespace ditops::rope {

/// Operand indices in RopeProblem::rows.
enum RopeOperand { kX = 0, kOut = 1, kCos = 2, kSin = 3 };

struct RopeProblem {
  DType dtype = DType::f32;        ///< of x and out
  DType table_dtype = DType::f32;  ///< of cos and sin: f32 or dtype
  std::int64_t dim = 0;            ///< D (even)
  RotatedMode mode = RotatedMode::rotated_half;
  core::RowLayout rows;  ///< x's three leading dims; cos/sin strides are 0 where they broadcast
  const void* x = nullptr;
  void* out = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  bool stream = false;  ///< write out with streaming (non-temporal) stores
  /// Whether rows the kernel joins into aligned vectors (simd::ShiftedStreamWriter) stream.
  bool stream_joined = false;
};

/// Rotates rows [begin, end). Defined per ISA in rope_kernel.cpp.
template <class Arch>
void rope_rows(const RopeProblem& problem, std::int64_t begin, std::int64_t end) noexcept;

}  // namespace ditops::rope
