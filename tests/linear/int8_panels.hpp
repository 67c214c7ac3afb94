#pragma once
// Test helpers for the int8 GEMM kernels called directly (linear/amx_gemm_test.cpp,
// linear/avxvnni_model_test.cpp): aligned buffers and weight panels packed as the layer packs
// them.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace ditops::test {

inline std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

/// 64-byte aligned, zeroed storage (the kernels load column scales and biases aligned).
template <class T>
struct Aligned {
  explicit Aligned(std::int64_t count)
      : data(static_cast<T*>(std::aligned_alloc(64, round_up(count * sizeof(T) + 1, 64)))) {
    std::memset(data.get(), 0, static_cast<std::size_t>(round_up(count * sizeof(T) + 1, 64)));
  }
  T* get() const { return data.get(); }
  T& operator[](std::int64_t i) const { return data.get()[i]; }
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data;
};

/// W [n, k] packed as make_layer packs it for panels of `cols` columns, with the column
/// epilogue (offset, scale, bias) padded to whole panels.
struct Packed {
  int cols;
  std::int64_t k_padded, panels, panel_bytes;
  Aligned<std::int8_t> panel_data;
  Aligned<std::int32_t> offset;
  Aligned<float> scale, bias;

  Packed(const std::vector<std::int8_t>& w, std::int64_t n, std::int64_t k, int columns,
         int activation_offset, const std::vector<std::int32_t>& column_offset,
         const std::vector<float>& column_scale, const std::vector<float>& column_bias)
      : cols(columns),
        k_padded(round_up(k, 64)),
        panels((n + columns - 1) / columns),
        panel_bytes(k_padded * columns),
        panel_data(panels * panel_bytes),
        offset(panels * columns),
        scale(panels * columns),
        bias(panels * columns) {
    for (std::int64_t row = 0; row < n; ++row) {
      std::int8_t* panel = panel_data.get() + (row / cols) * panel_bytes + (row % cols) * 4;
      std::int32_t sum = 0;
      for (std::int64_t i = 0; i < k; ++i) {
        panel[(i / 4) * cols * 4 + i % 4] = w[row * k + i];
        sum += w[row * k + i];
      }
      offset[row] = column_offset[row] - activation_offset * sum;
      scale[row] = column_scale[row];
      bias[row] = column_bias[row];
    }
  }
};

}  // namespace ditops::test
