// The CFG combine, compiled once per ISA level (cmake/DitopsKernels.cmake). A streaming
// operator: two reads and one write per element, one FMA between them.

#include "ops/guidance/guidance_kernel.hpp"

#include "ops/core/arch.hpp"
#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/partial.hpp"

namespace ditops::guidance {
namespace {

template <class Arch, class T>
void combine_typed(const CombineProblem& p, std::int64_t begin, std::int64_t end) noexcept {
  using B = simd::F32<Arch>;
  constexpr std::int64_t kLanes = B::size;
  const B scale(p.scale);
  core::RowWalker<3> walker(p.rows, begin);
  for (std::int64_t r = begin; r < end; ++r, walker.next()) {
    const T* cond = static_cast<const T*>(p.cond) + walker.offset(kCond);
    const T* uncond = static_cast<const T*>(p.uncond) + walker.offset(kUncond);
    T* out = static_cast<T*>(p.out) + walker.offset(kOut);
    std::int64_t i = 0;
    for (; i + kLanes <= p.dim; i += kLanes) {
      const B base = simd::load<Arch>(uncond + i);
      simd::store<Arch>(out + i, simd::fmadd<Arch>(scale, simd::load<Arch>(cond + i) - base, base));
    }
    if (i < p.dim) {
      const auto count = static_cast<std::size_t>(p.dim - i);
      const B base = simd::load_partial<Arch>(uncond + i, count, 0.f);
      const B value =
          simd::fmadd<Arch>(scale, simd::load_partial<Arch>(cond + i, count, 0.f) - base, base);
      simd::store_partial<Arch>(out + i, value, count);
    }
  }
}

}  // namespace

template <class Arch>
void cfg_combine_rows(const CombineProblem& problem, std::int64_t begin,
                      std::int64_t end) noexcept {
  switch (problem.dtype) {
    case DType::bf16:
      combine_typed<Arch, bf16>(problem, begin, end);
      break;
    case DType::f16:
      combine_typed<Arch, f16>(problem, begin, end);
      break;
    default:
      combine_typed<Arch, float>(problem, begin, end);
      break;
  }
}

template void cfg_combine_rows<KernelArch>(const CombineProblem&, std::int64_t,
                                           std::int64_t) noexcept;

}  // namespace ditops::guidance
