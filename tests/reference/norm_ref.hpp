#pragma once
// fp64 oracles for rms_norm / add_rms_norm and layer_norm / layer_norm_scale_shift, reading the
// inputs through TestTensor.

#include <cmath>
#include <vector>

#include "tests/support/test_tensor.hpp"

namespace ditops::test {

struct NormReference {
  std::vector<double> out;
  std::vector<double> sum;  ///< h = x + residual (fused only)
};

/// weight: D values or empty.
template <class T>
NormReference norm_reference(const TestTensor<T>& x, const TestTensor<T>* residual,
                             const std::vector<double>& weight, double eps) {
  const std::int64_t dim = x.shape().back();
  const std::int64_t rows = dim ? x.size() / dim : 0;
  NormReference ref;
  ref.out.resize(x.size());
  if (residual) ref.sum.resize(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double sum_squares = 0;
    for (std::int64_t i = 0; i < dim; ++i) {
      double h = x.value(r * dim + i);
      if (residual) {
        h += residual->value(r * dim + i);
        ref.sum[r * dim + i] = h;
      }
      sum_squares += h * h;
    }
    const double inv_rms = 1.0 / std::sqrt(sum_squares / static_cast<double>(dim) + eps);
    for (std::int64_t i = 0; i < dim; ++i) {
      const double h = residual ? ref.sum[r * dim + i] : x.value(r * dim + i);
      ref.out[r * dim + i] = h * inv_rms * (weight.empty() ? 1.0 : weight[i]);
    }
  }
  return ref;
}

struct LayerNormReference {
  std::vector<double> out;
  /// Per element, the sum of the magnitudes of the terms an fp32 computation rounds:
  /// (|x - mean| + mean(|x|)) / std * |weight (1 + scale)| + |bias (1 + scale)| + |shift|. The
  /// mean(|x|) term is the scale of the fp32 sum that gives the mean.
  std::vector<double> magnitude;
};

/// weight, bias: D values or empty (1, 0). scale, shift: one value per element of x (broadcast
/// already expanded), or empty (no modulation).
template <class T>
LayerNormReference layer_norm_reference(const TestTensor<T>& x, const std::vector<double>& weight,
                                        const std::vector<double>& bias,
                                        const std::vector<double>& scale,
                                        const std::vector<double>& shift, double eps) {
  const std::int64_t dim = x.shape().back();
  const std::int64_t rows = dim ? x.size() / dim : 0;
  LayerNormReference ref;
  ref.out.resize(x.size());
  ref.magnitude.resize(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double sum = 0, sum_abs = 0;
    for (std::int64_t i = 0; i < dim; ++i) {
      sum += x.value(r * dim + i);
      sum_abs += std::fabs(x.value(r * dim + i));
    }
    const double mean = sum / static_cast<double>(dim);
    double squares = 0;
    for (std::int64_t i = 0; i < dim; ++i) {
      const double deviation = x.value(r * dim + i) - mean;
      squares += deviation * deviation;
    }
    const double inv_std = 1.0 / std::sqrt(squares / static_cast<double>(dim) + eps);
    for (std::int64_t i = 0; i < dim; ++i) {
      const std::int64_t at = r * dim + i;
      const double w = weight.empty() ? 1.0 : weight[i];
      const double b = bias.empty() ? 0.0 : bias[i];
      const double factor = scale.empty() ? 1.0 : 1.0 + scale[at];
      const double offset = shift.empty() ? 0.0 : shift[at];
      const double deviation = x.value(at) - mean;
      ref.out[at] = (deviation * inv_std * w + b) * factor + offset;
      ref.magnitude[at] = (std::fabs(deviation) + sum_abs / static_cast<double>(dim)) * inv_std *
                              std::fabs(w * factor) +
                          std::fabs(b * factor) + std::fabs(offset);
    }
  }
  return ref;
}

}  // namespace ditops::test
