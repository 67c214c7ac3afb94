#pragma once
// The linear GEMMs' epilogue, shared by the kernels that produce the sums: the per-ISA
// register-tile kernels (gemm_kernel.cpp) and the AMX tile kernels (amx_gemm.cpp). For kernel
// sources only (templates over the xsimd architecture of the including object).
//
// Internal linkage on purpose (an unnamed namespace): every object that includes this header is
// compiled with its own ISA flags and keeps its own copy, so the linker never picks one object's
// copy for another (tools/check_isa_objects.sh).

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ops/core/log2_domain.hpp"
#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/int8_dot.hpp"
#include "ops/core/simd/partial.hpp"
#include "ops/linear/gemm_kernel.hpp"

namespace ditops::linear {
namespace {

/// 1 / (1 + e^-t) from e = e^-|t| <= 1, the one exponential simd::exp2_nonpositive computes and
/// one that never overflows: 1 / (1 + e) for t >= 0, e / (1 + e) below (0 once e < 2^-126).
template <class Arch>
simd::F32<Arch> sigmoid(simd::F32<Arch> t) noexcept {
  using B = simd::F32<Arch>;
  const B e = simd::exp2_nonpositive<Arch>(xsimd::abs(t) * B(-core::kLog2e));
  return xsimd::select(t >= B(0.f), B(1.f), e) / (B(1.f) + e);
}

/// The epilogue's activation (linear.hpp) as v · sigmoid: gelu_tanh(v) = 0.5 v (1 + tanh(u)) =
/// v · sigmoid(2u), silu(v) = v · sigmoid(v). -inf is taken as the lowest float, whose sigmoid
/// is 0, so it gives the limit -0 rather than -inf · 0 = NaN; NaN multiplies through as NaN.
template <class Arch>
simd::F32<Arch> activate(Activation activation, simd::F32<Arch> v) noexcept {
  using B = simd::F32<Arch>;
  if (activation == Activation::none) return v;
  const B finite =
      xsimd::select(v == B(core::kMinusInf), B(std::numeric_limits<float>::lowest()), v);
  if (activation == Activation::silu) return finite * sigmoid<Arch>(finite);
  // 2u = v · (2 sqrt(2 / pi) + 2 sqrt(2 / pi) · 0.044715 · v^2)
  constexpr float kLinear = 1.5957691216057308f, kCubic = 0.07135481627260025f;
  const B two_u = finite * simd::fmadd<Arch>(B(kCubic), finite * finite, B(kLinear));
  return finite * sigmoid<Arch>(two_u);
}

/// Element offsets in y of the rows [begin, min(end, m)) a block stores: walked once per block,
/// not once per tile (starting a walk costs a division per leading dimension).
inline void y_row_offsets(const GemmProblem& p, std::int64_t begin, std::int64_t end,
                          std::int64_t* offsets) noexcept {
  core::RowWalker<kY + 1> walker(p.rows, begin);
  for (std::int64_t r = begin; r < std::min(end, p.m); ++r, walker.next()) {
    offsets[r - begin] = walker.offset(kY);
  }
}

/// Writes the rows r < tile_rows of a tile that exist (row0 + r < m) of y's columns
/// [n0, n0 + V vectors), row r at element offset y_rows[r], value(r, c) giving vector c of row r
/// before the activation. A partial vector (the last columns) is activated whole, like any
/// other, and stored in part.
template <class Arch, int V, class Value>
void store_tile(const GemmProblem& p, const std::int64_t* y_rows, std::int64_t row0, int tile_rows,
                std::int64_t n0, const Value& value) {
  using F32 = simd::F32<Arch>;
  constexpr int kLanes = F32::size, kColumns = V * kLanes;
  const int rows = static_cast<int>(std::min<std::int64_t>(tile_rows, p.m - row0));
  const std::int64_t columns = std::min<std::int64_t>(kColumns, p.n - n0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < V; ++c) {
      const std::int64_t first = n0 + c * kLanes;
      const std::int64_t count = std::min<std::int64_t>(kLanes, p.n - first);
      if (count <= 0) break;
      const F32 v = activate<Arch>(p.activation, value(r, c));
      const std::int64_t at = y_rows[r] + first;
      if (p.y_dtype == DType::f32) {
        float* y = static_cast<float*>(p.y) + at;
        columns == kColumns ? v.store_unaligned(y)
                            : simd::store_partial<Arch>(y, v, static_cast<std::size_t>(count));
      } else {
        bf16* y = static_cast<bf16*>(p.y) + at;
        columns == kColumns ? simd::store<Arch>(y, v)
                            : simd::store_partial<Arch>(y, v, static_cast<std::size_t>(count));
      }
    }
  }
}

/// The int8 epilogue of a panel's columns [n0, n0 + V vectors), before the activation:
/// y = row_scale · column_scale · (sum + column_offset) + bias.
template <class Arch, int V>
struct Int8Epilogue {
  using F32 = simd::F32<Arch>;
  using I32 = simd::I32<Arch>;
  I32 offset[V];
  F32 scale[V], bias[V];

  Int8Epilogue(const GemmProblem& p, std::int64_t n0) noexcept {
    constexpr int kLanes = F32::size;
    for (int c = 0; c < V; ++c) {
      // Unaligned: a timestep layer's static step passes offsets from a std::vector.
      offset[c] = I32::load_unaligned(p.column_offset + n0 + c * kLanes);
      scale[c] = F32::load_aligned(p.column_scale + n0 + c * kLanes);
      bias[c] = p.bias ? F32::load_aligned(p.bias + n0 + c * kLanes) : F32(0.f);
    }
  }
  /// Vector c of a row whose int32 sums are `sum` and whose scale is row_scale.
  F32 operator()(I32 sum, int c, float row_scale) const noexcept {
    return simd::fmadd<Arch>(xsimd::to_float(sum + offset[c]), scale[c] * F32(row_scale), bias[c]);
  }
};

/// The FLOAT layers' epilogue of a panel's columns [n0, n0 + V vectors), before the
/// activation: y = sum + bias.
template <class Arch, int V>
struct F32Epilogue {
  using F32 = simd::F32<Arch>;
  F32 bias[V];

  F32Epilogue(const GemmProblem& p, std::int64_t n0) noexcept {
    constexpr int kLanes = F32::size;
    for (int c = 0; c < V; ++c) {
      bias[c] = p.bias ? F32::load_aligned(p.bias + n0 + c * kLanes) : F32(0.f);
    }
  }
  /// Vector c of a row whose fp32 sums are `sum`.
  F32 operator()(F32 sum, int c) const noexcept { return sum + bias[c]; }
};

}  // namespace
}  // namespace ditops::linear
