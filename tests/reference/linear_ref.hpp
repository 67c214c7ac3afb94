#pragma once
// Reference for QuantLinear: the activation quantization in the fp32 operations the layer
// documents (so the int8 values agree exactly), then the integer dot products, the epilogue
// and the output activation in int64 / fp64.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ditops/linear.hpp>
#include <limits>
#include <numbers>
#include <vector>

namespace ditops::test {

/// How the reference quantizes x rows (mirrors linear.hpp's formulas).
struct RefQuant {
  bool dynamic = false;
  float scale = 1.f, offset = 0.f;  ///< static
  const std::vector<float>* smooth = nullptr;
};

/// q[m * k + i] and the row scale of each row (static: `scale`, dynamic: max|x| / 127, or 1
/// for a row whose largest magnitude is not a normal float after / 127).
inline void quantize_ref(const std::vector<float>& x, std::int64_t m, std::int64_t k,
                         const RefQuant& quant, std::vector<std::int32_t>& q,
                         std::vector<double>& row_scale) {
  q.assign(static_cast<std::size_t>(m * k), 0);
  row_scale.assign(static_cast<std::size_t>(m), quant.scale);
  for (std::int64_t r = 0; r < m; ++r) {
    std::vector<float> row(static_cast<std::size_t>(k));
    for (std::int64_t i = 0; i < k; ++i) {
      const float v = x[static_cast<std::size_t>(r * k + i)];
      row[static_cast<std::size_t>(i)] =
          quant.smooth ? v * (*quant.smooth)[static_cast<std::size_t>(i)] : v;
    }
    float scale = quant.scale, offset = quant.offset, low = -128.f;
    if (quant.dynamic) {
      float top = 0.f;
      for (float v : row) top = std::max(top, std::fabs(v));
      scale = top / 127.f;
      if (!(scale >= std::numeric_limits<float>::min())) scale = 1.f;
      offset = 0.f;
      low = -127.f;
      row_scale[static_cast<std::size_t>(r)] = scale;
    }
    for (std::int64_t i = 0; i < k; ++i) {
      const float shifted = row[static_cast<std::size_t>(i)] / scale + offset;
      const float clamped = std::min(std::max(shifted, low), 127.f);
      q[static_cast<std::size_t>(r * k + i)] = static_cast<std::int32_t>(std::nearbyint(clamped));
    }
  }
}

/// Σ_k q[m, k] · w[n, k], exact.
inline std::vector<std::int64_t> int_matmul_ref(const std::vector<std::int32_t>& q,
                                                const std::vector<std::int8_t>& w, std::int64_t m,
                                                std::int64_t n, std::int64_t k) {
  std::vector<std::int64_t> acc(static_cast<std::size_t>(m * n), 0);
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      std::int64_t sum = 0;
      for (std::int64_t i = 0; i < k; ++i) {
        sum += static_cast<std::int64_t>(q[static_cast<std::size_t>(r * k + i)]) *
               w[static_cast<std::size_t>(j * k + i)];
      }
      acc[static_cast<std::size_t>(r * n + j)] = sum;
    }
  }
  return acc;
}

/// The layer's output in fp64 and the bound its fp32 epilogue keeps: y = row_scale[m] ·
/// column_scale[n] · (acc + column_offset[n]) + bias[n]. The layer converts the int32 sum to
/// fp32, multiplies the two scales and fused-multiply-adds the bias: three fp32 roundings of
/// terms of the size of |row_scale · column_scale · sum| + |bias|, which 4 ulps of it cover.
/// A bf16 output adds its own rounding: at most 2^-8 of the value (the bottom of a binade).
struct EpilogueRef {
  std::vector<double> expected, tolerance;
};
inline EpilogueRef epilogue_ref(const std::vector<std::int64_t>& acc,
                                const std::vector<double>& row_scale,
                                const std::vector<float>& column_scale,
                                const std::vector<double>& column_offset,
                                const std::vector<float>& bias, std::int64_t m, std::int64_t n,
                                bool bf16_output) {
  constexpr double kEpilogueUlps = 4.0 * 0x1p-24;
  constexpr double kBf16Rounding = 0x1p-8;
  EpilogueRef ref;
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      const auto at = static_cast<std::size_t>(r * n + j);
      const auto column = static_cast<std::size_t>(j);
      const double product = row_scale[static_cast<std::size_t>(r)] * column_scale[column] *
                             (static_cast<double>(acc[at]) + column_offset[column]);
      const double shift = bias.empty() ? 0.0 : bias[column];
      const double expected = product + shift;
      double tolerance = kEpilogueUlps * (std::fabs(product) + std::fabs(shift)) + 1e-30;
      if (bf16_output) tolerance += kBf16Rounding * std::fabs(expected);
      ref.expected.push_back(expected);
      ref.tolerance.push_back(tolerance);
    }
  }
  return ref;
}

