#pragma once
// Test tensors: owned storage behind a TensorView, with optional padding between rows and guard
// regions before and after, all filled with a canary pattern so a test can prove that a call
// wrote nothing outside the elements it owns.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ditops/tensor.hpp>
#include <random>
#include <vector>

#include "ops/core/threads.hpp"

namespace ditops::test {

inline constexpr std::int64_t kGuard = 64;  ///< canary elements before and after the data

/// Bytes of output that take the streaming-store path, with a MiB to spare. The test main lowers
/// the threshold (DITOPS_STREAMING_STORE_BYTES) to 2 MiB, so the streaming paths run on outputs
/// of 3 MiB at every ISA level instead of 33.
inline std::int64_t streamed_output_bytes() {
  return core::streaming_store_bytes() + (std::int64_t{1} << 20);
}

template <class T>
T canary() {
  T value;
  std::memset(&value, 0xA5, sizeof value);  // a NaN-like pattern no kernel produces by chance
  return value;
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// Rank <= 6 tensor of T, last dim contiguous, each row followed by `row_pad` canary elements
/// (row_pad > 0 makes the leading dims strided).
template <class T>
class TestTensor {
 public:
  TestTensor(std::vector<std::int64_t> shape, std::int64_t row_pad = 0) : shape_(std::move(shape)) {
    const int rank = static_cast<int>(shape_.size());
    strides_.assign(rank, 1);
    std::int64_t span = 1;
    for (int d = rank - 1; d >= 0; --d) {
      strides_[d] = span;
      span *= shape_[d];
      if (d == rank - 1) span += row_pad;
    }
    storage_.assign(static_cast<std::size_t>(span + 2 * kGuard), canary<T>());
    elements_ = 1;
    for (auto extent : shape_) elements_ *= extent;
    // Every row (last dim) is followed by the same pad, so element i sits at i plus the pads of
    // the rows before it: one division per access (the suite walks streamed outputs at every
    // ISA level, and the fuzz harnesses caches of 10^5 elements several times per input).
    row_ = rank > 0 ? shape_.back() : 1;
    row_pad_ = row_pad;
    for (std::int64_t begin = 0; begin < elements_; begin += row_) {
      std::fill_n(&at(begin), row_, T{});
    }
  }

  TensorView view() {
    TensorView v;
    v.data = storage_.data() + kGuard;
    v.dtype = detail::dtype_of<T>();
    v.rank = static_cast<int>(shape_.size());
    for (int d = 0; d < v.rank; ++d) {
      v.shape[d] = shape_[d];
      v.strides[d] = strides_[d];
    }
    return v;
  }

  std::int64_t size() const { return elements_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  /// Element `index` in row-major logical order.
  T& at(std::int64_t index) { return storage_[kGuard + offset(index)]; }
  const T& at(std::int64_t index) const { return storage_[kGuard + offset(index)]; }
  double value(std::int64_t index) const { return static_cast<double>(to_float(at(index))); }

  void fill_normal(std::mt19937& rng, float mean = 0.f, float stddev = 1.f) {
    std::normal_distribution<float> dist(mean, stddev);
    for (std::int64_t i = 0; i < elements_; ++i) at(i) = from_float<T>(dist(rng));
  }

  /// Number of storage elements outside the tensor's own elements whose canary was overwritten.
  std::int64_t damaged_canaries() const {
    const std::int64_t row_span = row_ + row_pad_;
    const std::int64_t owned_end = elements_ > 0 ? kGuard + offset(elements_ - 1) + 1 : kGuard;
    std::int64_t damaged = 0;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(storage_.size()); ++i) {
      const bool owned = i >= kGuard && i < owned_end && (i - kGuard) % row_span < row_;
      if (!owned && !same_bits(storage_[static_cast<std::size_t>(i)], canary<T>())) ++damaged;
    }
    return damaged;
  }

  /// A bitwise copy of the storage, to prove later that a failed call changed nothing.
  std::vector<T> snapshot() const { return storage_; }
  bool unchanged_since(const std::vector<T>& before) const {
    return std::memcmp(before.data(), storage_.data(), storage_.size() * sizeof(T)) == 0;
  }

 private:
  std::int64_t offset(std::int64_t index) const {
    return row_pad_ == 0 ? index : index + index / row_ * row_pad_;
  }

  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  std::vector<T> storage_;
  std::int64_t elements_ = 0;
  std::int64_t row_ = 1;      // elements per row (the last extent)
  std::int64_t row_pad_ = 0;  // canary elements after each row
};

/// A uint8 test tensor's view as a boolean tensor (std::vector<bool> has no element storage).
inline TensorView as_bool(TensorView view) {
  view.dtype = DType::boolean;
  return view;
}

/// A [d0, d1, d2, row.size()] f32 view of one row of `row` floats: every leading stride is 0, so
/// a shape of any size needs no more memory than that row (a broadcast input).
inline TensorView broadcast_row(std::vector<float>& row, std::int64_t d0, std::int64_t d1,
                                std::int64_t d2) {
  TensorView view;
  view.data = row.data();
  view.dtype = DType::f32;
  view.rank = 4;
  const std::int64_t shape[4] = {d0, d1, d2, static_cast<std::int64_t>(row.size())};
  for (int d = 0; d < 4; ++d) {
    view.shape[d] = shape[d];
    view.strides[d] = d == 3 ? 1 : 0;
  }
  return view;
}

/// ISA level name as used by DITOPS_ISA, for test names and messages.
std::string active_isa_name();

}  // namespace ditops::test
