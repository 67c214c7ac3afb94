#pragma once
// flash_bf16's task kernel on AMX-BF16 tiles (amx_flash.cpp): flash_task's contract
// (attention_kernel.hpp) for runs with tiles.bf16_dot, reading the same packed K^T and V.
// Compiled twice: into the library with the instructions, for ditops::avx512_bf16 (namespace
// amx), and into the test suite on the tile model at the baseline, for xsimd::sse2 (namespace
// amx_model; ops/core/amx_tiles.hpp).

#include "ops/attention/attention_kernel.hpp"

namespace ditops::attention {

namespace amx {
/// One task of a run with tiles.bf16_dot and KLayout::packed; scratch: flash_scratch_floats()
/// floats, 64-byte aligned, private to the calling thread.
template <class Arch>
void flash_task_amx(const FlashRun& run, const FlashTask& task, float* scratch) noexcept;
}  // namespace amx
namespace amx_model {
/// The same on the tile model (the test suite's).
template <class Arch>
void flash_task_amx(const FlashRun& run, const FlashTask& task, float* scratch) noexcept;
}  // namespace amx_model

}  // namespace ditops::attention
