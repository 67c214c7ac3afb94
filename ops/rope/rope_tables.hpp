#pragma once
// Validation of RoPE's cos / sin tables, shared by rotary_position_embedding and
// rms_norm_rotary_position_embedding: one rule for which tables a call accepts.

#include <array>
#include <cstdint>
#include <ditops/tensor.hpp>

#include "ops/core/check.hpp"

namespace ditops::rope {

/// Strides that walk `table` (cos or sin) along x's three leading dims: [S, D] follows x's
/// sequence dim only; a 4-D table follows each dim it does not broadcast (extent 1).
std::array<std::int64_t, kMaxRank> table_strides(const core::Arg& table, const core::Arg& x,
                                                 int seq_dim);

}  // namespace ditops::rope
