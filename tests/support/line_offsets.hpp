#pragma once
// Tensors that start anywhere within a cache line, as user allocators place them (glibc's malloc,
// std::vector and numpy put large arrays 16 bytes past a line): a kernel must compute the same
// bits wherever its buffers start, and write nothing outside them.

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

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
  /// The elements, `offset` bytes past a line; the bytes around them are reset to the guard.
  T* place(std::size_t offset) noexcept {
    begin_ = kLineBytes + offset;
    std::memset(storage_.get(), kGuard, begin_);
    std::memset(storage_.get() + end(), kGuard, total_bytes() - end());
    return reinterpret_cast<T*>(storage_.get() + begin_);
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

}  // namespace ditops::test
