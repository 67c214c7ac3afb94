#pragma once
// What every attention-like entry shares (dense, varlen, block-sparse, RainFusion): one
// validated call (the kernel problem, the scale, the tuner key) and one runner of flash tasks,
// so a new family states its tasks instead of copying the plan.

#include <ditops/attention.hpp>
#include <string>
#include <vector>

#include "ops/attention/attention_kernel.hpp"

namespace ditops::attention {

/// A validated call: the kernel problem plus what the tuner key and the reference need.
struct Call {
  FlashProblem problem;
  float scale = 1.f;
  std::string key;  ///< tuner key (without the thread count)
  AttentionBackend requested = AttentionBackend::automatic;
  int int8_chunk = 2;  ///< the int8 backend's schedule chunk (1, 2 or 4)
};

/// Validates the tensors of a dense call (q, k, v, out when given, options.attn_mask and lse)
/// and describes it; every check throws ditops::Error naming `name` and the argument.
Call validate_dense(const char* name, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView* out, const AttentionOptions& options);

/// Runs `tasks` (with `cost`, one estimate per task, for the order) on the thread team with the
/// flash kernel of the active ISA: packs K and V once (in p.k_order when set), hands the tasks
/// out most expensive first, grouped by KV head. With int8_chunk > 0, prepares the int8
/// operands and runs the int8 kernel instead.
void run_flash_tasks(FlashProblem p, const std::vector<FlashTask>& tasks,
                     const std::vector<double>& cost, int threads, int int8_chunk = 0);

}  // namespace ditops::attention
