#pragma once
// Plumbing shared by the ditops peer binaries that tools/bench-peers.sh times beside PyTorch and
// ONNX Runtime: "--name value" flags, N(0, 1) inputs made the way the Python peers make theirs,
// and the JSON list of timed calls every peer prints.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ditops/tensor.hpp>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>
#include <string>

namespace ditops::peers {

/// "--name value" pairs; throws on a flag without a value.
inline std::map<std::string, std::string> parse_flags(int argc, char** argv) {
  if (argc % 2 == 0) throw std::invalid_argument("flags come in pairs (--name value)");
  std::map<std::string, std::string> flags;
  for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  return flags;
}

/// The integer value of `name`, or `fallback` when the flag is absent.
inline std::int64_t int_flag(const std::map<std::string, std::string>& flags, const char* name,
                             std::int64_t fallback) {
  const auto it = flags.find(name);
  return it == flags.end() ? fallback : std::stoll(it->second);
}

/// The string value of `name`, or `fallback` when the flag is absent.
inline std::string string_flag(const std::map<std::string, std::string>& flags, const char* name,
                               const std::string& fallback) {
  const auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}

/// `count` elements of T, each `fill`, starting `offset` bytes past a cache line: 0 as
/// PyTorch's and ONNX Runtime's allocators align tensors, 16 where glibc's malloc (so
/// std::vector and numpy) puts large arrays. The peers time both (--offset).
template <class T>
class Buffer {
 public:
  Buffer(std::size_t count, std::size_t offset, T fill = T{}) : count_(count) {
    if (offset % alignof(T) != 0) {
      throw std::invalid_argument("--offset must be a multiple of the element size");
    }
    storage_.reset(static_cast<std::byte*>(
        ::operator new[](static_cast<std::size_t>(kLine) + offset + count * sizeof(T), kLine)));
    data_ = reinterpret_cast<T*>(storage_.get() + offset);
    std::fill(data_, data_ + count_, fill);
  }
  T* data() noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }

 private:
  static constexpr std::align_val_t kLine{64};
  struct Free {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, kLine); }
  };
  std::size_t count_;
  std::unique_ptr<std::byte[], Free> storage_;
  T* data_ = nullptr;
};

/// A Buffer of `count` N(0, 1) values `offset` bytes past a line.
template <class T>
Buffer<T> normal_values(std::int64_t count, std::size_t offset, unsigned seed) {
  Buffer<T> values(static_cast<std::size_t>(count), offset);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = from_float<T>(normal(rng));
  return values;
}

/// Prints `"ms": [t1, t2, ...]` for `reps` timed calls of `call` (the caller made the untimed
/// first call and prints the braces around this).
template <class Call>
void print_timed_calls(std::int64_t reps, const Call& call) {
  std::printf("\"ms\": [");
  for (std::int64_t rep = 0; rep < reps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    call();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s%.3f", rep == 0 ? "" : ", ", ms);
  }
  std::printf("]");
}

}  // namespace ditops::peers
