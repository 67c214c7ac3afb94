#pragma once
// ISA levels and run-time dispatch. Baseline-safe: this header names xsimd architectures but
// never instantiates a batch, so any translation unit may include it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <xsimd/xsimd.hpp>

#include "ops/core/isa_variants.hpp"  // generated from cmake/DitopsKernels.cmake

namespace ditops::core {

/// Dispatch levels, lowest first. `scalar` is the x86-64 baseline build (SSE2, which every
/// x86-64 CPU has); each level's kernels are compiled with that level's flags only.
enum class Isa : int { scalar = 0, sse4_2 = 1, avx2 = 2, avx512 = 3 };
inline constexpr int kIsaCount = 4;

/// The level this process dispatches to: the best the CPU and OS support, capped by DITOPS_ISA
/// (a level's name, avx512bw, avxvnni: the avx2 level, or amx: the best the CPU has, as when it
/// is unset).
/// Resolved once, at first use.
Isa active_isa() noexcept;
/// Best level the CPU and OS support, ignoring DITOPS_ISA.
Isa supported_isa() noexcept;
/// "scalar", "sse4.2", "avx2", "avx512".
const char* isa_name(Isa isa) noexcept;

/// Kernels are compiled in two more variants than there are levels, each an extension of a
/// level (cmake/DitopsKernels.cmake lists them after the levels):
/// - avx512 with AVX512-BF16 and AVX512-VNNI (single-instruction bf16 rounding and dot
///   products, int8 dot products). It runs when the level is avx512 and the CPU has both
///   extensions, unless DITOPS_ISA=avx512bw asks for plain AVX-512.
/// - avx2 with AVX-VNNI (vpdpbusd on ymm, VEX-encoded: Alder Lake and later Core, Xeon 6
///   E-cores; Sapphire Rapids and later Xeons beside AVX-512): the int8 kernels multiply u8 by
///   s8 in one instruction where AVX2 needs the pmaddubsw sign trick. It runs when the level is
///   avx2 (the CPU has no AVX-512, or DITOPS_ISA=avxvnni caps it there) and the CPU has
///   AVX-VNNI, unless DITOPS_ISA=avx2 asks for plain AVX2.
/// So tests can cover a level with and without its extension on one machine.
inline constexpr int kKernelVariants = DITOPS_KERNEL_VARIANT_COUNT;
inline constexpr int kAvx512Bf16Variant = kIsaCount;
inline constexpr int kAvx2VnniVariant = kIsaCount + 1;
static_assert(kKernelVariants == kIsaCount + 2,
              "cmake/DitopsKernels.cmake lists one variant per Isa level, then avx512bf16 and "
              "avx2vnni");
/// Names of the variants, by index ("scalar", "sse4.2", "avx2", "avx512", "avx512+bf16+vnni",
/// "avx2+vnni").
inline constexpr const char* kVariantNames[kKernelVariants] = {DITOPS_KERNEL_VARIANT_NAMES};
/// Index of the kernel variant this process runs (the Isa level, kAvx512Bf16Variant or
/// kAvx2VnniVariant).
int kernel_variant() noexcept;
/// kVariantNames of kernel_variant().
const char* kernel_variant_name() noexcept;

/// Whether the CPU has AVX-VNNI (CPUID.(EAX=7, ECX=1):EAX bit 4) and the OS saves the ymm state.
bool avx_vnni_supported() noexcept;
/// Why the avx2+vnni variant does not run ("" when it does), e.g. "the CPU has no AVX-VNNI" or
/// "DITOPS_ISA=avx2 caps it".
std::string avx_vnni_blocker(bool supported, const char* isa_env, Isa active);

/// AMX (Intel's tile units): not a level of its own but alternative kernels of the
/// avx512+bf16+vnni variant, one per unit (AMX-INT8: the W8A8 linear layers' int8 GEMM;
/// AMX-BF16: the bf16 kernels). A unit is used when the CPU has AMX-TILE and it, the OS saves the
/// tile state (XCR0 bits 17 and 18) and, on Linux, grants this process the tile data (arch_prctl
/// ARCH_REQ_XCOMP_PERM, asked once), the avx512+bf16+vnni variant runs, and DITOPS_ISA is unset or
/// `amx` (any level, `avx512` included, caps it off). Resolved once per unit, at first use.
enum class AmxUnit : int { int8 = 0, bf16 = 1 };
bool amx_usable(AmxUnit unit) noexcept;
/// Why the unit is not used ("" when it is), e.g. "the CPU has no AMX-TILE" or
/// "DITOPS_ISA=avx512 caps it".
const char* amx_reason(AmxUnit unit) noexcept;

/// What the CPU and OS say about AMX: CPUID.(EAX=7, ECX=0):EDX and XCR0.
struct AmxSupport {
  bool tile = false;     ///< AMX-TILE (EDX bit 24)
  bool int8 = false;     ///< AMX-INT8 (EDX bit 25)
  bool bf16 = false;     ///< AMX-BF16 (EDX bit 22)
  bool osxsave = false;  ///< CPUID.1:ECX bit 27: XGETBV reads XCR0
  std::uint64_t xcr0 = 0;
};
inline constexpr std::uint64_t kXcr0TileConfig = 1ull << 17, kXcr0TileData = 1ull << 18;
/// This CPU's.
AmxSupport amx_support() noexcept;
/// The decision before the permission request: why the unit is not used with this support,
/// DITOPS_ISA (null when unset), kernel variant, and whether the library has the AMX kernels;
/// "" when nothing but the permission stands in the way.
std::string amx_blocker(const AmxSupport& support, AmxUnit unit, const char* isa_env, int variant,
                        bool compiled);

/// One entry per kernel variant, in level order. An operator family keeps one table, of a
/// struct of its kernels (one function pointer per kernel template), built once at compile time
/// from a builder `template <class Arch> constexpr T builder()` by DITOPS_KERNEL_TABLE; a call
/// reads one entry: get() for the variant this process runs, of(variant) for a variant fixed
/// earlier (a linear layer runs the variant its weight panels were packed for).
/// Usage: static constexpr IsaTable<FamilyKernels> table = DITOPS_KERNEL_TABLE(builder);
template <class T>
struct IsaTable {
  std::array<T, kKernelVariants> by_variant;
  const T& get() const noexcept { return of(kernel_variant()); }
  const T& of(int variant) const noexcept { return by_variant[static_cast<std::size_t>(variant)]; }
};

}  // namespace ditops::core

