#pragma once
// What every attention-like entry shares (dense, varlen, block-sparse, RainFusion): one
// validated call (the kernel problem, the scale, the tuner key) and one runner of flash tasks,
// so a new family states its tasks instead of copying the plan.

#include <ditops/attention.hpp>
#include <span>
#include <string>
#include <vector>

#include "ops/attention/attention_kernel.hpp"

namespace ditops::attention {

/// A validated call: the kernel problem plus what the tuner key and the reference need.
struct Call {
  FlashProblem problem;
  float scale = 1.f;
  std::string layout;         ///< "bsnd", "bnsd" or "varlen"
  std::string mask = "none";  ///< the mask's dtype and shape, e.g. "bool[1, 1, 300, 400]"
  std::string key;            ///< describe(*this): the tuner key (without the thread count)
  AttentionBackend requested = AttentionBackend::automatic;
  int int8_chunk = 2;  ///< the int8 backend's schedule chunk (1, 2 or 4)
};

/// The call in one line: shape, heads, head dims, dtype, layout, mask, causal, LSE (e.g.
/// "b1 sq4608 sk4608 n24/24 d128/128 f32 bsnd mask:none causal"; varlen "varlen b3 tq.. tk.. ..").
/// The tuner's key; errors and reports that name a problem use it too.
std::string describe(const Call& call);

/// Validates the tensors of a dense call (q, k, v, out when given, options.attn_mask and lse)
/// and describes it; every check throws ditops::Error naming `name` and the argument.
Call validate_dense(const char* name, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView* out, const AttentionOptions& options);

/// Validates the tensors of a varlen call (q, k, v, out, cu_seqlens_q / _k and options.lse) and
/// describes it; every check throws ditops::Error naming attention_forward_varlen.
Call validate_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                     std::span<const std::int32_t> cu_q, std::span<const std::int32_t> cu_k,
                     const TensorView& out, const VarlenOptions& options);

/// Runs `tasks` (with `cost`, one estimate per task, for the order) on the thread team with the
/// flash kernel of the active ISA: packs K and V once (in p.k_order when set), hands the tasks
/// out most expensive first, grouped by KV head. With int8_chunk > 0, prepares the int8
/// operands and runs the int8 kernel instead.
void run_flash_tasks(FlashProblem p, const std::vector<FlashTask>& tasks,
                     const std::vector<double>& cost, int threads, int int8_chunk = 0);

/// Runs a dense or varlen problem with the flash kernel (or with int8_chunk > 0 the int8
/// kernel): tasks of ~96 query rows per (sequence, KV head), split over the KV range when too
/// few to occupy the threads, the splits merged by their LSE.
void run_flash(const FlashProblem& p, int threads, int int8_chunk = 0);

/// The oracle: per (sequence, head, block of 128 query rows) the fp32 scores are materialized
/// by an Eigen GEMM, masked, soft-maxed (std::exp) and multiplied by V.
void run_reference(const FlashProblem& p, float scale, int threads);

}  // namespace ditops::attention
