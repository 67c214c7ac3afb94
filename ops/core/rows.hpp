#pragma once
// Row addressing for row-wise kernels: a tensor [..., D] is a list of rows of D contiguous
// elements; the leading dimensions may have any strides, and several operands (input, output,
// broadcast tables) share one leading shape with their own strides.

#include <array>
#include <cstdint>
#include <ditops/tensor.hpp>

namespace ditops::core {

inline constexpr int kMaxRowOperands = 6;

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

// Internal linkage: kernel objects of every ISA level include this, and an inline function
// shared between them is the ODR hazard that tools/check_isa_objects.sh guards against.
namespace {

/// Walks rows in order, keeping the element offsets of the first `Count` operands; next() is
/// an add per operand in the common case (no division per row, which costs as much as a
/// short row's arithmetic).
template <int Count>
class RowWalker {
 public:
  RowWalker(const RowLayout& layout, std::int64_t row) noexcept : layout_(&layout) {
    for (int d = layout.dims - 1; d >= 0; --d) {
      index_[d] = row % layout.shape[d];
      row /= layout.shape[d];
      for (int k = 0; k < Count; ++k) offsets_[k] += index_[d] * layout.strides[k][d];
    }
  }
  std::int64_t offset(int operand) const noexcept { return offsets_[operand]; }
  void next() noexcept {
    for (int d = layout_->dims - 1; d >= 0; --d) {
      for (int k = 0; k < Count; ++k) offsets_[k] += layout_->strides[k][d];
      if (++index_[d] < layout_->shape[d]) return;
      for (int k = 0; k < Count; ++k) offsets_[k] -= index_[d] * layout_->strides[k][d];
      index_[d] = 0;
    }
  }

 private:
  const RowLayout* layout_;
  std::array<std::int64_t, kMaxRank> index_{};
  std::array<std::int64_t, Count> offsets_{};
};

}  // namespace

}  // namespace ditops::core
