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
  void (*task_kernel_)(const FlashProblem&, const Int8Operands&, const FlashTask&, float*) noexcept;
};

}  // namespace ditops::attention
