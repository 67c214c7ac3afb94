#pragma once
// The tensors of one attention call (q, k, v, out, lse), placed anywhere within a cache line for
// the line-offset tests of the attention and sparse families.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tests/support/line_offsets.hpp"

namespace ditops::test {

/// Inputs and outputs of one call, placed anywhere within a line.
template <class T>
struct PlacedAttention {
  PlacedAttention(std::int64_t q_rows, std::int64_t kv_rows, std::int64_t heads,
                  std::int64_t kv_heads, std::int64_t dim)
      : q_count(static_cast<std::size_t>(q_rows * heads * dim)),
        kv_count(static_cast<std::size_t>(kv_rows * kv_heads * dim)),
        lse_count(static_cast<std::size_t>(q_rows * heads)),
        q0(normal_values<T>(q_count, 1)),
        k0(normal_values<T>(kv_count, 2)),
        v0(normal_values<T>(kv_count, 3)),
        q(q_count),
        k(kv_count),
        v(kv_count),
        out(q_count),
        lse(lse_count) {}

  /// Places every tensor `offset` bytes past a line (OffsetBuffer::place).
  void place(std::size_t offset) {
    q_data = q.place_copy(offset, q0);
    k_data = k.place_copy(offset, k0);
    v_data = v.place_copy(offset, v0);
    out_data = out.place(offset);
    lse_data = lse.place(offset);
  }
  bool guards_intact() const { return out.guards_intact() && lse.guards_intact(); }
  std::vector<std::byte> outputs() const {
    std::vector<std::byte> bytes = bytes_of(out_data, q_count);
    const std::vector<std::byte> lse_bytes = bytes_of(lse_data, lse_count);
    bytes.insert(bytes.end(), lse_bytes.begin(), lse_bytes.end());
    return bytes;
  }

  std::size_t q_count, kv_count, lse_count;
  std::vector<T> q0, k0, v0;
  OffsetBuffer<T> q, k, v, out;
  OffsetBuffer<float> lse;
  T *q_data = nullptr, *k_data = nullptr, *v_data = nullptr, *out_data = nullptr;
  float* lse_data = nullptr;
};

}  // namespace ditops::test
