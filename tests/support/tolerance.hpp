#pragma once
// Tolerances and the element-wise comparison every operator test uses:
// |got - ref| <= atol + rtol * |ref|, per element, against an fp64 reference.

#include <gtest/gtest.h>

#include <cmath>
#include <ditops/attention.hpp>
#include <string>
#include <vector>

#include "tests/support/test_tensor.hpp"

namespace ditops::test {

struct Tolerance {
  double rtol;
  double atol;
};

// Row-wise operators computed in fp32 (RMSNorm, RoPE). f32 output: the fp32 sum of D squares in
// 4·lanes partial sums has relative error <= (D/(4·lanes) + log2(4·lanes))·2^-24, about 5e-6 at
// D = 5120 with SSE lanes; the rsqrt and two products add a few 2^-24. bf16 / f16 output: one
// round-to-nearest-even of the result (2^-9 / 2^-11 relative) dominates the fp32 error, so allow
// one unit in the last place (2^-8 / 2^-10); atol covers results near zero (f16 subnormals).
inline constexpr Tolerance kRowwiseF32{2e-5, 1e-6};
inline constexpr Tolerance kRowwiseBf16{1.0 / 256, 1e-6};
inline constexpr Tolerance kRowwiseF16{1.0 / 1024, 1.0 / 16384};

/// The tolerance of `T` outputs among one operator's f32, bf16 and f16 tolerances.
template <class T>
constexpr Tolerance by_dtype(Tolerance f32, Tolerance bf16_tol, Tolerance f16_tol) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16_tol;
  } else if constexpr (std::is_same_v<T, f16>) {
    return f16_tol;
  } else {
    return f32;
  }
}

template <class T>
constexpr Tolerance rowwise_tolerance() {
  return by_dtype<T>(kRowwiseF32, kRowwiseBf16, kRowwiseF16);
}

// Attention computed by the flash kernel in fp32: scores accumulate Dk <= 576 fp32 products
// (relative error ~Dk·2^-24 on |s| of a few units), exp2 is a 2-ulp polynomial, and the output
// averages <= 4096 values of |v| ~ 1: 1e-4 relative, 2e-5 absolute for outputs that cancel to
// near zero. bf16 / f16 tensors: the same fp32 computation, then one rounding of the output to
// 2^-9 / 2^-11 relative: allow one unit in the last place. LSE (natural log, magnitude <= ~10)
// from the same fp32 scores and sum.
inline constexpr Tolerance kFlashF32{1e-4, 2e-5};
inline constexpr Tolerance kFlashBf16{1.0 / 256, 5e-5};
inline constexpr Tolerance kFlashF16{1.0 / 1024, 5e-5};
inline constexpr double kLseTolerance = 2e-4;

template <class T>
constexpr Tolerance flash_tolerance() {
  return by_dtype<T>(kFlashF32, kFlashBf16, kFlashF16);
}

// flash_bf16 where the CPU has AVX512-BF16 (K packed): Q·Kᵀ from scaled Q rounded to bf16 and K
// in bf16 (bf16 inputs exactly; f32 and f16 inputs rounded), each product exact and summed in
// fp32. Rounding Q (and K) costs up to 2^-9 relative per factor, so a score of a few units moves
// by ~1e-2 and the softmax weights by ~1 %: outputs of |v| ~ 1 move by ~1e-2. P·V, the softmax and the LSE stay in fp32. Elsewhere flash_bf16 has
// flash's numerics on its inputs rounded to bf16, well inside this.
inline constexpr Tolerance kFlashBf16Dot{3e-2, 1.5e-2};
// flash_bf16: the score errors above (~1e-2 on a few units) average out in the log-sum-exp.
inline constexpr double kLseToleranceBf16Dot = 1e-2;

/// The tolerance of the attention backend that ran (AttentionOptions::ran): flash_bf16's
/// bf16 dot products, or an fp32 computation (reference, flash, sparse). int8 is lossy by
/// design and checked otherwise (tests/attention/int8_test.cpp).
template <class T>
constexpr Tolerance attention_tolerance(AttentionBackend ran) {
  return ran == AttentionBackend::flash_bf16 ? kFlashBf16Dot : flash_tolerance<T>();
}
constexpr double attention_lse_tolerance(AttentionBackend ran) {
  return ran == AttentionBackend::flash_bf16 ? kLseToleranceBf16Dot : kLseTolerance;
}

/// Checks every element and that no canary around `got` was touched; reports the worst element.
template <class T>
void expect_close(const TestTensor<T>& got, const std::vector<double>& ref, Tolerance tol,
                  const std::string& context) {
  ASSERT_EQ(static_cast<std::size_t>(got.size()), ref.size()) << context;
  std::int64_t failures = 0, worst = -1, zeros_where_ref_is_not = 0, nonzero_refs = 0;
  double worst_excess = 0;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const double value = got.value(i);
    const double err = std::fabs(value - ref[i]);
    const double bound = tol.atol + tol.rtol * std::fabs(ref[i]);
    if (ref[i] != 0) {
      ++nonzero_refs;
      if (value == 0) ++zeros_where_ref_is_not;
    }
    if (!(err <= bound)) {  // also catches NaN
      ++failures;
      if (worst < 0 || err - bound > worst_excess) {
        worst = i;
        worst_excess = err - bound;
      }
    }
  }
  EXPECT_EQ(failures, 0) << context << ": " << failures << " of " << got.size()
                         << " elements out of tolerance; worst element " << worst << " got "
                         << (worst >= 0 ? got.value(worst) : 0) << " expected "
                         << (worst >= 0 ? ref[worst] : 0);
  // A kernel that writes zeros (or nothing) must not pass on inputs whose results are tiny.
  EXPECT_LT(zeros_where_ref_is_not, nonzero_refs / 100 + 1) << context << ": output mostly zero";
  EXPECT_EQ(got.damaged_canaries(), 0) << context << ": wrote outside its elements";
}

}  // namespace ditops::test
