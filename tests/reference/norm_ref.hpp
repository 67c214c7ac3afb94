#pragma once
// fp64 oracle for rms_norm / add_rms_norm, reading the inputs through TestTensor.

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

}  // namespace ditops::test
