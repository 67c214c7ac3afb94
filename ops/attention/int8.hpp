#pragma once
// The int8 backend of one call: owns the operands it prepares (int8_kernel.hpp) and runs flash
// tasks on them with the int8 kernel of the active ISA level. Baseline code (not a kernel
// source).

#include <cstdint>
#include <vector>

#include "ops/attention/int8_kernel.hpp"
#include "ops/core/scratch.hpp"

namespace ditops::attention {

/// K smoothing is on unless DITOPS_INT8_SMOOTH_K=0 (a diagnostic: it shows what smoothing
/// buys on a model's inputs).
bool smooth_keys();

/// An int8 task kernel (int8_attention_task's signature).
using Int8TaskKernel = void (*)(const FlashProblem&, const Int8Operands&, const FlashTask&,
                                float*) noexcept;

/// The task kernel backends run: on AMX tiles where core::amx_usable(AmxUnit::int8) (the
/// avx512+bf16+vnni variant runs then, whose operands it takes), else the active variant's.
Int8TaskKernel int8_task_kernel() noexcept;

/// For tests: backends built from now on run `kernel` (null: int8_task_kernel() again), so a
/// test can run the AMX kernel compiled on the tile model, or the vpdpbusd kernel beside the
/// AMX one, through the whole backend. Returns the previous override.
Int8TaskKernel override_int8_task_kernel(Int8TaskKernel kernel) noexcept;

class Int8Backend {
 public:
  /// Quantizes K and V of every (sequence, KV head) of `problem` (smoothing K unless
  /// DITOPS_INT8_SMOOTH_K=0) on `threads` threads, and lays out the schedule at `chunk`.
  /// `problem` must outlive the backend. The quantized K and V live in the calling thread's
  /// scratch (core::thread_scratch): one backend per thread at a time.
  Int8Backend(const FlashProblem& problem, int chunk, int threads);

  /// Floats of per-thread scratch run() needs.
  std::int64_t scratch_floats() const noexcept;

  /// Runs one task; scratch: scratch_floats() floats, 64-byte aligned, private to the thread.
  void run(const FlashTask& task, float* scratch) const noexcept;

 private:
  const FlashProblem& problem_;
  core::AlignedArray<std::int32_t> k_sum_;
  core::AlignedArray<float> k_scale_, v_scale_, k_mean_;
  std::vector<std::int64_t> first_block_;
  std::vector<schedule::StageInstance> order_;
  Int8Operands operands_;
  Int8TaskKernel task_kernel_;
};

}  // namespace ditops::attention