namespace ditops {
/// The xsimd architecture of the extension variant: AVX-512 (F/CD/DQ/BW/VL) plus AVX512-BF16
/// and AVX512-VNNI, which xsimd 8.1 has no tag for. A tag only here; kernel sources get its
/// registers from ops/core/arch.hpp.
struct avx512_bf16 : xsimd::avx512bw {
  static constexpr char const* name() noexcept { return "avx512_bf16"; }
};
/// The xsimd architecture of the avx2+vnni variant: AVX2 and FMA plus AVX-VNNI, which xsimd 8.1
/// has no tag for either. A tag only here; kernel sources get its registers from
/// ops/core/arch.hpp.
struct avx2_vnni : xsimd::fma3<xsimd::avx2> {
  static constexpr char const* name() noexcept { return "avx2_vnni"; }
};
/// avx2_vnni on the software model of vpdpbusd (DITOPS_AVXVNNI_MODEL=1, ops/core/arch.hpp): the
/// avx2+vnni kernels, their u8 x s8 dot products computed exactly with AVX2 instructions, so the
/// tests run them on any AVX2 CPU. Its own tag, so the model's instantiations never share a
/// symbol with the library's.
struct avx2_vnni_model : avx2_vnni {
  static constexpr char const* name() noexcept { return "avx2_vnni_model"; }
};
}  // namespace ditops

namespace ditops::core {
/// The xsimd architecture of each kernel variant, by level (ops/core/arch.hpp picks a kernel
/// source's own from it).
using KernelArchs = std::tuple<DITOPS_KERNEL_ARCHS>;
}  // namespace ditops::core

// An IsaTable's initializer: `builder<Arch>()` for the architecture of every variant, in level
// order (a level left out of the build gets the architecture it runs, see isa_variants.hpp).
#define DITOPS_KERNEL_TABLE_ITEM(builder, Arch) builder<Arch>(),
#define DITOPS_KERNEL_TABLE(builder)                                   \
  {                                                                    \
    { DITOPS_FOR_EACH_KERNEL_ARCH(DITOPS_KERNEL_TABLE_ITEM, builder) } \
  }
