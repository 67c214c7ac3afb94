// The attention-state merge, compiled once per ISA level (cmake/DitopsKernels.cmake). A
// streaming operator: two rows read and one written per (b, s, n), with the two weights
// computed once per row from the lse pair.

#include "ops/attention/merge_kernel.hpp"

#include <cmath>

#include "ops/core/arch.hpp"
#include "ops/core/log2_domain.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/row_chunks.hpp"

namespace ditops::attention {
namespace {

/// out[0, dim) = weight_a · a + weight_b · b; a side of weight 0 is not read (a row whose lse is
/// -inf may hold anything, NaN included, and must not leak into the other side's result).
template <class Arch, class TA, class TB, class TO>
void merge_row(const TA* a, float weight_a, const TB* b, float weight_b, TO* out,
               std::int64_t dim) noexcept {
  using B = simd::F32<Arch>;
  constexpr std::int64_t kLanes = B::size;
  const B wa(weight_a), wb(weight_b);
  for (std::int64_t i = 0; i < dim; i += kLanes) {
    const auto count = static_cast<std::size_t>(std::min(kLanes, dim - i));
    B value(0.f);
    if (weight_a != 0.f) value = wa * simd::load_chunk<Arch>(a, static_cast<std::size_t>(i), count);
    if (weight_b != 0.f)
      value = simd::fmadd<Arch>(wb, simd::load_chunk<Arch>(b, static_cast<std::size_t>(i), count),
                                value);
    simd::store_chunk<Arch>(out, static_cast<std::size_t>(i), count, value, /*stream=*/false);
  }
}

template <class Arch, class TA, class TB, class TO>
void merge_typed(const MergeProblem& p, std::int64_t begin, std::int64_t end) noexcept {
  core::RowWalker<6> walker(p.rows, begin);
  for (std::int64_t r = begin; r < end; ++r, walker.next()) {
    const float lse_a = p.lse_a[walker.offset(kLseA)];
    const float lse_b = p.lse_b[walker.offset(kLseB)];
    // One weight is exactly 1 and the other e^-(difference); a NaN lse makes both NaN.
    const float top = lse_a > lse_b ? lse_a : lse_b;
    float weight_a = 0.f, weight_b = 0.f, lse = core::kMinusInf;
    if (top != core::kMinusInf) {
      weight_a = std::exp(lse_a - top);
      weight_b = std::exp(lse_b - top);
      const float total = weight_a + weight_b;
      lse = top + std::log(total);
      weight_a /= total;
      weight_b /= total;
    }
    merge_row<Arch>(static_cast<const TA*>(p.out_a) + walker.offset(kOutA), weight_a,
                    static_cast<const TB*>(p.out_b) + walker.offset(kOutB), weight_b,
                    static_cast<TO*>(p.out) + walker.offset(kOut), p.dim);
    p.lse[walker.offset(kLse)] = lse;
  }
}

/// Calls f with a value of the element type `dtype` names (f32, bf16 or f16).
template <class F>
void with_float_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::bf16:
      return f(bf16{});
    case DType::f16:
      return f(f16{});
    default:
      return f(float{});
  }
}

}  // namespace

template <class Arch>
void merge_attention_rows(const MergeProblem& problem, std::int64_t begin,
                          std::int64_t end) noexcept {
  with_float_type(problem.dtype_a, [&](auto a) {
    with_float_type(problem.dtype_b, [&](auto b) {
      with_float_type(problem.dtype_out, [&](auto out) {
        merge_typed<Arch, decltype(a), decltype(b), decltype(out)>(problem, begin, end);
      });
    });
  });
}

template void merge_attention_rows<KernelArch>(const MergeProblem&, std::int64_t,
                                               std::int64_t) noexcept;

}  // namespace ditops::attention
