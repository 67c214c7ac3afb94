#pragma once
// Reference for QuantLinear: the activation quantization in the fp32 operations the layer
// documents (so the int8 values agree exactly), then the integer dot products and the
// epilogue in int64 / fp64.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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
