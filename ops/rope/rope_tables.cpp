// Validation shared by the RoPE calls (rope_tables.hpp).

#include "ops/rope/rope_tables.hpp"

#include <string>

namespace ditops::rope {

std::array<std::int64_t, kMaxRank> table_strides(const core::Arg& table, const core::Arg& x,
                                                 int seq_dim) {
  const TensorView& t = table.view;
  core::check_view(table, 2, 4);
  if (t.rank == 3) {
    core::fail(table.call, std::string(table.name) + " has rank 3, expected 2 ([S, D]) or 4");
  }
  core::check_dim(table, t.rank - 1, x, 3);
  std::array<std::int64_t, kMaxRank> strides{};
  if (t.rank == 2) {
    core::check_dim(table, 0, x, seq_dim);
    strides[seq_dim] = t.strides[0];
    return strides;
  }
  for (int d = 0; d < 3; ++d) {
    if (t.shape[d] == x.view.shape[d]) {
      strides[d] = t.shape[d] == 1 ? 0 : t.strides[d];
    } else if (t.shape[d] == 1) {
      strides[d] = 0;
    } else {
      core::fail(table.call, std::string(table.name) + ".shape[" + std::to_string(d) + "] (" +
                                 std::to_string(t.shape[d]) + ") must be 1 or equal x.shape[" +
                                 std::to_string(d) + "] (" + std::to_string(x.view.shape[d]) + ")");
    }
  }
  return strides;
}

void check_rotated(const core::Arg& x, const core::Arg& out, RotatedMode mode) {
  core::check_view(x, 4, 4);
  core::check_dtype(x, {DType::f32, DType::bf16, DType::f16});
  if (x.view.shape[3] % 2 != 0) {
    core::fail(x.call, "x.shape[3] (" + std::to_string(x.view.shape[3]) + ") must be even");
  }
  if (mode != RotatedMode::rotated_half && mode != RotatedMode::rotated_interleaved) {
    core::fail(x.call,
               "mode (" + std::to_string(static_cast<int>(mode)) + ") is not a RotatedMode");
  }
  core::check_view(out, 4, 4);
  core::check_same_dtype(out, x);
  core::check_same_shape(out, x);
}

TableStrides check_tables(const core::Arg& cos, const core::Arg& sin, const core::Arg& x,
                          const core::Arg& out, int seq_dim) {
  TableStrides strides{table_strides(cos, x, seq_dim), table_strides(sin, x, seq_dim)};
  core::check_dtype(cos, {DType::f32, x.view.dtype});
  core::check_same_dtype(sin, cos);
  core::check_writable(out);
  core::check_no_overlap(out, x, /*identical_ok=*/true);
  core::check_no_overlap(out, cos, false);
  core::check_no_overlap(out, sin, false);
  return strides;
}

}  // namespace ditops::rope
