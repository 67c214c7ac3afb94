#pragma once
// Scratch memory for kernels: 64-byte aligned, with per-thread slices on separate cache lines
// (two threads writing neighbouring slices of one line would bounce it between cores). Every
// such allocation goes through allocate_aligned, which checks the size first.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "ops/core/check.hpp"

namespace ditops::core {

inline constexpr std::size_t kScratchAlignment = 64;

/// `count` elements of `element_bytes` each, 64-byte aligned. A size that overflows or is
/// negative, one larger
/// than this machine's memory, or an allocation that fails throws Error naming the running call
/// (CallScope) and the size: a hostile shape is an error up front, never an abort or a null
/// pointer later. Free with std::free.
void* allocate_aligned(CheckedSize count, std::size_t element_bytes);
/// Throws the Error of an allocation of `bytes` that failed.
[[noreturn]] void allocation_failed(std::int64_t bytes);

/// allocate_aligned's size checks without the allocation, for the containers that grow with the
/// problem (task and job lists, plans): call it with the final size before filling one.
void check_allocation(CheckedSize count, std::size_t element_bytes);

/// `vector.reserve(count)` after check_allocation; a failed allocation is an Error naming the
/// running call and the size too (never std::bad_alloc).
template <class T>
void checked_reserve(std::vector<T>& vector, CheckedSize count) {
  check_allocation(count, sizeof(T));
  try {
    vector.reserve(static_cast<std::size_t>(count.value));
  } catch (const std::bad_alloc&) {
    allocation_failed(count.value * static_cast<std::int64_t>(sizeof(T)));
  }
}

struct AlignedFree {
  void operator()(void* p) const noexcept { std::free(p); }
};
template <class T>
using AlignedArray = std::unique_ptr<T[], AlignedFree>;

/// An array of max(count, 1) elements (never null).
template <class T>
AlignedArray<T> aligned_array(CheckedSize count) {
  if (!count.overflow) count.value = std::max<std::int64_t>(count.value, 1);
  return AlignedArray<T>(static_cast<T*>(allocate_aligned(count, sizeof(T))));
}

/// An array of `count` elements, or none for 0 (empty()).
template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t count) {
    // A count beyond int64 turns negative, which allocate_aligned rejects.
    if (count > 0) data_ = aligned_array<T>(static_cast<std::int64_t>(count));
  }
  T* data() noexcept { return data_.get(); }
  bool empty() const noexcept { return !data_; }

 private:
  AlignedArray<T> data_;
};

/// What a thread_scratch buffer is for: each use has its own buffer, so the buffers one call
/// holds at once never alias.
enum class ScratchUse {
  attention_k,      ///< flash's packed K^T, or the int8 backend's quantized K
  attention_v,      ///< flash's packed V, or the int8 backend's quantized V
  attention_tasks,  ///< per-thread task scratch of an attention call
  linear_rows,
  mla_queries,
  mla_partials,
  mla_workspace,
  count
};

/// `count` elements of `element_bytes` each, 64-byte aligned, owned by the calling thread and
/// kept across calls (grown to the largest call, then reused; the contents are not kept). A
/// model repeats its shapes every step, and fresh multi-MiB buffers fault their pages in again
/// on every call: 5-10 % of an attention prefill or an MLA decode step. Sizes are checked as in
/// allocate_aligned. Freed when the thread exits or calls ditops::release_thread_scratch().
void* thread_scratch(ScratchUse use, CheckedSize count, std::size_t element_bytes);
template <class T>
T* thread_scratch(ScratchUse use, CheckedSize count) {
  return static_cast<T*>(thread_scratch(use, count, sizeof(T)));
}

/// Elements per thread slice holding `count` elements, rounded up to whole cache lines.
template <class T>
constexpr std::size_t per_thread_stride(std::size_t count) noexcept {
  constexpr std::size_t kPerLine = kScratchAlignment / sizeof(T);
  return (count + kPerLine - 1) / kPerLine * kPerLine;
}

}  // namespace ditops::core
