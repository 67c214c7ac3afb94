#include "ops/core/scratch.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <ditops/runtime.hpp>
#include <string>

namespace ditops::core {
namespace {

/// Physical memory in bytes (0 where unknown): no single buffer can be larger. Asking the
/// allocator anyway would abort under AddressSanitizer, and with overcommit succeed only to
/// kill the process on first touch.
std::int64_t machine_memory() noexcept {
  static const std::int64_t bytes = []() -> std::int64_t {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    std::int64_t total = 0;
    if (pages <= 0 || page <= 0 || __builtin_mul_overflow(pages, page, &total)) return 0;
    return total;
  }();
  return bytes;
}

/// "274877906944 bytes (256.0 GiB)"
std::string size_text(std::int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%lld bytes (%.1f GiB)", static_cast<long long>(bytes),
                static_cast<double>(bytes) / (1 << 30));
  return text;
}

/// The padded byte size of `count` elements, or Error when no allocation could hold it.
std::int64_t checked_bytes(CheckedSize count, std::size_t element_bytes) {
  constexpr auto kAlignment = static_cast<std::int64_t>(kScratchAlignment);
  const CheckedSize padded = count * static_cast<std::int64_t>(element_bytes) + (kAlignment - 1);
  if (padded.overflow || count.value < 0) {
    fail(current_call(), "cannot allocate a scratch buffer of more than 2^63 bytes");
  }
  const std::int64_t size = padded.value / kAlignment * kAlignment;
  const std::int64_t memory = machine_memory();
  if (memory > 0 && size > memory) {
    fail(current_call(), "cannot allocate " + size_text(size) +
                             " of scratch: more than this machine's memory, " + size_text(memory));
  }
  return size;
}

}  // namespace

void allocation_failed(std::int64_t bytes) {
  fail(current_call(),
       "cannot allocate " + size_text(bytes) + " of scratch: the allocation failed");
}

void check_allocation(CheckedSize count, std::size_t element_bytes) {
  checked_bytes(count, element_bytes);
}

void* allocate_aligned(CheckedSize count, std::size_t element_bytes) {
  const std::int64_t size = checked_bytes(count, element_bytes);
  void* data = std::aligned_alloc(kScratchAlignment, static_cast<std::size_t>(size));
  if (data == nullptr) allocation_failed(size);
  return data;
}

namespace {
struct ThreadScratch {
  AlignedArray<std::uint8_t> buffer;
  std::int64_t bytes = 0;
};
thread_local std::array<ThreadScratch, static_cast<std::size_t>(ScratchUse::count)>
    scratch_of_thread;
}  // namespace

void* thread_scratch(ScratchUse use, CheckedSize count, std::size_t element_bytes) {
  // Never null, even for 0 elements (like aligned_array).
  const std::int64_t size = std::max<std::int64_t>(checked_bytes(count, element_bytes),
                                                   static_cast<std::int64_t>(kScratchAlignment));
  ThreadScratch& scratch = scratch_of_thread[static_cast<std::size_t>(use)];
  if (size > scratch.bytes) {
    scratch.buffer.reset();  // the old buffer goes first: a growing call never holds both
    scratch.bytes = 0;
    scratch.buffer.reset(static_cast<std::uint8_t*>(allocate_aligned(size, 1)));
    scratch.bytes = size;
  }
  return scratch.buffer.get();
}

}  // namespace ditops::core

namespace ditops {
void release_thread_scratch() noexcept {
  for (auto& scratch : core::scratch_of_thread) {
    scratch.buffer.reset();
    scratch.bytes = 0;
  }
}
}  // namespace ditops
