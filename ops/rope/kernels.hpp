#pragma once
// The RoPE family's kernel table: the kernels of rotary_position_embedding (rope.cpp) and
// rms_norm_rotary_position_embedding (norm_rope.cpp), one struct per kernel variant. One family
// for the folder: both entries take the same x, out and cos / sin tables (rope_tables.cpp).

#include "ops/core/isa.hpp"
#include "ops/rope/norm_rope_kernel.hpp"
#include "ops/rope/rope_kernel.hpp"

namespace ditops::rope {

/// The RoPE kernels of one variant (the member types: any instantiation's, so they follow the
/// declarations; qualified, since the members take the kernels' names).
struct RopeKernels {
  /// rotary_position_embedding's.
  decltype(&rope::rope_rows<xsimd::sse2>) rope_rows;
  /// rms_norm_rotary_position_embedding's.
  decltype(&rope::norm_rope_groups<xsimd::sse2>) norm_rope_groups;
};

/// The kernels of the variant this process runs. The table is constexpr: built at compile
/// time, read without an initialization guard.
/// Defined in rope.cpp.
const RopeKernels& rope_kernels() noexcept;

}  // namespace ditops::rope
