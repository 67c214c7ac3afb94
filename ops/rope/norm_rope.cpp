// Public entry rms_norm_rotary_position_embedding: validate (x, out and the tables as
// rotary_position_embedding, the weight as rms_norm), describe the norm groups, run them in
// parallel.

#include <cmath>
#include <cstdint>
#include <ditops/rope.hpp>
#include <string>
#include <vector>

#include "ops/core/check.hpp"
#include "ops/core/threads.hpp"
#include "ops/rope/kernels.hpp"
#include "ops/rope/norm_rope_kernel.hpp"
#include "ops/rope/rope_tables.hpp"

namespace ditops {

void rms_norm_rotary_position_embedding(const TensorView& x, const TensorView& weight, float eps,
                                        const TensorView& cos, const TensorView& sin,
                                        const TensorView& out, RotatedMode mode, bool head_first) {
  constexpr const char* kCall = "rms_norm_rotary_position_embedding";
  const core::CallScope scope(kCall);
  using core::Arg;
  const Arg x_arg{kCall, "x", x}, weight_arg{kCall, "weight", weight}, cos_arg{kCall, "cos", cos},
      sin_arg{kCall, "sin", sin}, out_arg{kCall, "out", out};
  rope::check_rotated(x_arg, out_arg, mode);
  const std::int64_t dim = x.shape[3];
  if (!std::isfinite(eps) || eps < 0.f) {
    core::fail(kCall, "eps (" + std::to_string(eps) + ") must be finite and >= 0");
  }
  const int seq_dim = head_first ? 2 : 1, head_dim = head_first ? 1 : 2;
  // The norm group: weight [D] (or none) each head, [N * D] each token's heads together.
  std::int64_t heads = 1;
  if (!weight.empty()) {
    core::check_view(weight_arg, 1, 1);
    core::check_dtype(weight_arg, {DType::f32, x.dtype});
    const std::int64_t length = weight.shape[0], token_length = x.shape[head_dim] * dim;
    if (length != dim) {
      if (length != token_length) {
        core::fail(kCall, "weight.shape[0] (" + std::to_string(length) + ") must be D (" +
                              std::to_string(dim) + ", each head normalized) or N * D (" +
                              std::to_string(token_length) + ", each token's heads together)");
      }
      if (head_first) {
        core::fail(kCall, "weight of N * D (" + std::to_string(length) +
                              ") normalizes a token's heads together, which needs head_first = "
                              "false ([B, S, N, D])");
      }
      for (const Arg* arg : {&x_arg, &out_arg}) {
        if (arg->view.shape[2] > 1 && arg->view.strides[2] != dim) {
          core::fail(kCall, std::string(arg->name) + ".strides[2] (" +
                                std::to_string(arg->view.strides[2]) + ") must be D (" +
                                std::to_string(dim) +
                                "): a weight of N * D normalizes each token's heads together, "
                                "which must be contiguous");
        }
      }
      heads = x.shape[2];
    }
  }
  const auto tables = rope::check_tables(cos_arg, sin_arg, x_arg, out_arg, seq_dim);
  if (!weight.empty()) core::check_no_overlap(out_arg, weight_arg, false);

  rope::NormRopeProblem problem;
  problem.dtype = x.dtype;
  problem.table_dtype = cos.dtype;
  problem.dim = dim;
  problem.heads = heads;
  problem.mode = mode;
  problem.eps = eps;
  // One group per row of x, or per token ([B, S]) with its heads inside.
  problem.groups = core::row_layout_of(x);
  problem.groups.strides[rope::kNormOut] = core::row_layout_of(out).strides[0];
  problem.groups.strides[rope::kNormCos] = tables.cos;
  problem.groups.strides[rope::kNormSin] = tables.sin;
  if (heads > 1) {
    problem.groups.dims = 2;
    problem.groups.rows = x.shape[0] * x.shape[1];
    problem.head_strides[rope::kNormX] = dim;
    problem.head_strides[rope::kNormOut] = dim;
    problem.head_strides[rope::kNormCos] = tables.cos[2];
    problem.head_strides[rope::kNormSin] = tables.sin[2];
  }
  problem.x = x.data;
  problem.out = out.data;
  problem.cos = cos.data;
  problem.sin = sin.data;
  if (problem.groups.rows == 0 || heads == 0 || dim == 0) return;

  // The weight as floats, read only now that every check passed.
  std::vector<float> narrow_weight;
  if (!weight.empty() && weight.dtype != DType::f32) {
    narrow_weight.resize(static_cast<std::size_t>(weight.shape[0]));
    for (std::size_t i = 0; i < narrow_weight.size(); ++i) {
      narrow_weight[i] = weight.dtype == DType::bf16
                             ? static_cast<const bf16*>(weight.data)[i].to_float()
                             : static_cast<const f16*>(weight.data)[i].to_float();
    }
  }
  problem.weight = weight.empty()          ? nullptr
                   : narrow_weight.empty() ? static_cast<const float*>(weight.data)
                                           : narrow_weight.data();

  const auto kernel = rope::rope_kernels().norm_rope_groups;
  const std::int64_t written = problem.groups.rows * heads * dim * dtype_size(x.dtype);
  problem.stream = core::use_streaming_stores(written);
  core::parallel_ranges(
      problem.groups.rows, core::threads_for_bytes(2 * written),
      [&](std::int64_t begin, std::int64_t end, int) { kernel(problem, begin, end); });
}

}  // namespace ditops
