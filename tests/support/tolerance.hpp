#pragma once
// Tolerances and the element-wise comparison every operator test uses:
// |got - ref| <= atol + rtol * |ref|, per element, against an fp64 reference.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ditops/attention.hpp>
#include <string>
#include <vector>

#include "tests/reference/attention_ref.hpp"
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

// flash_bf16 rounds scaled Q and K to bf16 (with AVX512-BF16 and K packed, for its bf16 dot
// products; elsewhere it computes flash's fp32 dot products on the rounded values). bf16 keeps 8
// significant bits, so each rounding is within 2^-8 relative (inputs already in bf16 exactly);
// products of the rounded values are exact in fp32 and summed in fp32. A score
// s = scale·Σ_d q_d k_d therefore moves by at most 2^-7·scale·Σ_d |q_d k_d| (both roundings at
// their worst). The roundings of different d are independent and centred, each of standard
// deviation 2^-8/sqrt(3) relative, so in practice the error is a sum of independent terms of
// standard deviation 2^-8·sqrt(2/3)·|q_d k_d|: eight of its standard deviations,
// 8·2^-8·sqrt(2/3)·scale·||q∘k||₂, is far smaller for long heads and is not exceeded in any run
// of the suite or the fuzzers. δ is the smaller of the two over every attended pair. The LSE
// (a log-sum-exp of the scores) moves by at most δ; each softmax weight by a factor within
// e^{±2δ}, so an output, a convex combination of V rows, by at most (e^{2δ} − 1)·max |v|. The
// bound grows with the scores: a fixed LSE tolerance of 1e-2 failed f16 inputs with scores of 6
// and Dk = 2 on AVX512-BF16, where the kernel's LSE was that of the fp64 reference on the rounded
// Q and K exactly, 0.037 off.
// With AVX512-BF16, P·V is a bf16 dot product too: each weight p (from an exp2 polynomial within
// e = 4.2e-5 relative) is rounded to bf16 once, to p·(1 + ε) with |ε| <= u + e, u = 2^-9
// (e = 0.0215u), and the row sum adds the rounded weights, so the output stays a convex
// combination of V rows whose normalized weights move by a factor within (1 ± 1.0215u) /
// (1 ∓ 1.0215u), below e^{±2.05u}: on top of the scores' e^{±2δ}, the output moves by at most
// (e^{2δ + 2.05u} − 1)·max |v|, and the LSE (the log of the rounded sum) by at most 1.025u more.
// V rounded to bf16 (fp32 or f16 inputs; bf16 inputs stay exact) adds at most u·max |v|.
inline constexpr double kBf16WeightError = 2.05 * 0x1p-9;
inline double bf16_score_error(const AttentionMagnitudes& m) {
  return std::min(0x1p-7 * m.score_l1, 8 * 0x1p-8 * std::sqrt(2.0 / 3.0) * m.score_l2);
}

/// The tolerance of the attention backend that ran (AttentionOptions::ran) on data of these
/// magnitudes: flash_bf16's rounding of Q and K on top of flash's fp32 computation (reference,
/// flash and sparse compute in fp32). int8 is lossy by design and checked otherwise
/// (tests/attention/int8_test.cpp).
template <class T>
Tolerance attention_tolerance(AttentionBackend ran, const AttentionMagnitudes& m) {
  Tolerance tol = flash_tolerance<T>();
  if (ran == AttentionBackend::flash_bf16) {
    tol.atol += (std::expm1(2 * bf16_score_error(m) + kBf16WeightError) + 0x1p-9) * m.v_max;
  }
  return tol;
}
inline double attention_lse_tolerance(AttentionBackend ran, const AttentionMagnitudes& m) {
  if (ran != AttentionBackend::flash_bf16) return kLseTolerance;
  return kLseTolerance + bf16_score_error(m) + kBf16WeightError / 2;
}

/// |got - want| <= atol + rtol |want|: false for a NaN.
inline bool within(double got, double want, Tolerance tol) {
  return std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want);
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
