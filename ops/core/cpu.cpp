// CPU feature detection and the dispatch level (ops/core/isa.hpp, include/ditops/runtime.hpp).

#include <cpuid.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ditops/runtime.hpp>
#include <string>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "ops/core/isa.hpp"
#include "ops/core/threads.hpp"

namespace ditops::core {
namespace {

// GCC's __builtin_cpu_supports also checks XCR0 (the OS saves the wide registers), which
// xsimd 8.1's own detection does not.

/// F16C (CPUID.1:ECX bit 29), read directly: clang's __builtin_cpu_supports does not know
/// "f16c" (the fuzz preset builds with clang). It is only ever asked beside AVX2 or AVX-512,
/// whose checks cover XCR0.
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") && has_f16c();
}
bool has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}
bool has_sse4_2() { return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt"); }
/// AVX-VNNI (CPUID.(EAX=7, ECX=1):EAX bit 4), read directly: GCC 12's __builtin_cpu_supports
/// has no "avxvnni" and clang's neither. Only ever asked beside AVX2, whose check covers XCR0.
bool has_avx_vnni_bit() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || eax < 1) return false;  // no subleaf 1
  __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx);
  return (eax & (1u << 4)) != 0;
}

Isa detect_supported() {
  __builtin_cpu_init();
  if (has_avx512()) return Isa::avx512;
  if (has_avx2()) return Isa::avx2;
  if (has_sse4_2()) return Isa::sse4_2;
  return Isa::scalar;
}

bool isa_env_is(const char* cap, const char* value) {
  return cap != nullptr && std::strcmp(cap, value) == 0;
}

bool plain_avx512_requested() { return isa_env_is(std::getenv("DITOPS_ISA"), "avx512bw"); }

Isa detect_active() {
  const Isa supported = supported_isa();
  const char* cap = std::getenv("DITOPS_ISA");
  if (cap == nullptr || *cap == '\0') return supported;
  if (plain_avx512_requested()) return std::min(Isa::avx512, supported);
  if (isa_env_is(cap, "avxvnni")) return std::min(Isa::avx2, supported);
  if (isa_env_is(cap, "amx")) return supported;
  for (int level = 0; level < kIsaCount; ++level) {
    if (std::strcmp(cap, isa_name(static_cast<Isa>(level))) == 0) {
      return static_cast<Isa>(std::min(level, static_cast<int>(supported)));
    }
  }
  std::fprintf(stderr,
               "ditops: ignoring DITOPS_ISA=%s (expected scalar, sse4.2, avx2, avxvnni, avx512bw, "
               "avx512 or amx)\n",
               cap);
  return supported;
}

/// Whether DITOPS_ISA names a level below AMX (one detect_active obeys): every value it takes
/// but amx.
bool caps_below_amx(const char* cap) {
  if (cap == nullptr || *cap == '\0' || isa_env_is(cap, "amx")) return false;
  if (isa_env_is(cap, "avx512bw") || isa_env_is(cap, "avxvnni")) return true;
  for (int level = 0; level < kIsaCount; ++level) {
    if (std::strcmp(cap, isa_name(static_cast<Isa>(level))) == 0) return true;
  }
  return false;  // ignored, as by detect_active
}

#if defined(DITOPS_AMX_COMPILED) && DITOPS_AMX_COMPILED
constexpr bool kAmxCompiled = true;
#else
constexpr bool kAmxCompiled = false;
#endif

/// Linux keeps the tile data (8 KiB of state) off until a process asks for it; the first tile
/// instruction of a process that did not ask faults. "" when granted.
std::string request_tile_permission() {
#if defined(__linux__)
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    return std::string("Linux refused the tile data (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  }
#endif
  return "";
}

struct AmxDecision {
  bool usable = false;
  std::string reason;
};

AmxDecision decide_amx(AmxUnit unit) {
  AmxDecision decision;
  decision.reason =
      amx_blocker(amx_support(), unit, std::getenv("DITOPS_ISA"), kernel_variant(), kAmxCompiled);
  if (decision.reason.empty()) {
    static const std::string permission = request_tile_permission();  // once per process
    decision.reason = permission;
  }
  decision.usable = decision.reason.empty();
  return decision;
}

const AmxDecision& amx_decision(AmxUnit unit) noexcept {
  // thread-safe, once per process and unit
  static const AmxDecision int8 = decide_amx(AmxUnit::int8), bf16 = decide_amx(AmxUnit::bf16);
  return unit == AmxUnit::int8 ? int8 : bf16;
}

}  // namespace

