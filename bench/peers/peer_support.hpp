#pragma once
// Plumbing shared by the ditops peer binaries that tools/bench-peers.sh times beside PyTorch and
// ONNX Runtime: "--name value" flags, N(0, 1) inputs made the way the Python peers make theirs,
// and the JSON list of timed calls every peer prints.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ditops/tensor.hpp>
#include <map>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

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

/// An allocator aligning every buffer to a cache line, as PyTorch's and ONNX Runtime's CPU
/// allocators align tensors: each library is timed on the same layout (glibc's malloc puts
/// large blocks 16 bytes past a page, which costs short-row kernels partial lines at each row's
/// ends).
template <class T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlignment); }
  bool operator==(const LineAligned&) const noexcept { return true; }
};
template <class T>
using Buffer = std::vector<T, LineAligned<T>>;

template <class T>
Buffer<T> normal_values(std::int64_t count, unsigned seed) {
  Buffer<T> values(static_cast<std::size_t>(count));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (auto& value : values) value = from_float<T>(normal(rng));
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
