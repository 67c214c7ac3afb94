// Public attention entries, in one direction: validate the call into an immutable Call
// (validate.cpp), let the backend table choose forced, cached or tuned (backends.cpp), and run
// the chosen backend's own driver (the flash driver, the int8 backend, the sparse backend, the
// reference); select_attention reports the choice without touching user memory.

#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>

#include "ops/attention/attention_kernel.hpp"
#include "ops/attention/backends.hpp"
#include "ops/attention/call.hpp"
#include "ops/attention/tuner.hpp"
#include "ops/core/isa.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"

namespace ditops {

const char* backend_name(AttentionBackend backend) noexcept {
  if (backend == AttentionBackend::automatic) return "automatic";
  const attention::Backend* entry = attention::find_backend(backend);
  return entry ? entry->name : "unknown";
}

namespace attention {

bool bf16_dot_available() noexcept { return core::kernel_variant() == core::kAvx512Bf16Variant; }

namespace {

/// What the caller sees of a choice: select_attention's answer, and AttentionOptions::ran.
AttentionChoice report(const Call& call, const Choice& choice) {
  std::string detail = find_backend(choice.config.backend)->describe(call, choice.config);
  detail += " kv_block=" + std::to_string(kKvBlock) + " isa=" + core::isa_name(core::active_isa());
  if (choice.forced) detail += " (forced)";
  if (!choice.refused.empty()) detail += " (" + choice.refused + ")";
  return AttentionChoice{choice.config.backend, detail, choice.from_cache};
}

void run_call(const Call& call, AttentionChoice* ran) {
  const Choice choice = choose(call, core::thread_count(), true);
  if (ran != nullptr) *ran = report(call, choice);
}

}  // namespace

}  // namespace attention

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const AttentionOptions& options) {
  const core::CallScope scope("attention_forward");
  const attention::Call call =
      attention::validate_dense("attention_forward", q, k, v, &out, options);
  attention::run_call(call, options.ran);
}

void attention_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              std::span<const std::int32_t> cu_seqlens_q,
                              std::span<const std::int32_t> cu_seqlens_k, const TensorView& out,
                              const VarlenOptions& options) {
  const core::CallScope scope("attention_forward_varlen");
  const attention::Call call =
      attention::validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out, options);
  attention::run_call(call, options.ran);
}

AttentionChoice select_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionOptions& options) {
  const core::CallScope scope("select_attention");
  const char* name = "select_attention";
  const attention::Call probe = attention::validate_dense(name, q, k, v, nullptr, options);
  // Tuning runs the call: it is validated again with an output (and LSE) of its own, so no
  // user memory is written. Sizes fit int64: validation bounded the workspace.
  const attention::FlashProblem& p = probe.problem;
  const int seq_dim = options.head_first ? 2 : 1, head_dim = 3 - seq_dim;
  const std::int64_t rows = p.batch * p.q_len * p.heads;
  // Never empty: a view of no data would read as "no out" (the call then writes nothing).
  const auto out = core::aligned_array<float>(
      rows * p.dv == 0 ? core::CheckedSize(1) : core::CheckedSize(rows) * p.dv * 2);
  TensorView out_view = q;  // q's dtype and layout, rows [B, Sq, N] of Dv elements
  out_view.data = out.get();
  out_view.shape[3] = p.dv;
  out_view.strides = {p.q_len * p.heads * p.dv, 0, 0, 1};
  out_view.strides[seq_dim] = p.heads * p.dv;
  out_view.strides[head_dim] = p.dv;
  AttentionOptions own = options;
  const auto lse = core::aligned_array<float>(p.lse ? rows : 1);
  if (!options.lse.empty() || options.lse.rank != 0) {
    own.lse = view(lse.get(), {p.batch, p.heads, p.q_len}, {p.heads * p.q_len, p.q_len, 1});
  }
  const attention::Call call = attention::validate_dense(name, q, k, v, &out_view, own);
  return attention::report(call, attention::choose(call, core::thread_count(), false));
}

void forget_attention_tuning() { attention::forget_tuning(); }

}  // namespace ditops
