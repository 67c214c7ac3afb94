// Public entry merge_attention_states: validate, describe the rows, run them in parallel.

#include <ditops/attention.hpp>

#include "ops/attention/kernels.hpp"
#include "ops/attention/merge_kernel.hpp"
#include "ops/core/check.hpp"
#include "ops/core/threads.hpp"

namespace ditops {

void merge_attention_states(const TensorView& out_a, const TensorView& lse_a,
                            const TensorView& out_b, const TensorView& lse_b, const TensorView& out,
                            const TensorView& lse) {
  constexpr const char* kCall = "merge_attention_states";
  const core::CallScope scope(kCall);
  const core::Arg out_a_arg{kCall, "out_a", out_a}, out_b_arg{kCall, "out_b", out_b},
      out_arg{kCall, "out", out}, lse_a_arg{kCall, "lse_a", lse_a},
      lse_b_arg{kCall, "lse_b", lse_b}, lse_arg{kCall, "lse", lse};
  for (const core::Arg* arg : {&out_a_arg, &out_b_arg, &out_arg}) {
    core::check_view(*arg, 4, 4);
    core::check_dtype(*arg, {DType::f32, DType::bf16, DType::f16});
    if (arg != &out_a_arg) core::check_same_shape(*arg, out_a_arg);
  }
  for (const core::Arg* arg : {&lse_a_arg, &lse_b_arg, &lse_arg}) {
    core::check_view(*arg, 3, 3);
    core::check_dtype(*arg, {DType::f32});
    core::check_dim(*arg, 0, out_a_arg, 0);  // B
    core::check_dim(*arg, 1, out_a_arg, 2);  // N
    core::check_dim(*arg, 2, out_a_arg, 1);  // S
  }
  core::check_writable(out_arg);
  core::check_writable(lse_arg);
  for (const core::Arg* outputs : {&out_arg, &lse_arg}) {
    const bool is_out = outputs == &out_arg;
    core::check_no_overlap(*outputs, out_a_arg, /*identical_ok=*/is_out);
    core::check_no_overlap(*outputs, out_b_arg, /*identical_ok=*/is_out);
    core::check_no_overlap(*outputs, lse_a_arg, /*identical_ok=*/!is_out);
    core::check_no_overlap(*outputs, lse_b_arg, /*identical_ok=*/!is_out);
  }
  core::check_no_overlap(out_arg, lse_arg, /*identical_ok=*/false);

  attention::MergeProblem problem;
  problem.dtype_a = out_a.dtype;
  problem.dtype_b = out_b.dtype;
  problem.dtype_out = out.dtype;
  problem.dim = out_a.shape[3];
  problem.rows = core::row_layout_of(out_a);
  problem.rows.strides[attention::kOutB] = core::row_layout_of(out_b).strides[0];
  problem.rows.strides[attention::kOut] = core::row_layout_of(out).strides[0];
  // The lse tensors are [B, N, S]: their strides in the rows' [B, S, N] order.
  const std::pair<attention::MergeOperand, const TensorView*> lses[] = {
      {attention::kLseA, &lse_a}, {attention::kLseB, &lse_b}, {attention::kLse, &lse}};
  for (const auto& [operand, view] : lses) {
    problem.rows.strides[operand] = {view->strides[0], view->strides[2], view->strides[1]};
  }
  problem.out_a = out_a.data;
  problem.out_b = out_b.data;
  problem.out = out.data;
  problem.lse_a = static_cast<const float*>(lse_a.data);
  problem.lse_b = static_cast<const float*>(lse_b.data);
  problem.lse = static_cast<float*>(lse.data);
  if (problem.rows.rows == 0) return;
  const auto kernel = attention::attention_kernels().merge_attention_rows;
  const std::int64_t bytes =
      problem.rows.rows *
      (problem.dim * (dtype_size(out_a.dtype) + dtype_size(out_b.dtype) + dtype_size(out.dtype)) +
       12);
  core::parallel_ranges(
      problem.rows.rows, core::threads_for_bytes(bytes),
      [&](std::int64_t begin, std::int64_t end, int) { kernel(problem, begin, end); });
}

}  // namespace ditops
