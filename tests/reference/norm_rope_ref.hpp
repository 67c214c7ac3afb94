#pragma once
// fp64 oracle for rms_norm_rotary_position_embedding: the fp64 RMSNorm of norm_ref.hpp over each
// norm group, then the fp64 rotation of rope_ref.hpp on those values, never rounded between.

#include <algorithm>
#include <cmath>
#include <vector>

#include "tests/reference/norm_ref.hpp"
#include "tests/reference/rope_ref.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {

struct NormRopeReference {
  std::vector<double> out;
  double normalized_max = 0;  ///< the largest |x * inv_rms * weight|, the scale of fp32 terms
};

/// x: [d0, d1, d2, D] logical; each run of `group` consecutive elements (D: a row; d2 * D: the
/// rows of one (i0, i1), x in [B, S, N, D]) is normalized with weight (group values or empty).
template <class T>
NormRopeReference norm_rope_reference(const TestTensor<T>& x, const std::vector<double>& weight,
                                      double eps, std::int64_t group, bool interleaved,
                                      const RopeTableLookup& cos, const RopeTableLookup& sin) {
  // The groups as the rows of a [groups, group] tensor (an exact copy: same T).
  TestTensor<T> grouped({group ? x.size() / group : 0, group});
  for (std::int64_t i = 0; i < x.size(); ++i) grouped.at(i) = x.at(i);
  const std::vector<double> normalized =
      norm_reference(grouped, static_cast<const TestTensor<T>*>(nullptr), weight, eps).out;
  NormRopeReference ref;
  for (double v : normalized) ref.normalized_max = std::max(ref.normalized_max, std::fabs(v));
  ref.out = rope_reference(
      x.shape(), [&normalized](std::int64_t i) { return normalized[i]; }, interleaved, cos, sin);
  return ref;
}

}  // namespace ditops::test
