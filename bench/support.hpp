#pragma once
// Shared benchmark plumbing: cold-cache buffer rotation and the throughput counters every
// benchmark reports (absolute rate and fraction of the measured limit).

#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ditops/tensor.hpp>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/limits.hpp"

namespace ditops::bench {

/// The Eigen scalar of ditops' element type T, for the Eigen-expression baselines.
template <class T>
using EigenScalar =
    std::conditional_t<std::is_same_v<T, bf16>, Eigen::bfloat16,
                       std::conditional_t<std::is_same_v<T, f16>, Eigen::half, float>>;

/// Bytes past a cache line where the misaligned = 1 runs' tensors start: where glibc's malloc,
/// std::vector and numpy put large arrays.
constexpr std::int64_t kMisalignBytes = 16;

/// Elements to skip at the start of each buffer copy (the buffers hold that many more) when the
/// benchmark argument `arg` asks for misaligned tensors.
template <class T>
std::int64_t skip_elements(benchmark::State& state, int arg) {
  return state.range(arg) != 0 ? kMisalignBytes / static_cast<std::int64_t>(sizeof(T)) : 0;
}

/// `count` elements of T starting on a cache line, or kMisalignBytes past one when
/// `misaligned`: a tensor where a framework's allocator puts it, or where glibc's malloc does.
template <class T>
class PlacedBuffer {
 public:
  PlacedBuffer(std::int64_t count, bool misaligned)
      : count_(static_cast<std::size_t>(count)),
        skip_(misaligned ? kMisalignBytes / sizeof(T) : 0),
        storage_(static_cast<T*>(
            std::aligned_alloc(64, round_up_to_line((count_ + skip_) * sizeof(T))))) {
    if (!storage_) throw std::bad_alloc();
  }
  T* data() { return storage_.get() + skip_; }
  const T* data() const { return storage_.get() + skip_; }
  std::size_t size() const { return count_; }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }

 private:
  static std::size_t round_up_to_line(std::size_t bytes) { return (bytes + 63) / 64 * 64; }
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::size_t count_, skip_;
  std::unique_ptr<T, Free> storage_;
};

/// A PlacedBuffer of `count` N(0, 1) values.
template <class T>
PlacedBuffer<T> normal_buffer(std::int64_t count, bool misaligned, unsigned seed) {
  PlacedBuffer<T> buffer(count, misaligned);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = from_float<T>(dist(rng));
  return buffer;
}

/// " misaligned" for labels of runs on misaligned tensors, else "".
inline const char* placement_label(bool misaligned) { return misaligned ? " misaligned" : ""; }

/// Copies of a buffer of `elements` T, cycled so each iteration touches memory that is not in
/// any cache (copies_to_defeat_cache). Filled with N(0, 1) values. Each copy starts on a
/// 64-byte boundary, as framework allocators (PyTorch, ONNX Runtime) align tensors.
template <class T>
class ColdBuffers {
 public:
  ColdBuffers(std::int64_t elements, std::int64_t working_set_bytes, unsigned seed = 1)
      : elements_(round_up(elements)) {
    const int copies = copies_to_defeat_cache(working_set_bytes);
    storage_.reset(static_cast<T*>(
        std::aligned_alloc(64, static_cast<std::size_t>(elements_) * copies * sizeof(T))));
    copies_ = copies;
    // Normals for the first 2^20 elements only, repeated over the copies: generating the
    // hundreds of MB of normals a copy holds would dominate set-up time (Google Benchmark sets
    // up again for each run it times), and a memory-bound kernel's speed does not depend on
    // which normals it reads.
    const std::int64_t pattern = std::min<std::int64_t>(elements_, kPatternElements);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist;
    for (std::int64_t i = 0; i < pattern; ++i) storage_.get()[i] = from_float<T>(dist(rng));
    const std::int64_t total = elements_ * copies;
    for (std::int64_t filled = pattern; filled < total;) {
      const std::int64_t count = std::min(filled, total - filled);
      std::memcpy(storage_.get() + filled, storage_.get(), count * sizeof(T));
      filled += count;
    }
  }
  int copies() const { return copies_; }
  T* copy(int index) { return storage_.get() + (index % copies_) * elements_; }

 private:
  static constexpr std::int64_t kPatternElements = std::int64_t{1} << 20;
  static std::int64_t round_up(std::int64_t elements) {
    constexpr std::int64_t kPerLine = 64 / sizeof(T);
    return (elements + kPerLine - 1) / kPerLine * kPerLine;
  }
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::int64_t elements_;
  int copies_ = 0;
  std::unique_ptr<T, Free> storage_;
};

/// A rate counter (`amount_per_iteration` per second, / 1e9) and its fraction of `limit` (per
/// second). The fraction is left out where the CPU (as capped) lacks the limit (0): a counter of
/// 0 is no fraction, and repeated runs turn it into a coefficient of variation of 0/0 = NaN,
/// which is not JSON.
inline void report_rate(benchmark::State& state, const char* rate_counter,
                        const char* fraction_counter, double amount_per_iteration, double limit,
                        int threads) {
  const double amount = amount_per_iteration * static_cast<double>(state.iterations());
  state.counters[rate_counter] = benchmark::Counter(amount / 1e9, benchmark::Counter::kIsRate);
  if (limit > 0) {
    state.counters[fraction_counter] =
        benchmark::Counter(amount / limit, benchmark::Counter::kIsRate);
  }
  state.counters["threads"] = threads;
}

/// GB/s and the fraction of the measured memory bandwidth for `bytes_per_iteration`.
inline void report_bandwidth(benchmark::State& state, double bytes_per_iteration, int threads) {
  report_rate(state, "GB/s", "frac_bw", bytes_per_iteration, measured_limits(threads).bandwidth,
              threads);
}

/// GFLOP/s and the fraction of `peak` (FLOP/s) for `flops_per_iteration`.
inline void report_flops(benchmark::State& state, double flops_per_iteration, double peak,
                         int threads) {
  report_rate(state, "GFLOP/s", "frac_peak", flops_per_iteration, peak, threads);
}

/// GOP/s of int8 operations (2 per u8 x s8 multiply-add) and their fraction of the measured int8
/// dot-product peak (frac_int8).
inline void report_int8_ops(benchmark::State& state, double ops_per_iteration, int threads) {
  report_rate(state, "GOP/s", "frac_int8", ops_per_iteration, measured_limits(threads).int8_ops,
              threads);
}

}  // namespace ditops::bench
