#pragma once
// fp64 oracle for rotary_position_embedding: out = x * cos + rot(x) * sin.

#include <functional>
#include <vector>

#include "tests/support/test_tensor.hpp"

namespace ditops::test {

/// x: [d0, d1, d2, D] logical; table(index4) returns cos or sin for x's element at
/// (i0, i1, i2, k) (the caller resolves broadcasting and layout).
template <class T>
std::vector<double> rope_reference(
    const TestTensor<T>& x, bool interleaved,
    const std::function<double(std::int64_t, std::int64_t, std::int64_t, std::int64_t)>& cos,
    const std::function<double(std::int64_t, std::int64_t, std::int64_t, std::int64_t)>& sin) {
  const auto& s = x.shape();
  const std::int64_t dim = s[3], half = dim / 2;
  std::vector<double> out(x.size());
  std::int64_t row = 0;
  for (std::int64_t a = 0; a < s[0]; ++a) {
    for (std::int64_t b = 0; b < s[1]; ++b) {
      for (std::int64_t c = 0; c < s[2]; ++c, ++row) {
        const std::int64_t base = row * dim;
        for (std::int64_t k = 0; k < dim; ++k) {
          double rotated;
          if (interleaved) {
            rotated = k % 2 ? x.value(base + k - 1) : -x.value(base + k + 1);
          } else {
            rotated = k < half ? -x.value(base + k + half) : x.value(base + k - half);
          }
          out[base + k] = x.value(base + k) * cos(a, b, c, k) + rotated * sin(a, b, c, k);
        }
      }
    }
  }
  return out;
}

}  // namespace ditops::test
