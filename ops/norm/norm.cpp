// Public entries rms_norm, add_rms_norm, layer_norm and layer_norm_scale_shift: validate, describe
// the problem, run rows in parallel.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <ditops/norm.hpp>
#include <string>
#include <vector>

#include "ops/core/check.hpp"
#include "ops/core/isa.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"
#include "ops/norm/norm_kernel.hpp"

namespace ditops {
namespace {

using core::Arg;

/// The norm family's kernels of one variant (the member types: any instantiation's).
struct NormKernels {
  decltype(&norm::rms_norm_rows<xsimd::sse2>) rms_norm_rows;      ///< rms_norm, add_rms_norm
  decltype(&norm::layer_norm_rows<xsimd::sse2>) layer_norm_rows;  ///< layer_norm (+ scale, shift)
};

template <class Arch>
constexpr NormKernels norm_kernels_of() {
  return {&norm::rms_norm_rows<Arch>, &norm::layer_norm_rows<Arch>};
}

/// The kernels of the variant this process runs. The table is constexpr: built at compile
/// time, read without an initialization guard.
const NormKernels& norm_kernels() {
  static constexpr core::IsaTable<NormKernels> table = DITOPS_KERNEL_TABLE(norm_kernels_of);
  return table.get();
}

constexpr std::initializer_list<DType> kFloatTypes = {DType::f32, DType::bf16, DType::f16};

void check_eps(const char* call, float eps) {
  if (!std::isfinite(eps) || eps < 0.f) {
    core::fail(call, "eps (" + std::to_string(eps) + ") must be finite and >= 0");
  }
}

/// A per-channel vector (weight, bias): empty, or [D] in f32 or the dtype of x.
void check_per_channel(const Arg& vector, const Arg& x) {
  if (vector.view.empty()) return;
  core::check_view(vector, 1, 1);
  core::check_dtype(vector, {DType::f32, x.view.dtype});
  core::check_dim(vector, 0, x, x.view.rank - 1);
}

/// A (validated) per-channel vector as D floats when it is stored narrower; empty when f32 or
/// absent.
std::vector<float> narrow_as_f32(const TensorView& vector) {
  if (vector.empty() || vector.dtype == DType::f32) return {};
  std::vector<float> converted(static_cast<std::size_t>(vector.shape[0]));
  for (std::size_t i = 0; i < converted.size(); ++i) {
    converted[i] = vector.dtype == DType::bf16 ? static_cast<const bf16*>(vector.data)[i].to_float()
                                               : static_cast<const f16*>(vector.data)[i].to_float();
  }
  return converted;
}

bool all_finite(const float* values, std::int64_t count) {
  return !values ||
         std::all_of(values, values + count, [](float value) { return std::isfinite(value); });
}

/// Runs a validated problem; reads the weight only now, after every check passed.
void run(norm::NormProblem& problem, const TensorView& weight) {
  if (problem.rows.rows == 0 || problem.dim == 0) return;
  const std::vector<float> converted = narrow_as_f32(weight);
  problem.weight = weight.empty()      ? nullptr
                   : converted.empty() ? static_cast<const float*>(weight.data)
                                       : converted.data();
  // A row whose sum of squares is finite has finite inputs; with a finite weight its outputs
  // hold no NaN, and their rounding to bf16 can skip the NaN case.
  problem.weight_finite = all_finite(problem.weight, problem.dim);
  const auto kernel = norm_kernels().rms_norm_rows;
  const int operands = problem.residual ? 4 : 2;  // tensors streamed through memory per element
  const std::int64_t bytes = problem.rows.rows * problem.dim * dtype_size(problem.dtype) * operands;
  const int threads = core::threads_for_bytes(bytes);
  // Streamed from 32 MiB written (half of the traffic); long f16 rows split between threads
  // from 32 MiB of traffic: their conversions are single instructions, so the threads wait on
  // memory, where skipping the read for ownership pays (AMD Zen 3, AVX2, [4096, 3072] f16, 2
  // threads: 3.6 vs 4.1-4.3 ms; 1 thread, short rows and bf16, which convert at more cost:
  // no gain or a loss).
  problem.stream =
      core::use_streaming_stores(bytes / 2) ||
      (problem.dtype == DType::f16 && threads > 1 &&
       norm::rows_per_pass(problem.dim, problem.dtype) == 1 && core::use_streaming_stores(bytes));
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

/// Strides that walk scale or shift along x's leading dims: x's rank, each leading extent x's
/// or 1 (broadcast: stride 0), the last one D.
std::array<std::int64_t, kMaxRank> modulation_strides(const Arg& modulation, const Arg& x) {
  const TensorView& m = modulation.view;
  const int rank = x.view.rank;
  core::check_view(modulation, rank, rank);
  core::check_dim(modulation, rank - 1, x, rank - 1);
  std::array<std::int64_t, kMaxRank> strides{};
  for (int d = 0; d < rank - 1; ++d) {
    if (m.shape[d] == x.view.shape[d]) {
      strides[d] = m.shape[d] == 1 ? 0 : m.strides[d];
    } else if (m.shape[d] != 1) {
      core::fail(modulation.call, std::string(modulation.name) + ".shape[" + std::to_string(d) +
                                      "] (" + std::to_string(m.shape[d]) +
                                      ") must be 1 or equal x.shape[" + std::to_string(d) + "] (" +
                                      std::to_string(x.view.shape[d]) + ")");
    }
  }
  return strides;
}

/// layer_norm and layer_norm_scale_shift (scale and shift empty or both given).
void run_layer_norm(const char* call, const TensorView& x, const TensorView& weight,
                    const TensorView& bias, const TensorView& scale, const TensorView& shift,
                    float eps, const TensorView& out) {
  const core::CallScope scope(call);
  const Arg x_arg{call, "x", x}, weight_arg{call, "weight", weight}, bias_arg{call, "bias", bias},
      scale_arg{call, "scale", scale}, shift_arg{call, "shift", shift}, out_arg{call, "out", out};
  core::check_view(x_arg, 1, kMaxRank);
  core::check_dtype(x_arg, kFloatTypes);
  core::check_view(out_arg, 1, kMaxRank);
  core::check_same_dtype(out_arg, x_arg);
  core::check_same_shape(out_arg, x_arg);
  check_eps(call, eps);
  check_per_channel(weight_arg, x_arg);
  check_per_channel(bias_arg, x_arg);
  const bool modulated = !scale.empty();
  if (scale.empty() != shift.empty()) {
    core::fail(call, std::string(modulated ? "shift" : "scale") + " is empty but " +
                         (modulated ? "scale" : "shift") + " is not: give both or neither");
  }
  norm::LayerNormProblem problem;
  problem.rows = core::row_layout_of(x);
  if (modulated) {
    problem.rows.strides[norm::LayerNormProblem::kScale] = modulation_strides(scale_arg, x_arg);
    problem.rows.strides[norm::LayerNormProblem::kShift] = modulation_strides(shift_arg, x_arg);
    core::check_dtype(scale_arg, {DType::f32, x.dtype});
    core::check_same_dtype(shift_arg, scale_arg);
  }
  core::check_writable(out_arg);
  core::check_no_overlap(out_arg, x_arg, /*identical_ok=*/true);
  for (const Arg* input : {&weight_arg, &bias_arg, &scale_arg, &shift_arg}) {
    if (!input->view.empty()) core::check_no_overlap(out_arg, *input, false);
  }

  problem.dtype = x.dtype;
  problem.modulation_dtype = scale.dtype;
  problem.dim = x.shape[x.rank - 1];
  problem.rows.strides[norm::LayerNormProblem::kOutput] = core::row_layout_of(out).strides[0];
  problem.x = x.data;
  problem.out = out.data;
  problem.scale = scale.data;
  problem.shift = shift.data;
  problem.eps = eps;
  if (problem.rows.rows == 0 || problem.dim == 0) return;

  // Weight and bias as floats; with modulation the kernel folds or applies both, so an absent
  // one becomes ones or zeros there.
  const auto dim = static_cast<std::size_t>(problem.dim);
  const std::vector<float> narrow_weight = narrow_as_f32(weight), narrow_bias = narrow_as_f32(bias);
  std::vector<float> ones, zeros;
  const auto as_f32 = [&](const TensorView& vector, const std::vector<float>& converted,
                          std::vector<float>& neutral, float neutral_value) -> const float* {
    if (!converted.empty()) return converted.data();
    if (!vector.empty()) return static_cast<const float*>(vector.data);
    if (!modulated) return nullptr;
    neutral.assign(dim, neutral_value);
    return neutral.data();
  };
  problem.weight = as_f32(weight, narrow_weight, ones, 1.f);
  problem.bias = as_f32(bias, narrow_bias, zeros, 0.f);
  // A row whose statistics are in range has finite inputs; with a finite weight and bias its
  // outputs hold no NaN, and their rounding to bf16 can skip the NaN case.
  problem.affine_finite =
      all_finite(problem.weight, problem.dim) && all_finite(problem.bias, problem.dim);
  // Rows that share scale and shift one after the other ([B, 1, D] for x [B, S, D], S > 1).
  const int inner = problem.rows.dims - 1;
  problem.modulation_repeats = modulated && inner >= 0 && problem.rows.shape[inner] > 1 &&
                               problem.rows.strides[norm::LayerNormProblem::kScale][inner] == 0 &&
                               problem.rows.strides[norm::LayerNormProblem::kShift][inner] == 0;

  const auto kernel = norm_kernels().layer_norm_rows;
  const std::int64_t written = problem.rows.rows * problem.dim * dtype_size(problem.dtype);
  // x read and out written; per-token scale and shift are streamed as well.
  const std::int64_t bytes =
      2 * written + (modulated && !problem.modulation_repeats
                         ? 2 * problem.rows.rows * problem.dim * dtype_size(scale.dtype)
                         : 0);
  const int threads = core::threads_for_bytes(bytes);
  problem.stream = core::use_streaming_stores(written);
  const std::size_t stride =
      core::per_thread_stride<float>(norm::layer_norm_scratch_floats(problem));
  core::AlignedBuffer<float> scratch(stride * threads);
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
  check_per_channel(weight_arg, x_arg);
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
  check_per_channel(weight_arg, x_arg);
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

void layer_norm(const TensorView& x, const TensorView& weight, const TensorView& bias, float eps,
                const TensorView& out) {
  run_layer_norm("layer_norm", x, weight, bias, {}, {}, eps, out);
}

void layer_norm_scale_shift(const TensorView& x, const TensorView& weight, const TensorView& bias,
                            const TensorView& scale, const TensorView& shift, float eps,
                            const TensorView& out) {
  run_layer_norm("layer_norm_scale_shift", x, weight, bias, scale, shift, eps, out);
}

}  // namespace ditops
