# Kernels are written once as templates over the xsimd architecture and compiled once per ISA
# level, plus two extension variants of a level (avx512 with BF16/VNNI, avx2 with AVX-VNNI):
# each kernel source is built in six OBJECT libraries, each with its own -m flags and DITOPS_ISA_LEVEL (ops/core/arch.hpp maps the level
# to the xsimd architecture). Nothing else in the library is compiled above the x86-64
# baseline, so a CPU without AVX-512 never runs an AVX-512 instruction unless dispatch chose
# that level.
#
# This is the one list of kernel variants. From it come the compile flags below, the generated
# header ops/core/isa_variants.hpp (each variant's xsimd architecture and name, from which the
# dispatch tables and kernel sources take theirs) and the test runs (tests/CMakeLists.txt runs
# the suite once per variant with DITOPS_ISA set to its _CAP value). A variant's index is its
# position in the list: the Isa levels first, then the extension variants, each after the level
# it extends (_BASE). Flags stay a subset of what ops/core/cpu.cpp checks before it enables a
# variant.
set(DITOPS_ISA_LEVELS scalar sse4_2 avx2 avx512 avx512bf16 avx2vnni)
set(DITOPS_ISA_scalar_FLAGS "")
set(DITOPS_ISA_sse4_2_FLAGS -msse4.2 -mpopcnt)
set(DITOPS_ISA_avx2_FLAGS -mavx2 -mfma -mf16c)
set(DITOPS_ISA_avx512_FLAGS -mavx512f -mavx512cd -mavx512dq -mavx512bw -mavx512vl -mfma -mf16c)
set(DITOPS_ISA_avx512bf16_FLAGS ${DITOPS_ISA_avx512_FLAGS} -mavx512bf16 -mavx512vnni)
set(DITOPS_ISA_avx2vnni_FLAGS ${DITOPS_ISA_avx2_FLAGS} -mavxvnni)
# The xsimd architecture each variant's kernels instantiate.
set(DITOPS_ISA_scalar_ARCH "xsimd::sse2")
set(DITOPS_ISA_sse4_2_ARCH "xsimd::sse4_2")
set(DITOPS_ISA_avx2_ARCH "xsimd::fma3<xsimd::avx2>")
set(DITOPS_ISA_avx512_ARCH "xsimd::avx512bw")
set(DITOPS_ISA_avx512bf16_ARCH "ditops::avx512_bf16")  # avx512 + AVX512-BF16 + AVX512-VNNI
set(DITOPS_ISA_avx2vnni_ARCH "ditops::avx2_vnni")  # avx2 + AVX-VNNI (256-bit VEX vpdpbusd)
# The name tools and reports print for it.
set(DITOPS_ISA_scalar_NAME "scalar")
set(DITOPS_ISA_sse4_2_NAME "sse4.2")
set(DITOPS_ISA_avx2_NAME "avx2")
set(DITOPS_ISA_avx512_NAME "avx512")
set(DITOPS_ISA_avx512bf16_NAME "avx512+bf16+vnni")
set(DITOPS_ISA_avx2vnni_NAME "avx2+vnni")
# The DITOPS_ISA value that makes a CPU having it run it (avx512bw: AVX-512 without the
# BF16/VNNI variant; avx512: the best AVX-512 variant the CPU has; avx2: AVX2 without AVX-VNNI;
# avxvnni: the avx2 level with it).
set(DITOPS_ISA_scalar_CAP scalar)
set(DITOPS_ISA_sse4_2_CAP sse4.2)
set(DITOPS_ISA_avx2_CAP avx2)
set(DITOPS_ISA_avx512_CAP avx512bw)
set(DITOPS_ISA_avx512bf16_CAP avx512)
set(DITOPS_ISA_avx2vnni_CAP avxvnni)
# The level an extension variant extends: a build that leaves the extension out runs that
# level's kernels in its place.
set(DITOPS_ISA_avx512bf16_BASE avx512)
set(DITOPS_ISA_avx2vnni_BASE avx2)

# The variants compiled: every one by default. A build that runs only the variant its own CPU
# dispatches to (the sanitizer preset) may compile a subset; scalar is always compiled, and a
# level left out dispatches to the nearest compiled level below it, an extension variant left
# out to its level's kernels (the kernels are the lower level's, while ditops-info still names
# the CPU's level).
# A variant is named by its key (avx512bf16) or by the name ditops-info prints for it
# (avx512+bf16+vnni: `ditops-info`'s "kernel variant" line can be passed as it is). "native":
# the variants the CPU building it dispatches to (ditops_native_variants), for a build that only
# runs where it was built (tools/demo.sh).
set(DITOPS_KERNEL_VARIANTS "all" CACHE STRING
    "Kernel variants to compile: all, native, or a ;-list of ${DITOPS_ISA_LEVELS} (or their names)")

# The variants this machine runs without DITOPS_ISA: its highest level and that level's
# extensions, where the compiler finds the CPU has a variant when -march=native already implies
# every flag of it (adding them changes no predefined macro). A build of these alone runs on
# another CPU at the nearest compiled level below its own (scalar at worst), and on this one
# under a DITOPS_ISA below its level likewise.
function(ditops_native_variants out)
  set(probe ${CMAKE_CXX_COMPILER} -march=native -dM -E -x c++ /dev/null)
  execute_process(COMMAND ${probe} OUTPUT_VARIABLE native RESULT_VARIABLE failed)
  if(failed)
    message(FATAL_ERROR "DITOPS_KERNEL_VARIANTS=native: ${CMAKE_CXX_COMPILER} does not take "
                        "-march=native; name the variants instead")
  endif()
  set(top "")
  set(variants "")
  foreach(isa IN LISTS DITOPS_ISA_LEVELS)
    if(isa STREQUAL "scalar")
      continue()
    endif()
    execute_process(COMMAND ${probe} ${DITOPS_ISA_${isa}_FLAGS} OUTPUT_VARIABLE with_flags)
    if(NOT with_flags STREQUAL native)
      continue()
    endif()
    if(NOT DEFINED DITOPS_ISA_${isa}_BASE)
      set(top ${isa})
      set(variants ${isa})
    elseif(DITOPS_ISA_${isa}_BASE STREQUAL top)
      list(APPEND variants ${isa})
    endif()
  endforeach()
  set(${out} ${variants} PARENT_SCOPE)
