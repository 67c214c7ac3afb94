#pragma once
// Shared benchmark plumbing: cold-cache buffer rotation and the throughput counters every
// benchmark reports (absolute rate and fraction of the measured limit).

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <ditops/tensor.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/limits.hpp"

namespace ditops::bench {

/// Copies of a buffer of `elements` T, cycled so each iteration touches memory that is not in
/// any cache (copies_to_defeat_cache). Filled with N(0, 1) values.
template <class T>
class ColdBuffers {
 public:
  ColdBuffers(std::int64_t elements, std::int64_t working_set_bytes, unsigned seed = 1)
      : elements_(elements) {
    const int copies = copies_to_defeat_cache(working_set_bytes);
    storage_.resize(static_cast<std::size_t>(elements) * copies);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist;
    // Fill one copy and replicate it: generating a GB of normals would dominate set-up time.
    for (std::int64_t i = 0; i < elements; ++i) storage_[i] = from_float<T>(dist(rng));
    for (int c = 1; c < copies; ++c) {
      std::memcpy(storage_.data() + c * elements, storage_.data(), elements * sizeof(T));
    }
  }
  int copies() const { return static_cast<int>(storage_.size() / elements_); }
  T* copy(int index) { return storage_.data() + (index % copies()) * elements_; }

 private:
  std::int64_t elements_;
  std::vector<T> storage_;
};

/// GB/s and the fraction of the measured memory bandwidth for `bytes_per_iteration`.
inline void report_bandwidth(benchmark::State& state, double bytes_per_iteration, int threads) {
  const double bytes = bytes_per_iteration * static_cast<double>(state.iterations());
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["frac_bw"] =
      benchmark::Counter(bytes / measured_limits(threads).bandwidth, benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

/// GFLOP/s and the fraction of `peak` (FLOP/s) for `flops_per_iteration`.
inline void report_flops(benchmark::State& state, double flops_per_iteration, double peak,
                         int threads) {
  const double flops = flops_per_iteration * static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  if (peak > 0) {
    state.counters["frac_peak"] = benchmark::Counter(flops / peak, benchmark::Counter::kIsRate);
  }
  state.counters["threads"] = threads;
}

}  // namespace ditops::bench
