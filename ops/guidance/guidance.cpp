// Public entry cfg_combine: validate, describe the rows, run them in parallel.

#include <cmath>
#include <ditops/guidance.hpp>
#include <string>

#include "ops/core/check.hpp"
#include "ops/core/isa.hpp"
#include "ops/core/threads.hpp"
#include "ops/guidance/guidance_kernel.hpp"

namespace ditops {
namespace {

/// The guidance family's kernels of one variant (the member types: any instantiation's).
struct GuidanceKernels {
  decltype(&guidance::cfg_combine_rows<xsimd::sse2>) cfg_combine_rows;  ///< cfg_combine
};

template <class Arch>
constexpr GuidanceKernels guidance_kernels_of() {
  return {&guidance::cfg_combine_rows<Arch>};
}

/// The kernels of the variant this process runs. The table is constexpr: built at compile
/// time, read without an initialization guard.
const GuidanceKernels& guidance_kernels() {
  static constexpr core::IsaTable<GuidanceKernels> table = DITOPS_KERNEL_TABLE(guidance_kernels_of);
  return table.get();
}

}  // namespace

void cfg_combine(const TensorView& cond, const TensorView& uncond, float scale,
                 const TensorView& out) {
  constexpr const char* kCall = "cfg_combine";
  const core::CallScope scope(kCall);
  const core::Arg cond_arg{kCall, "cond", cond}, uncond_arg{kCall, "uncond", uncond},
      out_arg{kCall, "out", out};
  core::check_view(cond_arg, 1, kMaxRank);
  core::check_dtype(cond_arg, {DType::f32, DType::bf16, DType::f16});
  for (const core::Arg* arg : {&uncond_arg, &out_arg}) {
    core::check_view(*arg, 1, kMaxRank);
    core::check_same_dtype(*arg, cond_arg);
    core::check_same_shape(*arg, cond_arg);
  }
  if (!std::isfinite(scale))
    core::fail(kCall, "scale (" + std::to_string(scale) + ") must be finite");
  core::check_writable(out_arg);
  core::check_no_overlap(out_arg, cond_arg, /*identical_ok=*/true);
  core::check_no_overlap(out_arg, uncond_arg, /*identical_ok=*/true);

  guidance::CombineProblem problem;
  problem.dtype = cond.dtype;
  problem.dim = cond.shape[cond.rank - 1];
  problem.rows = core::row_layout_of(cond);
  problem.rows.strides[guidance::kUncond] = core::row_layout_of(uncond).strides[0];
  problem.rows.strides[guidance::kOut] = core::row_layout_of(out).strides[0];
  problem.cond = cond.data;
  problem.uncond = uncond.data;
  problem.out = out.data;
  problem.scale = scale;
  if (problem.rows.rows == 0 || problem.dim == 0) return;
  const auto kernel = guidance_kernels().cfg_combine_rows;
  const std::int64_t bytes = problem.rows.rows * problem.dim * dtype_size(problem.dtype) * 3;
  core::parallel_ranges(
      problem.rows.rows, core::threads_for_bytes(bytes),
      [&](std::int64_t begin, std::int64_t end, int) { kernel(problem, begin, end); });
}

}  // namespace ditops
