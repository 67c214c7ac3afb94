#pragma once
// The int8 attention task on AMX tiles (amx_int8_attention.cpp): int8_attention_task's contract
// (int8_kernel.hpp) on the operands any level prepares. Compiled twice: into the library with the
// instructions, for ditops::avx512_bf16 (namespace amx), and into the test suite on the tile
// model at the baseline, for xsimd::sse2 (namespace amx_model; ops/core/amx_tiles.hpp).

#include "ops/attention/int8_kernel.hpp"

namespace ditops::attention {

namespace amx {
template <class Arch>
void int8_attention_task_amx(const FlashProblem& problem, const Int8Operands& operands,
                             const FlashTask& task, float* scratch) noexcept;
}  // namespace amx
namespace amx_model {
template <class Arch>
void int8_attention_task_amx(const FlashProblem& problem, const Int8Operands& operands,
                             const FlashTask& task, float* scratch) noexcept;
}  // namespace amx_model

}  // namespace ditops::attention
