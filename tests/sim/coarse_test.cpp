// Coarse mode (one folded event per core, unit and stage) against the fine, instruction-level
// model on shapes the fine model runs in well under a second: total time, the ranking of
// chunk and optimization choices, traffic, and the engine's rules for a folded stage.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sim/engine.hpp"
#include "sim/fa.hpp"
#include "sim/hw.hpp"
#include "sim/mla.hpp"
#include "sim/program.hpp"

namespace ditops::sim {
namespace {

template <class Config>
SimResult run(Config config, SimMode mode, const HwParams& hw) {
  config.mode = mode;
  if constexpr (std::is_same_v<Config, FaConfig>) {
    return simulate(build_fa_program(config, hw), hw);
  } else {
    return simulate(build_mla_program(config, hw), hw);
  }
}

FaConfig flux_like(int chunk, const char* opts = "none") {
  FaConfig config;
  config.heads = 8;
  config.seq = 4608;
  config.chunk = chunk;
  config.opts = parse_mla_opts(opts);
  return config;
}

FaConfig wan_like(double sparsity) {
  FaConfig config;
  config.heads = 3;
  config.rainfusion = true;
  config.frames = 6;
  config.height = 30;
  config.width = 52;
  config.text = 512;
  config.seq = 6 * 30 * 52 + 512;
  config.sparsity = sparsity;
  return config;
}

// sim/README.md states the coarse mode's error; these shapes are the fa part of its table.
// Chunk 1 misses the 3 % target (-4.2 % here): it is bounded at its measured error.
TEST(Coarse, FaTimeWithin3PercentOfFine) {
  const HwParams hw;
  std::vector<std::pair<FaConfig, double>> configs = {
      {flux_like(1), 0.045},       {flux_like(2), 0.03},   {flux_like(4), 0.03},
      {flux_like(4, "all"), 0.03}, {wan_like(0.64), 0.03}, {wan_like(0.9), 0.03}};
  FaConfig sparse = flux_like(2);
  sparse.density = 0.25;
  configs.emplace_back(sparse, 0.03);
  for (const auto& [config, bound] : configs) {
    const double fine = run(config, SimMode::fine, hw).makespan;
    const double coarse = run(config, SimMode::coarse, hw).makespan;
    EXPECT_NEAR(coarse / fine, 1.0, bound) << describe(config);
  }
}

// The question the simulator answers: which chunk is fastest with a set of switches, and which
// switches help at a chunk. Choices whose fine times are more than 10 % apart keep their order;
// closer ones may swap (sim/README.md: chunk 1 with unit_flag,int8_layout is 8 % slower than
// chunk 4 in the fine model and 1 % faster in the coarse one).
TEST(Coarse, FaRanksChunksAndOptsAsFine) {
  const HwParams hw;
  const std::vector<int> chunks = {1, 2, 4};
  const std::vector<const char*> opts = {"none", "all", "unit_flag,int8_layout"};
  std::vector<double> fine, coarse;
  std::vector<std::string> names;
  for (const int chunk : chunks) {
    for (const char* opt : opts) {
      fine.push_back(run(flux_like(chunk, opt), SimMode::fine, hw).makespan);
      coarse.push_back(run(flux_like(chunk, opt), SimMode::coarse, hw).makespan);
      names.push_back("chunk " + std::to_string(chunk) + " " + opt);
    }
  }
  int compared = 0;
  for (std::size_t a = 0; a < fine.size(); ++a) {
    for (std::size_t b = 0; b < fine.size(); ++b) {
      const bool same_chunk = a / opts.size() == b / opts.size();
      const bool same_opts = a % opts.size() == b % opts.size();
      if (a == b || !(same_chunk || same_opts) || fine[a] * 1.10 > fine[b]) continue;
      ++compared;
      EXPECT_LT(coarse[a], coarse[b]) << names[a] << " is faster than " << names[b];
    }
  }
  EXPECT_GE(compared, 5);  // the grid has real choices to rank
}

// MLA decode misses the 3 % target (sim/README.md gives the measured error over the default
// sweep); this bounds it and checks the chunk ranking it must keep.
TEST(Coarse, MlaWithinItsMeasuredErrorAndRanksChunksAsFine) {
  const HwParams hw;
  for (const int batch : {1, 8, 24}) {
    for (const int kv : {512, 2048}) {
      std::vector<double> fine, coarse;
      for (const int chunk : {1, 2, 4}) {
        MlaConfig config;
        config.batch = batch;
        config.kv = kv;
        config.chunk = chunk;
        fine.push_back(run(config, SimMode::fine, hw).makespan);
        coarse.push_back(run(config, SimMode::coarse, hw).makespan);
        EXPECT_NEAR(coarse.back() / fine.back(), 1.0, 0.10) << describe(config);
      }
      const auto fastest = [](const std::vector<double>& times) {
        return std::min_element(times.begin(), times.end()) - times.begin();
      };
      EXPECT_EQ(fastest(fine), fastest(coarse)) << "batch " << batch << " kv " << kv;
    }
  }
}

// Folding keeps every byte on its level, and far fewer events.
TEST(Coarse, KeepsTheTrafficWithFarFewerEvents) {
  const HwParams hw;
  const FaConfig config = wan_like(0.8);
  FaConfig coarse_config = config;
  coarse_config.mode = SimMode::coarse;
  const Program fine = build_fa_program(config, hw);
  const Program coarse = build_fa_program(coarse_config, hw);
  EXPECT_LT(coarse.instrs.size() * 10, fine.instrs.size());
  const SimResult fine_result = simulate(fine, hw);
  const SimResult coarse_result = simulate(coarse, hw);
  EXPECT_NEAR(coarse_result.hbm_bytes, fine_result.hbm_bytes, 1e-6 * fine_result.hbm_bytes);
  EXPECT_NEAR(coarse_result.l2_bytes, fine_result.l2_bytes, 1e-6 * fine_result.l2_bytes);
  // The estimate the CLI's --mode auto and --max-instructions use.
  const double estimate = static_cast<double>(estimate_fa_instructions(coarse_config, hw));
  EXPECT_NEAR(estimate / static_cast<double>(coarse.instrs.size()), 1.0, 0.05);
}

// A folded stage: waits for its flag, holds its pipe for head + transfer, retires `latency`
// later (not before `chain`), then sets its flag; the AIVs' stage waits for it.
TEST(Coarse, AStageWaitsHoldsRetiresThenSets) {
  HwParams hw;
  Program program(1);
  program.cross_flag_names.assign(static_cast<std::size_t>(hw.cross_core_flag_ids), "");
  Instr cube;
  cube.op = Op::stage;
  cube.pipe = Pipe::m;
  cube.cycles = 100;
  cube.bytes = 1000;
  cube.port_rate = 10;  // 100 cycles uncontended
  cube.ideal_cycles = 200;
  cube.latency = 50;
  cube.flag = 0;
  cube.mode = 2;
  program.add(cube);
  for (const int aiv : {1, 2}) {
    Instr vector;
    vector.op = Op::stage;
    vector.unit = static_cast<std::uint8_t>(aiv);
    vector.pipe = Pipe::v;
    vector.cycles = 30;
    vector.wait_flag = 0;
    program.add(vector);
  }
  const SimResult result = simulate(program, hw);
  // 200 held + 50 latency, the flag's latency, then 30 on each AIV.
  EXPECT_DOUBLE_EQ(result.makespan, 250 + hw.cross_core_flag_latency_cycles + 30);
  EXPECT_DOUBLE_EQ(result.l2_bytes, 1000);
  const PipeStats& aiv = result.pipes[static_cast<std::size_t>(local_pipe_index(1, Pipe::v))];
  EXPECT_DOUBLE_EQ(aiv.blocked, 250 + hw.cross_core_flag_latency_cycles);
}

TEST(Coarse, RainFusionBreakdownAddsUpToTheTime) {
  const HwParams hw;
  for (const double sparsity : {0.5, 0.8, 0.9}) {
    FaConfig config = wan_like(sparsity);
    config.mode = SimMode::coarse;
    FaPlan plan;
    const Program program = build_fa_program(config, hw, &plan);
    const double time_us = simulate(program, hw).makespan / cycles_per_us(hw);
    const FaBreakdown breakdown = rainfusion_breakdown(config, hw, plan, time_us);
    EXPECT_DOUBLE_EQ(breakdown.ideal_speedup, 1 / (1 - sparsity));
    double total = 0;
    for (const auto& [name, us] : breakdown.parts) {
      EXPECT_GE(us, 0) << name;
      total += us;
    }
    EXPECT_NEAR(total, time_us, 1e-9 * time_us) << sparsity;
    // The dense text rows and columns and the first frame are a real share of a sparse layer.
    EXPECT_GT(breakdown.parts[2].second, 0.05 * time_us) << breakdown.parts[2].first;
  }
}

}  // namespace
}  // namespace ditops::sim
