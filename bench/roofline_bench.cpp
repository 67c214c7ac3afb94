// Roofline probe: this machine's FP32 FMA, BF16 and INT8 dot-product peaks and its memory
// bandwidth, for 1 and 2 threads. The other benchmarks divide by these numbers.

#include <benchmark/benchmark.h>

#include <ditops/runtime.hpp>

#include "bench/limits.hpp"

namespace ditops::bench {
namespace {

void report(benchmark::State& state, double (*probe)(int), const char* unit) {
  const int threads = static_cast<int>(state.range(0));
  double rate = 0;
  for (auto _ : state) rate = probe(threads);
  if (rate == 0) {
    state.SkipWithError("this CPU lacks the instruction");
    return;
  }
  state.counters[unit] = rate / 1e9;
  state.counters["threads"] = threads;
}

void BM_peak_fp32_fma(benchmark::State& s) { report(s, probe_fma, "GFLOP/s"); }
void BM_peak_bf16_dot(benchmark::State& s) { report(s, probe_bf16, "GFLOP/s"); }
void BM_peak_int8_vnni(benchmark::State& s) { report(s, probe_vnni, "GOP/s"); }
void BM_memory_triad(benchmark::State& s) { report(s, probe_triad, "GB/s"); }

// One iteration each: the probe itself takes the median of five timed runs.
BENCHMARK(BM_peak_fp32_fma)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peak_bf16_dot)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peak_int8_vnni)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_memory_triad)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ditops::bench
