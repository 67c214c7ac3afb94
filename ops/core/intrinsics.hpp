#pragma once
// Force-included (-include, see DITOPS_INTRINSICS_FIRST in the top-level CMakeLists.txt) into
// every translation unit compiled with ISA flags of its own or for the build machine's CPU, so
// that GCC's intrinsic headers are first read here.
//
// GCC before 13 warns inside its own AVX-512 headers wherever their code is inlined (PR 105593:
// the self-initialized __Y of _mm512_undefined_* reads as maybe-uninitialized), whether the
// caller is our kernels, xsimd or Eigen. GCC decides a warning by the pragmas in force at each
// location of its inlining chain, innermost first, and the innermost location of these lies in
// the intrinsic headers: silencing the two warnings around this one include silences them there
// and nowhere else. Our own code, and every dependency's, stays under -Werror.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
