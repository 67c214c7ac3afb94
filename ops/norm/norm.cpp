// Public entries rms_norm and add_rms_norm: validate, describe the problem, run rows in parallel.

#include <algorithm>
#include <cmath>
#include <ditops/norm.hpp>
#include <vector>

#include "ops/core/check.hpp"
#include "ops/core/isa.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"
#include "ops/norm/norm_kernel.hpp"

namespace ditops {
namespace {

using core::Arg;

constexpr std::initializer_list<DType> kFloatTypes = {DType::f32, DType::bf16, DType::f16};

void check_eps(const char* call, float eps) {
  if (!std::isfinite(eps) || eps < 0.f) {
    core::fail(call, "eps (" + std::to_string(eps) + ") must be finite and >= 0");
  }
}

void check_weight(const Arg& weight, const Arg& x) {
  if (weight.view.empty()) return;
  core::check_view(weight, 1, 1);
  core::check_dtype(weight, {DType::f32, x.view.dtype});
  core::check_dim(weight, 0, x, x.view.rank - 1);
}

/// The (validated) weight as D floats when it is stored narrower; empty when f32 or absent.
std::vector<float> narrow_weight_as_f32(const TensorView& weight) {
  if (weight.empty() || weight.dtype == DType::f32) return {};
  std::vector<float> converted(static_cast<std::size_t>(weight.shape[0]));
  for (std::size_t i = 0; i < converted.size(); ++i) {
    converted[i] = weight.dtype == DType::bf16 ? static_cast<const bf16*>(weight.data)[i].to_float()
                                               : static_cast<const f16*>(weight.data)[i].to_float();
  }
  return converted;
}

/// Runs a validated problem; reads the weight only now, after every check passed.
void run(norm::NormProblem& problem, const TensorView& weight) {
  if (problem.rows.rows == 0 || problem.dim == 0) return;
  const std::vector<float> converted = narrow_weight_as_f32(weight);
  problem.weight = weight.empty()      ? nullptr
                   : converted.empty() ? static_cast<const float*>(weight.data)
                                       : converted.data();
  // A row whose sum of squares is finite has finite inputs; with a finite weight its outputs
  // hold no NaN, and their rounding to bf16 can skip the NaN case.
  problem.weight_finite =
      !problem.weight || std::all_of(problem.weight, problem.weight + problem.dim,
                                     [](float w) { return std::isfinite(w); });
  static const core::IsaTable<decltype(&norm::rms_norm_rows<xsimd::sse2>)> kernels =
      DITOPS_ISA_TABLE(norm::rms_norm_rows);
  const auto kernel = kernels.get();
  const int operands = problem.residual ? 4 : 2;  // tensors streamed through memory per element
  const std::int64_t bytes = problem.rows.rows * problem.dim * dtype_size(problem.dtype) * operands;
  const int threads = core::threads_for_bytes(bytes);
  problem.stream = core::use_streaming_stores(bytes / 2);  // half of the traffic is written
  // Scratch for h in fp32 (fused path): the rows of one pass per thread, each thread's on its
  // own cache lines.
  const std::size_t stride = core::per_thread_stride<float>(
      static_cast<std::size_t>(problem.dim * norm::rows_per_pass(problem.dim, problem.dtype)));
  core::AlignedBuffer<float> scratch(problem.residual ? stride * threads : 0);
  core::parallel_ranges(
      problem.rows.rows, threads, [&](std::int64_t begin, std::int64_t end, int thread) {
        kernel(problem, begin, end, scratch.empty() ? nullptr : scratch.data() + thread * stride);
      });
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  constexpr const char* kCall = "rms_norm";
  const core::CallScope scope(kCall);
  const Arg x_arg{kCall, "x", x}, weight_arg{kCall, "weight", weight}, out_arg{kCall, "out", out};
  core::check_view(x_arg, 1, kMaxRank);
  core::check_dtype(x_arg, kFloatTypes);
  core::check_view(out_arg, 1, kMaxRank);
  core::check_same_dtype(out_arg, x_arg);
  core::check_same_shape(out_arg, x_arg);
  check_eps(kCall, eps);
  check_weight(weight_arg, x_arg);
  core::check_writable(out_arg);
  core::check_no_overlap(out_arg, x_arg, /*identical_ok=*/true);
  if (!weight.empty()) core::check_no_overlap(out_arg, weight_arg, false);

  norm::NormProblem problem;
  problem.dtype = x.dtype;
  problem.dim = x.shape[x.rank - 1];
  problem.rows = core::row_layout_of(x);
  problem.rows.strides[norm::kOut] = core::row_layout_of(out).strides[0];
  problem.x = x.data;
  problem.eps = eps;
  problem.out = out.data;
  run(problem, weight);
}

void add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView& weight,
                  float eps, const TensorView& out, const TensorView& sum_out) {
  constexpr const char* kCall = "add_rms_norm";
  const core::CallScope scope(kCall);
  const Arg x_arg{kCall, "x", x}, residual_arg{kCall, "residual", residual},
      weight_arg{kCall, "weight", weight}, out_arg{kCall, "out", out},
      sum_arg{kCall, "sum_out", sum_out};
  core::check_view(x_arg, 1, kMaxRank);
  core::check_dtype(x_arg, kFloatTypes);
  for (const Arg* arg : {&residual_arg, &out_arg, &sum_arg}) {
    core::check_view(*arg, 1, kMaxRank);
    core::check_same_dtype(*arg, x_arg);
    core::check_same_shape(*arg, x_arg);
  }
  check_eps(kCall, eps);
  check_weight(weight_arg, x_arg);
  for (const Arg* output : {&out_arg, &sum_arg}) {
    core::check_writable(*output);
    core::check_no_overlap(*output, x_arg, /*identical_ok=*/true);
    core::check_no_overlap(*output, residual_arg, /*identical_ok=*/true);
    if (!weight.empty()) core::check_no_overlap(*output, weight_arg, false);
  }
  core::check_no_overlap(out_arg, sum_arg, false);

  norm::NormProblem problem;
  problem.dtype = x.dtype;
  problem.dim = x.shape[x.rank - 1];
  problem.rows = core::row_layout_of(x);
  problem.rows.strides[norm::kResidual] = core::row_layout_of(residual).strides[0];
  problem.rows.strides[norm::kOut] = core::row_layout_of(out).strides[0];
  problem.rows.strides[norm::kSumOut] = core::row_layout_of(sum_out).strides[0];
  problem.x = x.data;
  problem.residual = residual.data;
  problem.eps = eps;
  problem.out = out.data;
  problem.sum_out = sum_out.data;
  run(problem, weight);
}

}  // namespace ditops
