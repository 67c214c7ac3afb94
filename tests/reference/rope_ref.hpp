#pragma once
// fp64 oracle for rotary_position_embedding: out = x * cos + rot(x) * sin.

#include <functional>
#include <vector>

#include "tests/support/test_tensor.hpp"

namespace ditops::test {

using RopeTableLookup =
    std::function<double(std::int64_t, std::int64_t, std::int64_t, std::int64_t)>;

/// x: [d0, d1, d2, D] logical, element i (row-major) given by value(i), so that inputs held in
/// fp64 only (rms_norm_rotary_position_embedding's normalized rows) are rotated without
/// rounding; table(index4) returns cos or sin for x's element at (i0, i1, i2, k) (the caller
/// resolves broadcasting and layout).
inline std::vector<double> rope_reference(const std::vector<std::int64_t>& s,
                                          const std::function<double(std::int64_t)>& value,
                                          bool interleaved, const RopeTableLookup& cos,
                                          const RopeTableLookup& sin) {
  const std::int64_t dim = s[3], half = dim / 2;
  std::vector<double> out(static_cast<std::size_t>(s[0] * s[1] * s[2] * dim));
  std::int64_t row = 0;
  for (std::int64_t a = 0; a < s[0]; ++a) {
    for (std::int64_t b = 0; b < s[1]; ++b) {
      for (std::int64_t c = 0; c < s[2]; ++c, ++row) {
        const std::int64_t base = row * dim;
        for (std::int64_t k = 0; k < dim; ++k) {
          double rotated;
          if (interleaved) {
            rotated = k % 2 ? value(base + k - 1) : -value(base + k + 1);
          } else {
            rotated = k < half ? -value(base + k + half) : value(base + k - half);
          }
          out[base + k] = value(base + k) * cos(a, b, c, k) + rotated * sin(a, b, c, k);
        }
      }
    }
  }
  return out;
}

/// The same on the elements of x.
template <class T>
std::vector<double> rope_reference(const TestTensor<T>& x, bool interleaved,
                                   const RopeTableLookup& cos, const RopeTableLookup& sin) {
  return rope_reference(
      x.shape(), [&x](std::int64_t i) { return x.value(i); }, interleaved, cos, sin);
}

}  // namespace ditops::test
