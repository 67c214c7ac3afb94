#pragma once
// ISA levels and run-time dispatch. Baseline-safe: this header names xsimd architectures but
// never instantiates a batch, so any translation unit may include it.

#include <array>
#include <xsimd/xsimd.hpp>

namespace ditops::core {

/// Dispatch levels, lowest first. `scalar` is the x86-64 baseline build (SSE2, which every
/// x86-64 CPU has); each level's kernels are compiled with that level's flags only.
enum class Isa : int { scalar = 0, sse4_2 = 1, avx2 = 2, avx512 = 3 };
inline constexpr int kIsaCount = 4;

/// The level this process dispatches to: the best the CPU and OS support, capped by DITOPS_ISA.
/// Resolved once, at first use.
Isa active_isa() noexcept;
/// Best level the CPU and OS support, ignoring DITOPS_ISA.
Isa supported_isa() noexcept;
/// "scalar", "sse4.2", "avx2", "avx512".
const char* isa_name(Isa isa) noexcept;

/// One entry per level, in Isa order: the instantiations of a kernel template.
/// Usage: static const IsaTable<Fn> table = DITOPS_ISA_TABLE(kernel_template);
template <class Fn>
struct IsaTable {
  std::array<Fn, kIsaCount> by_level;
  Fn get() const noexcept { return by_level[static_cast<int>(active_isa())]; }
};

}  // namespace ditops::core

// The xsimd architecture each level instantiates (must match ops/core/arch.hpp).
#define DITOPS_ISA_TABLE(kernel)                                                       \
  {                                                                                    \
    {                                                                                  \
      &kernel<xsimd::sse2>, &kernel<xsimd::sse4_2>, &kernel<xsimd::fma3<xsimd::avx2>>, \
          &kernel<xsimd::avx512bw>                                                     \
    }                                                                                  \
  }
