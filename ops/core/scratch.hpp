#pragma once
// Scratch memory for kernels: 64-byte aligned, with per-thread slices on separate cache lines
// (two threads writing neighbouring slices of one line would bounce it between cores).

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace ditops::core {

inline constexpr std::size_t kScratchAlignment = 64;

template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t count) {
    if (count == 0) return;
    const std::size_t bytes =
        (count * sizeof(T) + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
    data_.reset(static_cast<T*>(std::aligned_alloc(kScratchAlignment, bytes)));
    if (!data_) throw std::bad_alloc();
  }
  T* data() noexcept { return data_.get(); }
  bool empty() const noexcept { return !data_; }

 private:
  struct Free {
    void operator()(T* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
};

/// Elements per thread slice holding `count` elements, rounded up to whole cache lines.
template <class T>
constexpr std::size_t per_thread_stride(std::size_t count) noexcept {
  constexpr std::size_t kPerLine = kScratchAlignment / sizeof(T);
  return (count + kPerLine - 1) / kPerLine * kPerLine;
}

}  // namespace ditops::core