Isa supported_isa() noexcept {
  static const Isa level = detect_supported();
  return level;
}

Isa active_isa() noexcept {
  static const Isa level = detect_active();
  return level;
}

int kernel_variant() noexcept {
  static const int variant = [] {
    const bool extensions = __builtin_cpu_supports("avx512bf16") &&
                            __builtin_cpu_supports("avx512vnni") && !plain_avx512_requested();
    if (active_isa() == Isa::avx512 && extensions) return kAvx512Bf16Variant;
    if (avx_vnni_blocker(avx_vnni_supported(), std::getenv("DITOPS_ISA"), active_isa()).empty()) {
      return kAvx2VnniVariant;
    }
    return static_cast<int>(active_isa());
  }();
  return variant;
}

bool avx_vnni_supported() noexcept {
  static const bool supported = supported_isa() >= Isa::avx2 && has_avx_vnni_bit();
  return supported;
}

std::string avx_vnni_blocker(bool supported, const char* isa_env, Isa active) {
  if (!supported) return "the CPU has no AVX-VNNI";
  // avx2 is the level without its extension; a lower level caps it with the level.
  if (isa_env_is(isa_env, "avx2") || (active < Isa::avx2 && isa_env != nullptr)) {
    return std::string("DITOPS_ISA=") + isa_env + " caps it";
  }
  if (active != Isa::avx2) {
    return std::string("the ") + isa_name(active) + " level runs (avx2+vnni extends avx2)";
  }
  return "";
}

const char* kernel_variant_name() noexcept { return kVariantNames[kernel_variant()]; }

AmxSupport amx_support() noexcept {
  AmxSupport support;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    support.tile = (edx & (1u << 24)) != 0;
    support.int8 = (edx & (1u << 25)) != 0;
    support.bf16 = (edx & (1u << 22)) != 0;
  }
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) support.osxsave = (ecx & (1u << 27)) != 0;
  if (support.osxsave) {
    unsigned low = 0, high = 0;
    __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));  // XCR0
    support.xcr0 = (static_cast<std::uint64_t>(high) << 32) | low;
  }
  return support;
}

std::string amx_blocker(const AmxSupport& support, AmxUnit unit, const char* isa_env, int variant,
                        bool compiled) {
  if (!compiled) return "this build has no AMX kernels (no avx512+bf16+vnni variant compiled)";
  if (!support.tile) return "the CPU has no AMX-TILE";
  if (unit == AmxUnit::int8 && !support.int8) return "the CPU has no AMX-INT8";
  if (unit == AmxUnit::bf16 && !support.bf16) return "the CPU has no AMX-BF16";
  const std::uint64_t tile_state = kXcr0TileConfig | kXcr0TileData;
  if (!support.osxsave || (support.xcr0 & tile_state) != tile_state) {
    return "the OS does not enable the tile state (XCR0 XTILECFG and XTILEDATA)";
  }
  if (caps_below_amx(isa_env)) return std::string("DITOPS_ISA=") + isa_env + " caps it";
  if (variant != kAvx512Bf16Variant) {
    return std::string("the avx512+bf16+vnni kernel variant does not run (") +
           kVariantNames[variant] + " does)";
  }
  return "";
}

bool amx_usable(AmxUnit unit) noexcept { return amx_decision(unit).usable; }

const char* amx_reason(AmxUnit unit) noexcept { return amx_decision(unit).reason.c_str(); }

const char* isa_name(Isa isa) noexcept {
  const int level = static_cast<int>(isa);
  return level >= 0 && level < kIsaCount ? kVariantNames[level] : "unknown";
}

}  // namespace ditops::core

namespace ditops {

CpuInfo cpu_info() {
  __builtin_cpu_init();
  CpuInfo info{};
  info.isa = core::isa_name(core::active_isa());
  info.avx512 = core::supported_isa() == core::Isa::avx512;
  info.avx512_vnni = info.avx512 && __builtin_cpu_supports("avx512vnni");
  info.avx512_bf16 = info.avx512 && __builtin_cpu_supports("avx512bf16");
  info.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  info.f16c = core::has_f16c();
  info.physical_cores = core::physical_cores();
  const core::AmxSupport amx = core::amx_support();
  const std::uint64_t tile_state = core::kXcr0TileConfig | core::kXcr0TileData;
  info.bf16_dot_full_rate = (info.avx512_bf16 && __builtin_cpu_is("amd")) ||
                            (amx.tile && amx.bf16 && (amx.xcr0 & tile_state) == tile_state);
  return info;
}

}  // namespace ditops
