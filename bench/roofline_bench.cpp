// Roofline probe: this machine's FP32 FMA, BF16 and INT8 dot-product peaks and its memory
// bandwidth, for 1 and 2 threads. The other benchmarks divide by these numbers. Each compute
// peak is labelled with the instructions it ran; one the CPU (as DITOPS_ISA caps it) lacks has no
// rate counter and the label "not on this CPU", which bench-summary shows in its table (an
// error would hide it, and a rate of 0 would be a limit nothing can be a fraction of).

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <ditops/runtime.hpp>
#include <string>

#include "bench/limits.hpp"

namespace ditops::bench {
namespace {

/// The peak, and in the label its instructions per cycle per core at the clock measured beside
/// it (the number of such units a core has, see probe_clock).
void report_peak(benchmark::State& state, PeakProbe (*choose)(), const char* unit) {
  const int threads = static_cast<int>(state.range(0));
  const PeakProbe probe = choose();
  double rate = 0, clock = 0;
  for (auto _ : state) {
    rate = run_probe(probe, threads);
    clock = probe.loop ? probe_clock(threads) : 0;
  }
  state.counters["threads"] = threads;
  if (probe.loop == nullptr) {
    state.SetLabel("not on this CPU (isa " + cpu_info().isa + ")");
    return;
  }
  // The label carries the count to the nearest half, the counters the measurement: Google
  // Benchmark keeps a label in its aggregates only where every repetition has the same one.
  const double per_cycle = instructions_per_cycle(probe, rate, threads, clock);
  char label[160];
  std::snprintf(label, sizeof label, "%s, %.1f per cycle per core", probe.instructions,
                std::round(per_cycle * 2) / 2);
  state.SetLabel(label);
  state.counters[unit] = rate / 1e9;
  state.counters["per_cycle"] = per_cycle;
  state.counters["GHz"] = clock / 1e9;
}

void BM_peak_fp32_fma(benchmark::State& s) { report_peak(s, fma_probe, "GFLOP/s"); }
void BM_peak_bf16_dot(benchmark::State& s) { report_peak(s, bf16_probe, "GFLOP/s"); }
void BM_peak_int8_dot(benchmark::State& s) { report_peak(s, int8_probe, "GOP/s"); }

void BM_memory_triad(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  double rate = 0;
  for (auto _ : state) rate = probe_triad(threads);
  state.SetLabel("best of ordinary and streaming stores");
  state.counters["GB/s"] = rate / 1e9;
  state.counters["threads"] = threads;
}

// One iteration each: the probe itself takes the median of five timed runs.
BENCHMARK(BM_peak_fp32_fma)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peak_bf16_dot)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peak_int8_dot)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_memory_triad)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ditops::bench
