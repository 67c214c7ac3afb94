#pragma once
// The rotary tests' cos / sin tables (tests/rope): angles that vary with batch and head as well
// as position, so that a broadcasting error shows, filled into [S, D] or 4-D tables, and their
// lookups for the references.
#include <cmath>
#include <cstdint>
#include <ditops/rope.hpp>
#include <vector>

#include "tests/reference/rope_ref.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {

/// theta = (seq + 1 + batch / 4 + head / 8) * 10000^(-2 freq / D), freq = k mod D/2 for
/// rotated_half and k / 2 for rotated_interleaved (each pair's own frequency).
inline double rope_angle(std::int64_t batch, std::int64_t head, std::int64_t seq, std::int64_t k,
                         std::int64_t dim, RotatedMode mode) {
  const std::int64_t freq = mode == RotatedMode::rotated_half ? k % (dim / 2) : k / 2;
  return (seq + 1 + 0.25 * batch + 0.125 * head) *
         std::pow(10000.0, -2.0 * static_cast<double>(freq) / static_cast<double>(dim));
}

/// cos and sin tables of `t_shape` ([S, D], or 4-D in x's dimension order) filled from the
/// index of each element, and their lookups by x's (i0, i1, i2, k).
template <class C>
struct RopeTables {
  std::vector<std::int64_t> shape;
  int seq_dim, head_dim;
  std::int64_t dim;
  TestTensor<C> cos, sin;

  RopeTables(std::vector<std::int64_t> t_shape, bool head_first, RotatedMode mode, std::int64_t pad)
      : shape(t_shape),
        seq_dim(head_first ? 2 : 1),
        head_dim(head_first ? 1 : 2),
        dim(t_shape.back()),
        cos(t_shape, pad),
        sin(t_shape, pad) {
    for (std::int64_t r = 0; r < cos.size() / dim; ++r) {
      std::int64_t idx[3] = {0, 0, 0}, rest = r;
      if (shape.size() == 2) {
        idx[seq_dim] = r;
      } else {
        for (int d = 2; d >= 0; --d) {
          idx[d] = rest % shape[d];
          rest /= shape[d];
        }
      }
      for (std::int64_t k = 0; k < dim; ++k) {
        const double a = rope_angle(idx[0], idx[head_dim], idx[seq_dim], k, dim, mode);
        cos.at(r * dim + k) = from_float<C>(static_cast<float>(std::cos(a)));
        sin.at(r * dim + k) = from_float<C>(static_cast<float>(std::sin(a)));
      }
    }
  }

  RopeTableLookup lookup(const TestTensor<C>& t) const {
    return [this, &t](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t k) {
      const std::int64_t idx[3] = {a, b, c};
      std::int64_t row = 0;
      if (shape.size() == 2) {
        row = idx[seq_dim];
      } else {
        for (int d = 0; d < 3; ++d) row = row * shape[d] + (shape[d] == 1 ? 0 : idx[d]);
      }
      return t.value(row * dim + k);
    };
  }
};

}  // namespace ditops::test
