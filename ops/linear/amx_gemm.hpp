#pragma once
// The int8 GEMM on AMX tiles (amx_gemm.cpp): gemm_int8's contract (gemm_kernel.hpp) for the
// panels of the avx512+bf16+vnni variant (16 or 32 columns, u8 activations = x + 128).
// Compiled twice: into the library with the instructions, for ditops::avx512_bf16 (namespace
// amx), and into the test suite on the tile model at the baseline, for xsimd::sse2 (namespace
// amx_model; ops/linear/amx_tiles.hpp).

#include <cstdint>

#include "ops/linear/gemm_kernel.hpp"

namespace ditops::linear {

/// Most rows of one call: kMaxBlockTiles register tiles of the avx512+bf16+vnni variant (8 rows).
inline constexpr int kMaxAmxRows = kMaxBlockTiles * 8;

namespace amx {
/// y rows [row_begin, row_end) (any number of rows, at most kMaxAmxRows; rows >= m are computed
/// but not stored) for panels [panel_begin, panel_end): gemm_int8's contract.
template <class Arch>
void gemm_int8_amx(const GemmProblem& problem, const std::uint8_t* a, const float* row_scale,
                   std::int64_t row_begin, std::int64_t row_end, std::int64_t panel_begin,
                   std::int64_t panel_end) noexcept;
}  // namespace amx
namespace amx_model {
/// The same on the tile model (the test suite's).
template <class Arch>
void gemm_int8_amx(const GemmProblem& problem, const std::uint8_t* a, const float* row_scale,
                   std::int64_t row_begin, std::int64_t row_end, std::int64_t panel_begin,
                   std::int64_t panel_end) noexcept;
}  // namespace amx_model

}  // namespace ditops::linear
