// CPU feature detection and the dispatch level (ops/core/isa.hpp, include/ditops/runtime.hpp).

#include <cpuid.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ditops/runtime.hpp>

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

Isa detect_supported() {
  __builtin_cpu_init();
  if (has_avx512()) return Isa::avx512;
  if (has_avx2()) return Isa::avx2;
  if (has_sse4_2()) return Isa::sse4_2;
  return Isa::scalar;
}

bool plain_avx512_requested() {
  const char* cap = std::getenv("DITOPS_ISA");
  return cap != nullptr && std::strcmp(cap, "avx512bw") == 0;
}

Isa detect_active() {
  const Isa supported = supported_isa();
  const char* cap = std::getenv("DITOPS_ISA");
  if (cap == nullptr || *cap == '\0') return supported;
  if (plain_avx512_requested()) return std::min(Isa::avx512, supported);
  for (int level = 0; level < kIsaCount; ++level) {
    if (std::strcmp(cap, isa_name(static_cast<Isa>(level))) == 0) {
      return static_cast<Isa>(std::min(level, static_cast<int>(supported)));
    }
  }
  std::fprintf(stderr, "ditops: ignoring DITOPS_ISA=%s (expected scalar, sse4.2, avx2 or avx512)\n",
               cap);
  return supported;
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
    return active_isa() == Isa::avx512 && extensions ? kAvx512Bf16Variant
                                                     : static_cast<int>(active_isa());
  }();
  return variant;
}

const char* kernel_variant_name() noexcept { return kVariantNames[kernel_variant()]; }

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
  return info;
}

}  // namespace ditops
