// Simulator speed: instructions simulated per second on MLA programs of growing size, and the
// wall time of the default `ditops-sim sweep` (7 batches x 3 kv lengths x 3 chunks), whose
// target is under 5 s.

#include <benchmark/benchmark.h>

#include "sim/engine.hpp"
#include "sim/hw.hpp"
#include "sim/mla.hpp"

namespace {

namespace sim = ditops::sim;

sim::MlaConfig config_of(int batch, int kv, int chunk) {
  sim::MlaConfig config;
  config.batch = batch;
  config.kv = kv;
  config.chunk = chunk;
  return config;
}

// Engine only: the program is built once outside the timed loop.
void bm_simulate(benchmark::State& state) {
  const sim::HwParams hw;
  const sim::Program program = sim::build_mla_program(
      config_of(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), 2), hw);
  std::uint64_t instructions = 0;
  for (auto _ : state) {
    const sim::SimResult result = sim::simulate(program, hw);
    instructions += result.instructions;
    benchmark::DoNotOptimize(result.makespan);
  }
  state.counters["instr/s"] =
      benchmark::Counter(static_cast<double>(instructions), benchmark::Counter::kIsRate);
  state.counters["instructions"] = static_cast<double>(program.instrs.size());
}
BENCHMARK(bm_simulate)
    ->Args({1, 2048})
    ->Args({8, 4096})
    ->Args({48, 4096})
    ->Unit(benchmark::kMillisecond);

// Build + simulate, as the CLI does per sweep point.
void bm_build_and_simulate(benchmark::State& state) {
  const sim::HwParams hw;
  const sim::MlaConfig config =
      config_of(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), 2);
  std::uint64_t instructions = 0;
  for (auto _ : state) {
    const sim::Program program = sim::build_mla_program(config, hw);
    const sim::SimResult result = sim::simulate(program, hw);
    instructions += result.instructions;
    benchmark::DoNotOptimize(result.makespan);
  }
  state.counters["instr/s"] =
      benchmark::Counter(static_cast<double>(instructions), benchmark::Counter::kIsRate);
}
BENCHMARK(bm_build_and_simulate)->Args({48, 4096})->Unit(benchmark::kMillisecond);

void bm_default_sweep(benchmark::State& state) {
  const sim::HwParams hw;
  std::uint64_t instructions = 0;
  for (auto _ : state) {
    for (const int batch : {1, 2, 4, 8, 16, 24, 48}) {
      for (const int kv : {512, 2048, 4096}) {
        for (const int chunk : {1, 2, 4}) {
          const sim::Program program = sim::build_mla_program(config_of(batch, kv, chunk), hw);
          const sim::SimResult result = sim::simulate(program, hw);
          instructions += result.instructions;
          benchmark::DoNotOptimize(result.makespan);
        }
      }
    }
  }
  state.counters["instr/s"] =
      benchmark::Counter(static_cast<double>(instructions), benchmark::Counter::kIsRate);
}
BENCHMARK(bm_default_sweep)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
