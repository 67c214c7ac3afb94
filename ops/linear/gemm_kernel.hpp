#pragma once
// The GEMM kernels of the linear layers: y[m, n] = epilogue(Σ_k x[m, k] · W[n, k]).
// W is packed once, when a layer is built, into column panels: panel p holds columns
// [p·cols, (p+1)·cols) as words of 4 consecutive k (int8) or single k (f32), each word the
// panel's columns side by side, so the register tile loads a word's columns as whole vectors
// and broadcasts one word of a row of x (the SGEMM layout of MLAS and XNNPACK).
// int8: x is quantized row by row into an int8 matrix (the A panel, padded to whole tiles)
// before the GEMM, then y = row_scale[m] · column_scale[n] · (acc + column_offset[n]) + bias[n].
// f32: each task copies chunks of k of its rows of x (widened) into its scratch, and
// y = acc + bias[n]. A FLOAT layer of bf16 weights packed for the avx512+bf16+vnni variant has
// panels of bf16 pairs instead (words of 2 consecutive k, the layout of vdpbf16ps and of AMX B
// tiles): bf16 x multiplies them on vdpbf16ps (its rows copied as bf16), fp32 x on the fp32
// FMA, the pairs widened as they are loaded.
// Both then apply the activation, if any, before the store.

#include <cstdint>
#include <ditops/linear.hpp>
#include <ditops/tensor.hpp>

#include "ops/core/rows.hpp"

namespace ditops::linear {

/// Most register tiles of rows in one call of gemm_int8 / gemm_f32 (its scratch is sized by it).
inline constexpr int kMaxBlockTiles = 32;

/// The register tile of a kernel variant: `rows` rows of x by `cols` panel columns.
struct TileShape {
  int rows = 0;
  int cols = 0;
};

/// Where the int8 kernels of a variant put x: s8 for the sign trick (pmaddubsw levels and the
/// widening emulation), u8 = x + 128 for vpdpbusd, whose excess 128 · Σ_k W[n, k] the column
/// offsets take back.
struct Int8Layout {
  TileShape tile;
  int activation_offset = 0;  ///< 0 or 128
  /// Whether the kernel multiplies any int8 weight exactly. The sign trick needs weights in
  /// [-127, 127]; a layer holding -128 runs the baseline variant's kernel instead.
  bool exact_for_minus_128 = true;
};

/// How x becomes int8 (one scale per row, written to row_scale).
struct ActivationQuant {
  bool dynamic = false;  ///< per row: scale = max|x_row| / 127, q = round(x / scale)
  float scale = 1.f;     ///< static: q = clamp(round(x / scale + offset), -128, 127)
  float offset = 0.f;
  float row_scale = 1.f;          ///< static: the row_scale every row gets
  const float* smooth = nullptr;  ///< [k] factors applied to x first, or null
};

/// The operands GemmProblem::rows addresses: x's rows and y's rows share the leading shape.
enum GemmOperand { kX = 0, kY = 1 };

/// One forward call as the kernels see it (validated by the layer).
struct GemmProblem {
  std::int64_t m = 0, n = 0, k = 0;
  DType x_dtype = DType::f32;  ///< f32 or bf16
  DType y_dtype = DType::f32;  ///< f32 or bf16
  const void* x = nullptr;     ///< rows per `rows` (operand kX), k contiguous elements each
  core::RowLayout rows;
  void* y = nullptr;  ///< rows per `rows` (operand kY), n contiguous elements each
  /// Packed W: panels of panel_bytes each, k_padded (a multiple of 4 for int8) deep.
  const void* panels = nullptr;
  /// f32 panels (one k per word), or bf16 pairs (a FLOAT layer of bf16 weights packed for the
  /// avx512+bf16+vnni variant: words of 2 consecutive k, k_padded a multiple of 32).
  DType weight_dtype = DType::f32;
  std::int64_t panel_bytes = 0;
  int columns = 0;  ///< of a panel (the tile's)
  std::int64_t k_padded = 0;
  /// int8 epilogue, per column (padded to whole panels): offset added to the int32 sum (any
  /// alignment), scale (64-byte aligned, as the bias).
  const std::int32_t* column_offset = nullptr;
  const float* column_scale = nullptr;
  const float* bias = nullptr;  ///< per column, or null
  Activation activation = Activation::none;
};

// ---- per ISA (gemm_kernel.cpp) -----------------------------------------------------------------

/// The layout of a layer of n output features.
template <class Arch>
Int8Layout int8_layout(std::int64_t n) noexcept;
template <class Arch>
TileShape f32_tile(std::int64_t n) noexcept;

/// Quantizes rows [begin, end) of x into a (row r at a + (r - begin) · k_padded, bytes past k
/// zero) and writes their scales to row_scale[r - begin].
template <class Arch>
void quantize_rows(const GemmProblem& problem, const ActivationQuant& quant, std::int64_t begin,
                   std::int64_t end, std::uint8_t* a, float* row_scale) noexcept;
/// How the f32 GEMM splits a call: rows per block (whole tiles; a task's rows), panels per
/// task, and the floats of scratch a task needs (its slice of x and its partial sums).
struct F32Blocking {
  int block_rows = 0;
  int task_panels = 0;
  std::int64_t scratch_floats = 0;
};
template <class Arch>
F32Blocking f32_blocking() noexcept;

/// y rows [row_begin, row_end) (at most kMaxBlockTiles whole tiles; rows >= m are computed but
/// not stored) for panels [panel_begin, panel_end); a and row_scale start at row row_begin.
template <class Arch>
void gemm_int8(const GemmProblem& problem, const std::uint8_t* a, const float* row_scale,
               std::int64_t row_begin, std::int64_t row_end, std::int64_t panel_begin,
               std::int64_t panel_end) noexcept;
/// y rows [row_begin, row_end) (whole tiles, at most f32_blocking().block_rows; rows >= m are
/// computed but not stored) for panels [panel_begin, panel_end) (at most task_panels), reading
/// x directly in chunks of k; scratch holds f32_blocking().scratch_floats, 64-byte aligned.
template <class Arch>
void gemm_f32(const GemmProblem& problem, std::int64_t row_begin, std::int64_t row_end,
              std::int64_t panel_begin, std::int64_t panel_end, float* scratch) noexcept;

}  // namespace ditops::linear
