#pragma once
// Tensors that start anywhere within a cache line, as user allocators place them (glibc's malloc,
// std::vector and numpy put large arrays 16 bytes past a line): a kernel must compute the same
// bits wherever its buffers start, and write nothing outside them.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "tests/support/test_tensor.hpp"

namespace ditops::test {

inline constexpr std::size_t kLineBytes = 64;

/// Room for `count` elements of T that place() puts at any offset within a cache line, with
/// guard bytes around them. One allocation for every offset (large outputs would otherwise
/// fault in fresh pages on every placement).
template <class T>
class OffsetBuffer {
 public:
  explicit OffsetBuffer(std::size_t count)
      : count_(count),
        storage_(static_cast<std::byte*>(std::aligned_alloc(kLineBytes, total_bytes()))) {
    if (!storage_) throw std::bad_alloc();
  }
  /// The elements, `offset` bytes past a line (rounded down to a multiple of sizeof(T), so that
  /// the tensors of one call can share an offset); the bytes around them are reset to the guard.
  T* place(std::size_t offset) noexcept {
    begin_ = kLineBytes + offset / sizeof(T) * sizeof(T);
    std::memset(storage_.get(), kGuard, begin_);
    std::memset(storage_.get() + end(), kGuard, total_bytes() - end());
    return reinterpret_cast<T*>(storage_.get() + begin_);
  }
  /// place(offset) holding a copy of `values` (count elements).
  T* place_copy(std::size_t offset, const std::vector<T>& values) noexcept {
    T* placed = place(offset);
    std::memcpy(placed, values.data(), bytes());
    return placed;
  }
  std::size_t bytes() const noexcept { return count_ * sizeof(T); }
  /// Whether every byte around the placed elements still holds the guard pattern.
  bool guards_intact() const noexcept {
    const std::byte* base = storage_.get();
    for (std::size_t i = 0; i < total_bytes(); i = i + 1 == begin_ ? end() : i + 1) {
      if (base[i] != std::byte{kGuard}) return false;
    }
    return true;
  }

 private:
  static constexpr unsigned char kGuard = 0xA5;
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  /// A guard line, up to a line of offset, the elements, at least a guard line; whole lines.
  std::size_t total_bytes() const noexcept {
    return (3 * kLineBytes + bytes() + kLineBytes - 1) / kLineBytes * kLineBytes;
  }
  std::size_t end() const noexcept { return begin_ + bytes(); }
  std::size_t count_, begin_ = kLineBytes;
  std::unique_ptr<std::byte[], Free> storage_;
};

/// `count` values drawn from N(0, 1), rounded to T.
template <class T>
std::vector<T> normal_values(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<T> values(count);
  for (T& value : values) value = from_float<T>(normal(rng));
  return values;
}

/// The bytes of `count` elements at `data` (a call's output, to compare bit for bit).
template <class T>
std::vector<std::byte> bytes_of(const T* data, std::size_t count) {
  const auto* first = reinterpret_cast<const std::byte*>(data);
  return std::vector<std::byte>(first, first + count * sizeof(T));
}

/// Checks that a kernel computes the same bits wherever its buffers start. run(offset) places
/// the call's tensors `offset` bytes past a cache line, runs it, checks its guards and returns
/// its outputs' bytes (bytes_of); every offset that is a multiple of `step` (the alignment of
/// the tensors' element type) must give the bytes of offset 0.
template <class Run>
void expect_every_offset_equals_aligned(std::size_t step, const Run& run,
                                        const std::string& context) {
  const std::vector<std::byte> aligned = run(std::size_t{0});
  for (std::size_t offset = step; offset < kLineBytes; offset += step) {
    EXPECT_TRUE(run(offset) == aligned)
        << context << ": tensors " << offset << " bytes past a line differ from the aligned run"
        << ", isa " << active_isa_name();
  }
}

}  // namespace ditops::test
