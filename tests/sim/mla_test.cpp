// Invariants on every generated MLA program, the ping-pong slot timing, determinism, the task
// split, capacity errors and the effect of each --opt switch.

#include "sim/mla.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "sim/engine.hpp"
#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "sim/program.hpp"
#include "sim/report.hpp"
#include "tests/sim/invariants.hpp"

namespace ditops::sim {
namespace {

struct Case {
  int batch, kv, chunk, cores;
  const char* opts;
};

std::string name_of(const Case& c) {
  std::string opts = c.opts;
  std::replace(opts.begin(), opts.end(), ',', '_');
  return "b" + std::to_string(c.batch) + "_kv" + std::to_string(c.kv) + "_c" +
         std::to_string(c.chunk) + "_cores" + std::to_string(c.cores) + "_" + opts;
}

MlaConfig config_of(const Case& c) {
  MlaConfig config;
  config.batch = c.batch;
  config.kv = c.kv;
  config.chunk = c.chunk;
  config.cores = c.cores;
  config.opts = parse_mla_opts(c.opts);
  return config;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (const int chunk : {1, 2, 4}) {
    for (const char* opts : {"none", "all", "nope_rope_split", "up_pingpong", "sm_head_group",
                             "unit_flag", "sync_reduce", "cube_reorder"}) {
      all.push_back({1, 2048, chunk, 24, opts});
    }
    all.push_back({3, 1000, chunk, 4, "none"});  // partial blocks, several tasks per core
    all.push_back({2, 777, chunk, 24, "all"});
    all.push_back({1, 100, chunk, 2, "tail_reduce"});  // one partial block
  }
  return all;
}

class MlaInvariants : public ::testing::TestWithParam<Case> {};

TEST_P(MlaInvariants, Hold) {
  const HwParams hw;
  const Program program = build_mla_program(config_of(GetParam()), hw);
  EngineOptions options;
  options.record_instructions = true;
  testing::expect_invariants(program, simulate(program, hw, options), hw);
}

TEST_P(MlaInvariants, IdenticalInputsGiveIdenticalResults) {
  const HwParams hw;
  const MlaConfig config = config_of(GetParam());
  testing::expect_deterministic([&] { return build_mla_program(config, hw); }, hw);
}

INSTANTIATE_TEST_SUITE_P(Programs, MlaInvariants, ::testing::ValuesIn(cases()),
                         [](const auto& test_info) { return name_of(test_info.param); });

// Simulated timing of the GM ping-pong slots in a single long task: the producer of block b
// writes the slot that block b - 2*chunk used, so its first write must start after the last
// read of that block's data (S by SM, P by PV, O_tmp by UP) has landed.
class SlotTiming : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(SlotTiming, ProducerWaitsForConsumer) {
  const HwParams hw;
  MlaConfig config;
  config.batch = 1;
  config.kv = 24 * 128;
  config.cores = 1;
  config.chunk = std::get<0>(GetParam());
  config.opts = parse_mla_opts(std::get<1>(GetParam()));
  MlaPlan plan;
  const Program program = build_mla_program(config, hw, &plan);
  ASSERT_EQ(plan.tasks.size(), 1u);
  EngineOptions options;
  options.record_instructions = true;
  const SimResult result = simulate(program, hw, options);
  // (first write start, last read end) per (label, block)
  std::map<std::pair<std::string, int>, std::pair<double, double>> spans;
  for (std::uint32_t i = 0; i < program.instrs.size(); ++i) {
    const PackedInstr& instr = program.instrs[i];
    if (instr.op != Op::gm_read && instr.op != Op::gm_write) continue;
    auto [it, inserted] = spans.try_emplace({program.labels[instr.label], instr.block},
                                            result.records[i].start, result.records[i].end);
    if (!inserted) {
      it->second.first = std::min(it->second.first, result.records[i].start);
      it->second.second = std::max(it->second.second, result.records[i].end);
    }
  }
  const auto first_write = [&](const std::string& label, int block) {
    return spans.at({label, block}).first;
  };
  const auto last_read = [&](const std::string& label, int block) {
    return spans.at({label, block}).second;
  };
  const int distance = 2 * config.chunk;
  int checked = 0;
  for (int b = distance; b < 24; ++b) {
    const int prev = b - distance;
    EXPECT_GE(first_write("QK nope FIX L0C->GM", b),
              std::max(last_read("SM load S_nope (L2->UB)", prev),
                       last_read("SM load S_rope (L2->UB)", prev)));
    EXPECT_GE(first_write("SM store P (UB->L2)", b), last_read("PV load P (L2->L1)", prev));
    EXPECT_GE(first_write("PV PV FIX L0C->GM", b), last_read("UP load O_tmp (L2->UB)", prev));
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Chunks, SlotTiming,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values("none", "all", "sync_reduce",
                                                              "cube_reorder")));

TEST(MlaPlan, SplitsSmallBatchesAndBalancesCost) {
  const HwParams hw;
  MlaConfig config;
  config.batch = 1;
  config.kv = 2048;  // 16 blocks: at most 4 splits of >= 4 blocks
  MlaPlan plan = plan_mla(config, hw);
  EXPECT_EQ(plan.splits, 4);
  EXPECT_TRUE(plan.combine);
  EXPECT_EQ(plan.cores_used, 4);
  int blocks = 0;
  for (const MlaTask& task : plan.tasks) {
    EXPECT_EQ(task.num_blocks, 4);
    blocks += task.num_blocks;
  }
  EXPECT_EQ(blocks, 16);

  config.batch = 48;  // enough tasks: no split, two tasks per core
  plan = plan_mla(config, hw);
  EXPECT_EQ(plan.splits, 1);
  EXPECT_FALSE(plan.combine);
  std::vector<int> per_core(24, 0);
  for (const MlaTask& task : plan.tasks) ++per_core[static_cast<std::size_t>(task.core)];
  for (const int count : per_core) EXPECT_EQ(count, 2);

  config.batch = 1;
  config.q_len = 2;  // 256 rows: two head groups of 64 heads
  plan = plan_mla(config, hw);
  EXPECT_EQ(plan.head_groups, 2);
  EXPECT_EQ(plan.heads_per_group, 64);
}

TEST(MlaPlan, LongestTasksGoToLeastLoadedCores) {
  const HwParams hw;
  MlaConfig config;
  config.batch = 5;
  config.kv = 1000;
  config.cores = 2;
  const MlaPlan plan = plan_mla(config, hw);
  double load[2] = {0, 0};
  for (const MlaTask& task : plan.tasks) load[task.core] += task.tokens;
  EXPECT_EQ(load[0], 3000);  // 5 equal tasks: 3 + 2
  EXPECT_EQ(load[1], 2000);
}

TEST(MlaBuilder, BufferOverflowIsReportedWithBufferCoreAndInstruction) {
  HwParams hw;
  hw.l1_bytes = 200 * 1024;  // chunk 4 keeps 5 K tiles of 80 KiB in L1
  MlaConfig config;
  config.chunk = 4;
  config.cores = 2;
  try {
    simulate(build_mla_program(config, hw), hw);
    FAIL() << "expected an L1 overflow";
  } catch (const SimError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("L1 overflow on core"), std::string::npos) << message;
    EXPECT_NE(message.find("AIC"), std::string::npos) << message;
    EXPECT_NE(message.find("instruction #"), std::string::npos) << message;
  }
  hw = HwParams{};
  hw.ub_bytes = 32 * 1024;
  EXPECT_THROW(simulate(build_mla_program(config, hw), hw), SimError);
}

TEST(MlaBuilder, RejectsBadConfigurations) {
  const HwParams hw;
  MlaConfig config;
  config.chunk = 3;
  EXPECT_THROW(build_mla_program(config, hw), SimError);
  config = MlaConfig{};
  config.batch = 0;
  EXPECT_THROW(build_mla_program(config, hw), SimError);
  config = MlaConfig{};
  config.cores = 25;  // more than the chip has
  EXPECT_THROW(build_mla_program(config, hw), SimError);
  config = MlaConfig{};
  config.block_size = 96;
  EXPECT_THROW(build_mla_program(config, hw), SimError);
  EXPECT_THROW(parse_mla_opts("unit_flag,warp_speed"), SimError);
}

TEST(MlaBuilder, EveryOptimizationSwitchChangesTheResult) {
  const HwParams hw;
  MlaConfig base;
  base.batch = 2;
  base.kv = 2000;  // a partial last block, for tail_reduce
  base.cores = 2;
  base.chunk = 4;
  const double baseline = simulate(build_mla_program(base, hw), hw).makespan;
  for (const MlaOptInfo& info : mla_opt_table()) {
    MlaConfig config = base;
    config.opts.*info.field = true;
    const double time = simulate(build_mla_program(config, hw), hw).makespan;
    EXPECT_NE(time, baseline) << info.name << " has no effect";
  }
  EXPECT_EQ(mla_opts_to_string(parse_mla_opts("all")).find("none"), std::string::npos);
  EXPECT_EQ(mla_opts_to_string(parse_mla_opts("none")), "none");
}

TEST(MlaBuilder, ChunksUseTheScheduleOrder) {
  // The AIC's M pipe runs the matmuls in the schedule's stage order.
  const HwParams hw;
  for (const auto& [chunk, expected] :
       std::vector<std::pair<int, std::string>>{{1, "QK0 QK1 PV0 QK2 PV1 QK3 PV2 PV3"},
                                                {2, "QK0 QK1 PV0 PV1 QK2 QK3 PV2 PV3"},
                                                {4, "QK0 QK1 QK2 QK3 PV0 PV1 PV2 PV3"}}) {
    MlaConfig config;
    config.kv = 4 * 128;
    config.cores = 1;
    config.chunk = chunk;
    const Program program = build_mla_program(config, hw);
    std::string order;
    std::string last;
    for (const std::uint32_t index : program.queues[local_pipe_index(0, Pipe::m)]) {
      const PackedInstr& instr = program.instrs[index];
      if (instr.op != Op::compute || instr.block < 0) continue;
      const std::string stage = instr.stage == StageTag::qk ? "QK" : "PV";
      const std::string item = stage + std::to_string(instr.block);
      if (item != last) order += (order.empty() ? "" : " ") + item;
      last = item;
    }
    EXPECT_EQ(order, expected) << "chunk " << chunk;
  }
}

}  // namespace
}  // namespace ditops::sim
