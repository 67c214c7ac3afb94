#pragma once
// Row addressing for row-wise kernels: a tensor [..., D] is a list of rows of D contiguous
// elements; the leading dimensions may have any strides, and several operands (input, output,
// broadcast tables) share one leading shape with their own strides.

#include <array>
#include <cstdint>
#include <ditops/tensor.hpp>

namespace ditops::core {

inline constexpr int kMaxRowOperands = 4;

struct RowLayout {
  int dims = 0;  ///< leading dimensions
  std::array<std::int64_t, kMaxRank> shape{};
  /// strides[operand][dim], in elements; 0 broadcasts that operand along dim.
  std::array<std::array<std::int64_t, kMaxRank>, kMaxRowOperands> strides{};
  std::int64_t rows = 1;
};

/// The leading shape of `view` (all but its last dimension); operand 0 gets its strides.
inline RowLayout row_layout_of(const TensorView& view) noexcept {
  RowLayout layout;
  layout.dims = view.rank > 0 ? view.rank - 1 : 0;
  for (int d = 0; d < layout.dims; ++d) {
    layout.shape[d] = view.shape[d];
    layout.strides[0][d] = view.strides[d];
    layout.rows *= view.shape[d];
  }
  return layout;
}

/// Element offsets of row `row` for the first `Count` operands.
template <int Count>
inline std::array<std::int64_t, Count> row_offsets(const RowLayout& layout,
                                                   std::int64_t row) noexcept {
  std::array<std::int64_t, Count> offsets{};
  for (int d = layout.dims - 1; d >= 0; --d) {
    const std::int64_t index = row % layout.shape[d];
    row /= layout.shape[d];
    for (int k = 0; k < Count; ++k) offsets[k] += index * layout.strides[k][d];
  }
  return offsets;
}

}  // namespace ditops::core
