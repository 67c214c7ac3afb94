#pragma once
// The GEMMs on AMX tiles (amx_gemm.cpp), for the panels of the avx512+bf16+vnni variant (16 or
// 32 columns): the int8 GEMM (gemm_int8's contract, gemm_kernel.hpp; u8 activations = x + 128)
// and the bf16 GEMM of FLOAT layers of bf16 weights (panels of bf16 pairs) for bf16 x.
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
/// y rows [row_begin, row_end) (any number, at most kMaxAmxRows; rows >= m are computed but not
/// stored) for panels [panel_begin, panel_end) of bf16 pairs (problem.weight_dtype bf16,
/// k_padded a multiple of 32): y = Σ_k x · W in fp32 + bias, then the activation, as gemm_f32
/// computes it. a: x's rows from row_begin as bf16, k_padded apart, zeros past k.
template <class Arch>
void gemm_bf16_amx(const GemmProblem& problem, const bf16* a, std::int64_t row_begin,
                   std::int64_t row_end, std::int64_t panel_begin, std::int64_t panel_end) noexcept;
}  // namespace amx
namespace amx_model {
/// The same on the tile model (the test suite's).
template <class Arch>
void gemm_int8_amx(const GemmProblem& problem, const std::uint8_t* a, const float* row_scale,
                   std::int64_t row_begin, std::int64_t row_end, std::int64_t panel_begin,
                   std::int64_t panel_end) noexcept;
template <class Arch>
void gemm_bf16_amx(const GemmProblem& problem, const bf16* a, std::int64_t row_begin,
                   std::int64_t row_end, std::int64_t panel_begin, std::int64_t panel_end) noexcept;
}  // namespace amx_model

}  // namespace ditops::linear
