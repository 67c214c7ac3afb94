# Kernels are written once as templates over the xsimd architecture and compiled once per ISA
# level (plus the avx512 variant with BF16/VNNI): each kernel source is built in five OBJECT
# libraries, each with its own -m flags and DITOPS_ISA_LEVEL (ops/core/arch.hpp maps the level
# to the xsimd architecture). Nothing else in the library is compiled above the x86-64
# baseline, so a CPU without AVX-512 never runs an AVX-512 instruction unless dispatch chose
# that level.
#
# Flags stay a subset of what ops/core/cpu.cpp checks before it enables a level.
set(DITOPS_ISA_LEVELS scalar sse4_2 avx2 avx512 avx512bf16)
set(DITOPS_ISA_scalar_LEVEL 0)
set(DITOPS_ISA_sse4_2_LEVEL 1)
set(DITOPS_ISA_avx2_LEVEL 2)
set(DITOPS_ISA_avx512_LEVEL 3)
set(DITOPS_ISA_avx512bf16_LEVEL 4)  # avx512 + AVX512-BF16 + AVX512-VNNI (ops/core/isa.hpp)
set(DITOPS_ISA_scalar_FLAGS "")
set(DITOPS_ISA_sse4_2_FLAGS -msse4.2 -mpopcnt)
set(DITOPS_ISA_avx2_FLAGS -mavx2 -mfma -mf16c)
set(DITOPS_ISA_avx512_FLAGS -mavx512f -mavx512cd -mavx512dq -mavx512bw -mavx512vl -mfma -mf16c)
set(DITOPS_ISA_avx512bf16_FLAGS ${DITOPS_ISA_avx512_FLAGS} -mavx512bf16 -mavx512vnni)

function(ditops_add_kernels target)
  foreach(isa IN LISTS DITOPS_ISA_LEVELS)   # lowest level first (ODR hazard: tools/check_isa_objects.sh)
    set(objects ${target}_isa_${isa})
    if(NOT TARGET ${objects})
      add_library(${objects} OBJECT)
      # Kernel objects are always optimized: at -O0 GCC emits out-of-line copies of inline
      # helpers (xsimd register conversions, std::sqrt) that the linker could share across ISAs.
      target_compile_options(${objects} PRIVATE ${DITOPS_ISA_${isa}_FLAGS} -O2)
      target_compile_definitions(${objects} PRIVATE DITOPS_ISA_LEVEL=${DITOPS_ISA_${isa}_LEVEL})
      if(isa MATCHES "^avx512" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU"
         AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
        # GCC PR 105593: false (maybe-)uninitialized warnings inside GCC's own avx512fintrin.h
        # (the plain form appears under the sanitizers).
        target_compile_options(${objects} PRIVATE -Wno-maybe-uninitialized -Wno-uninitialized)
      endif()
      target_include_directories(${objects} PRIVATE ${PROJECT_SOURCE_DIR}
                                 ${PROJECT_SOURCE_DIR}/include)
      target_link_libraries(${objects} PRIVATE ditops_settings xsimd OpenMP::OpenMP_CXX)
      target_sources(${target} PRIVATE $<TARGET_OBJECTS:${objects}>)
    endif()
    target_sources(${objects} PRIVATE ${ARGN})
  endforeach()
endfunction()
