// Validation of RoPE's cos / sin tables (rope_tables.hpp).

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

}  // namespace ditops::rope