/// The t of activation(v) = v · sigmoid(t): v for silu, 2u = 2 sqrt(2 / pi) (v + 0.044715 v^3)
/// for gelu_tanh (0.5 (1 + tanh(u)) = sigmoid(2u)).
inline double sigmoid_argument(Activation activation, double v) {
  return activation == Activation::silu
             ? v
             : 2 * std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v);
}

/// activation(v) in fp64 as v / (1 + exp(-t)): gelu_tanh's 0.5 v (1 + tanh(u)) would lose every
/// digit to cancellation once tanh(u) rounds to -1 (u < -19 in fp64). The limits at +-inf are
/// +inf and -0.
inline double activation_ref(Activation activation, double v) {
  if (activation == Activation::none || std::isnan(v)) return v;
  if (std::isinf(v)) return v > 0 ? v : -0.0;
  return v / (1 + std::exp(-sigmoid_argument(activation, v)));
}

/// `layer` (the layer's output and the bound of its fp32 value, without a bf16 rounding: the
/// activation comes before the cast) activated, with the bound the fp32 activation keeps. The
/// layer computes v · sigmoid(t), sigmoid(t) from e = exp(-|t|), which adds to v's error:
///   - v's own error, times the steepest slope of either function (gelu_tanh 1.13, silu 1.10);
///   - t's rounding (gelu_tanh: v^2, a fused multiply-add, a product) and that of t · log2(e):
///     at most 6 |t| 2^-24 absolute in the exponent, which gives sigmoid a relative error of
///     that times d ln sigmoid(t) / dt = 1 - sigmoid(t) (1 far left, 0 far right);
///   - the exp2 polynomial's relative error, 2e-7 (simd::exp2_nonpositive), and 8 ulps for
///     1 + e, the division and the final product;
///   - exp2 returns 0 below 2^-126, so an output under |v| 2^-126 may come out as 0.
/// A bf16 output then adds its rounding of the activated value, as in epilogue_ref. Infinite
/// and NaN v have exact results (tolerance 0; a NaN is expected as any NaN).
inline EpilogueRef activated_ref(const EpilogueRef& layer, Activation activation,
                                 bool bf16_output) {
  constexpr double kSlope = 1.13, kUlp = 0x1p-24, kExpPolynomial = 2e-7, kFlushed = 0x1p-126;
  constexpr double kBf16Rounding = 0x1p-8;
  EpilogueRef ref;
  for (std::size_t i = 0; i < layer.expected.size(); ++i) {
    const double v = layer.expected[i];
    const double expected = activation_ref(activation, v);
    double tolerance = layer.tolerance[i];
    if (!std::isfinite(v)) {
      tolerance = 0;
    } else if (activation != Activation::none) {
      const double t = sigmoid_argument(activation, v);
      const double sigmoid_slope = 1 / (1 + std::exp(t));  // 1 - sigmoid(t)
      tolerance = kSlope * tolerance +
                  std::fabs(expected) *
                      (6 * std::fabs(t) * kUlp * sigmoid_slope + kExpPolynomial + 8 * kUlp) +
                  std::fabs(v) * kFlushed;
    }
    if (bf16_output) tolerance += kBf16Rounding * std::fabs(expected);
    ref.expected.push_back(expected);
    ref.tolerance.push_back(tolerance);
  }
  return ref;
}

/// x · wᵀ + bias in fp64.
inline std::vector<double> float_matmul_ref(const std::vector<float>& x,
                                            const std::vector<float>& w,
                                            const std::vector<float>& bias, std::int64_t m,
                                            std::int64_t n, std::int64_t k) {
  std::vector<double> y(static_cast<std::size_t>(m * n));
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = bias.empty() ? 0.0 : bias[static_cast<std::size_t>(j)];
      for (std::int64_t i = 0; i < k; ++i) {
        sum += static_cast<double>(x[static_cast<std::size_t>(r * k + i)]) *
               w[static_cast<std::size_t>(j * k + i)];
      }
      y[static_cast<std::size_t>(r * n + j)] = sum;
    }
  }
  return y;
}

}  // namespace ditops::test
