#pragma once
// Included only by kernel sources, which cmake/DitopsKernels.cmake compiles once per ISA level
// with DITOPS_ISA_LEVEL set: KernelArch is the xsimd architecture of this compilation.

#include <xsimd/xsimd.hpp>

#include "ops/core/isa.hpp"

#ifndef DITOPS_ISA_LEVEL
#error "kernel sources are compiled per ISA level by ditops_add_kernels()"
#endif

namespace ditops {
#if defined(DITOPS_AVXVNNI_MODEL) && DITOPS_AVXVNNI_MODEL
// The tests' build of avx2+vnni kernels on the software model of vpdpbusd (ops/core/isa.hpp).
static_assert(DITOPS_ISA_LEVEL == core::kAvx2VnniVariant, "the model is of the avx2+vnni variant");
using KernelArch = avx2_vnni_model;
#else
using KernelArch = std::tuple_element_t<DITOPS_ISA_LEVEL, core::KernelArchs>;
#endif
static_assert(KernelArch::supported(), "compile flags do not enable this ISA level");
}  // namespace ditops

#if DITOPS_ISA_LEVEL == 4  // the avx512bf16 variant (ditops::avx512_bf16)
#if !defined(__AVX512BF16__) || !defined(__AVX512VNNI__)
#error "the avx512_bf16 variant is compiled with -mavx512bf16 -mavx512vnni"
#endif
// batch<T, avx512_bf16> uses the AVX-512 registers (xsimd's own recipe for a derived arch).
namespace xsimd::types {
template <class T>
struct get_bool_simd_register<T, ditops::avx512_bf16> {
  using type = simd_avx512_bool_register<T>;
};
XSIMD_DECLARE_SIMD_REGISTER_ALIAS(ditops::avx512_bf16, xsimd::avx512bw);
}  // namespace xsimd::types
#endif

#if DITOPS_ISA_LEVEL == 5  // the avx2vnni variant (ditops::avx2_vnni, or its model)
#if !defined(__AVXVNNI__) && !(defined(DITOPS_AVXVNNI_MODEL) && DITOPS_AVXVNNI_MODEL)
#error "the avx2_vnni variant is compiled with -mavxvnni"
#endif
// batch<T, avx2_vnni> uses the AVX registers, as batch<T, avx512_bf16> the AVX-512 ones. AVX2's
// batch_bool is a vector register too (fma3<avx2> declares only the alias), so no
// get_bool_simd_register.
namespace xsimd::types {
XSIMD_DECLARE_SIMD_REGISTER_ALIAS(ditops::avx2_vnni, xsimd::fma3<xsimd::avx2>);
XSIMD_DECLARE_SIMD_REGISTER_ALIAS(ditops::avx2_vnni_model, ditops::avx2_vnni);
}  // namespace xsimd::types
#endif
