#pragma once
// Validation shared by rotary_position_embedding and rms_norm_rotary_position_embedding: one
// rule for which x, out, mode and cos / sin tables a RoPE call accepts.

#include <array>
#include <cstdint>
#include <ditops/rope.hpp>
#include <ditops/tensor.hpp>

#include "ops/core/check.hpp"

namespace ditops::rope {

/// Strides that walk `table` (cos or sin) along x's three leading dims: [S, D] follows x's
/// sequence dim only; a 4-D table follows each dim it does not broadcast (extent 1).
std::array<std::int64_t, kMaxRank> table_strides(const core::Arg& table, const core::Arg& x,
                                                 int seq_dim);

/// x: 4-D f32, bf16 or f16 with an even last dim; mode a RotatedMode; out x's dtype and shape.
void check_rotated(const core::Arg& x, const core::Arg& out, RotatedMode mode);

/// How the tables walk x's leading dims (table_strides of each).
struct TableStrides {
  std::array<std::int64_t, kMaxRank> cos, sin;
};

/// cos and sin for x (table_strides; f32 or x's dtype, both alike); out writable, overlapping
/// neither table, and x only when it is x (in place).
TableStrides check_tables(const core::Arg& cos, const core::Arg& sin, const core::Arg& x,
                          const core::Arg& out, int seq_dim);

}  // namespace ditops::rope
