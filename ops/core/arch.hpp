#pragma once
// Included only by kernel sources, which cmake/DitopsKernels.cmake compiles once per ISA level
// with DITOPS_ISA_LEVEL set: KernelArch is the xsimd architecture of this compilation.

#include <xsimd/xsimd.hpp>

#ifndef DITOPS_ISA_LEVEL
#error "kernel sources are compiled per ISA level by ditops_add_kernels()"
#endif

namespace ditops {
#if DITOPS_ISA_LEVEL == 0
using KernelArch = xsimd::sse2;
#elif DITOPS_ISA_LEVEL == 1
using KernelArch = xsimd::sse4_2;
#elif DITOPS_ISA_LEVEL == 2
using KernelArch = xsimd::fma3<xsimd::avx2>;
#elif DITOPS_ISA_LEVEL == 3
using KernelArch = xsimd::avx512bw;
#else
#error "unknown DITOPS_ISA_LEVEL"
#endif
static_assert(KernelArch::supported(), "compile flags do not enable this ISA level");
}  // namespace ditops