endfunction()

set(requested_variants ${DITOPS_KERNEL_VARIANTS})
if(DITOPS_KERNEL_VARIANTS STREQUAL "native")
  ditops_native_variants(requested_variants)
  message(STATUS "ditops: kernel variants for this CPU: scalar ${requested_variants}")
endif()
if(DITOPS_KERNEL_VARIANTS STREQUAL "all")
  set(DITOPS_COMPILED_LEVELS ${DITOPS_ISA_LEVELS})
else()
  set(requested_levels "")
  foreach(variant IN LISTS requested_variants)
    set(key "")
    foreach(isa IN LISTS DITOPS_ISA_LEVELS)
      if(variant STREQUAL isa OR variant STREQUAL DITOPS_ISA_${isa}_NAME)
        set(key ${isa})
      endif()
    endforeach()
    if(NOT key)
      message(FATAL_ERROR "DITOPS_KERNEL_VARIANTS: ${variant} is not one of ${DITOPS_ISA_LEVELS}")
    endif()
    list(APPEND requested_levels ${key})
  endforeach()
  set(DITOPS_COMPILED_LEVELS "")
  foreach(isa IN LISTS DITOPS_ISA_LEVELS)  # in level order
    if(isa STREQUAL "scalar" OR isa IN_LIST requested_levels)
      list(APPEND DITOPS_COMPILED_LEVELS ${isa})
    endif()
  endforeach()
endif()

set(variant_archs "")
set(variant_arch_list "")
set(variant_names "")
set(level 0)
foreach(isa IN LISTS DITOPS_ISA_LEVELS)
  set(DITOPS_ISA_${isa}_LEVEL ${level})
  # The architecture whose kernels the variant runs: its own, or when left out its base
  # level's (an extension) or the nearest compiled level's below it (a level).
  if(isa IN_LIST DITOPS_COMPILED_LEVELS)
    set(dispatched_arch ${DITOPS_ISA_${isa}_ARCH})
  elseif(DEFINED DITOPS_ISA_${isa}_BASE)
    set(dispatched_arch ${DITOPS_ISA_${DITOPS_ISA_${isa}_BASE}_DISPATCHED})
  else()
    set(dispatched_arch ${level_below_arch})
  endif()
  set(DITOPS_ISA_${isa}_DISPATCHED ${dispatched_arch})
  if(NOT DEFINED DITOPS_ISA_${isa}_BASE)
    set(level_below_arch ${dispatched_arch})
  endif()
  string(APPEND variant_archs " \\\n  X(arg, ${dispatched_arch})")
  list(APPEND variant_arch_list "${DITOPS_ISA_${isa}_ARCH}")
  string(APPEND variant_names " \\\n  \"${DITOPS_ISA_${isa}_NAME}\",")
  math(EXPR level "${level} + 1")
endforeach()
list(JOIN variant_arch_list ", " variant_arch_commas)
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/generated/ops/core/isa_variants.hpp CONTENT
"#pragma once
// Generated by cmake/DitopsKernels.cmake from DITOPS_ISA_LEVELS (the one list of kernel
// variants, lowest first); do not edit.
#define DITOPS_KERNEL_VARIANT_COUNT ${level}
// X(arg, xsimd architecture) once per variant, in level order: the architecture whose kernels
// that level runs (its own unless DITOPS_KERNEL_VARIANTS left it out).
#define DITOPS_FOR_EACH_KERNEL_ARCH(X, arg)${variant_archs}
// The architectures as a type list, in level order.
#define DITOPS_KERNEL_ARCHS ${variant_arch_commas}
// Names, in level order.
#define DITOPS_KERNEL_VARIANT_NAMES${variant_names}
" @ONLY)
# Every target that includes ops/core/isa.hpp links ditops_settings.
target_include_directories(ditops_settings INTERFACE
                           $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>)

function(ditops_add_kernels target)
  foreach(isa IN LISTS DITOPS_COMPILED_LEVELS)   # lowest level first (ODR hazard: tools/check_isa_objects.sh)
    set(objects ${target}_isa_${isa})
    if(NOT TARGET ${objects})
      add_library(${objects} OBJECT)
      # Kernel objects are always optimized: at -O0 GCC emits out-of-line copies of inline
      # helpers (xsimd register conversions, std::sqrt) that the linker could share across ISAs.
      target_compile_options(${objects} PRIVATE ${DITOPS_ISA_${isa}_FLAGS} -O2
                                                "${DITOPS_INTRINSICS_FIRST}")
      target_compile_definitions(${objects} PRIVATE DITOPS_ISA_LEVEL=${DITOPS_ISA_${isa}_LEVEL})
      target_include_directories(${objects} PRIVATE ${PROJECT_SOURCE_DIR}
                                 ${PROJECT_SOURCE_DIR}/include)
      target_link_libraries(${objects} PRIVATE ditops_settings xsimd OpenMP::OpenMP_CXX)
      target_sources(${target} PRIVATE $<TARGET_OBJECTS:${objects}>)
    endif()
    target_sources(${objects} PRIVATE ${ARGN})
  endforeach()
endfunction()
