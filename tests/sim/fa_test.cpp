// The flash-attention program: analytic one-block costs, S^2 growth of dense work, block-sparse
// work that follows the kept blocks (uniform and RainFusion masks, the latter checked against
// the CPU library's pattern plans pair by pair), chunk 1/2/4, the shared invariants, and bad
// or hostile configurations.

#include "sim/fa.hpp"

#include <gtest/gtest.h>

#include <ditops/sparse.hpp>
#include <string>
#include <vector>

#include "ops/sparse/layout.hpp"
#include "sim/engine.hpp"
#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "sim/report.hpp"
#include "tests/sim/invariants.hpp"

namespace ditops::sim {
namespace {

/// Busy cycles of every AIC M pipe (the cube's mmads).
double cube_cycles(const Program& program, const SimResult& result) {
  double cycles = 0;
  for (int core = 0; core < program.num_cores; ++core) {
    cycles += result
                  .pipes[static_cast<std::size_t>(core) * kPipesPerCore +
                         static_cast<std::size_t>(local_pipe_index(0, Pipe::m))]
                  .busy;
  }
  return cycles;
}

FaConfig small(int seq, int chunk = 2) {
  FaConfig config;
  config.heads = 2;
  config.seq = seq;
  config.cores = 4;
  config.chunk = chunk;
  return config;
}

// One 128-token block of a 128-row query tile: QK and PV are each 8 x 8 x 8 fractals of
// 16 x 16 x 16 at one per cycle (bf16), q, K and V each cross HBM once.
TEST(FaProgram, OneBlockOnOneCoreCostsItsFormula) {
  const HwParams hw;
  FaConfig config;
  config.heads = 1;
  config.seq = 128;
  config.cores = 1;
  const Program program = build_fa_program(config, hw);
  const SimResult result = simulate(program, hw);
  EXPECT_DOUBLE_EQ(cube_cycles(program, result), 2 * 512.0);
  EXPECT_DOUBLE_EQ(result.hbm_bytes, 3 * 128.0 * 128 * 2);
  // int8: k0 = 32, so half the cycles; one byte per element.
  config.int8 = true;
  const Program int8 = build_fa_program(config, hw);
  const SimResult int8_result = simulate(int8, hw);
  EXPECT_DOUBLE_EQ(cube_cycles(int8, int8_result), 512.0);
  EXPECT_DOUBLE_EQ(int8_result.hbm_bytes, 3 * 128.0 * 128);
}

TEST(FaProgram, DenseWorkGrowsWithTheSquareOfTheSequence) {
  const HwParams hw;
  double previous_time = 0;
  for (const int seq : {256, 512, 1024}) {
    FaConfig config = small(seq);
    config.cores = 1;  // the tasks run one after the other: time follows the work
    const Program program = build_fa_program(config, hw);
    const SimResult result = simulate(program, hw);
    const double blocks = seq / 128.0;
    EXPECT_DOUBLE_EQ(cube_cycles(program, result), 2 * blocks * blocks * 1024.0) << seq;
    if (previous_time > 0) {
      EXPECT_GT(result.makespan, 2 * previous_time) << seq;  // superlinear: fill shrinks
    }
    previous_time = result.makespan;
  }
}

TEST(FaProgram, UniformDensityKeepsItsShareOfBlocks) {
  const HwParams hw;
  FaConfig config = small(2048);
  config.density = 0.25;
  FaPlan plan;
  const Program program = build_fa_program(config, hw, &plan);
  const SimResult result = simulate(program, hw);
  EXPECT_DOUBLE_EQ(plan.kept_share, 0.25);
  // 2 heads x 16 query tiles x 4 kept blocks, 1024 cube cycles each.
  EXPECT_DOUBLE_EQ(cube_cycles(program, result), 2 * 16 * 4 * 1024.0);
  const Program dense = build_fa_program(small(2048), hw);
  EXPECT_LT(result.makespan, 0.5 * simulate(dense, hw).makespan);
}

// A layout of 512 tokens (128 text + 4 x 8 x 12 video): every block is full.
FaConfig rainfusion(const char* patterns) {
  FaConfig config = small(512);
  config.heads = 3;
  config.rainfusion = true;
  config.frames = 4;
  config.height = 8;
  config.width = 12;
  config.text = 128;
  config.sparsity = 0.75;
  config.patterns = parse_fa_patterns(patterns);
  return config;
}

TEST(FaProgram, RainFusionBlocksAreTheLibraryMasksBlocks) {
  const HwParams hw;
  const FaConfig config = rainfusion("spatial,temporal,textural");
  const FaPlan plan = plan_fa(config, hw);
  RainFusionOptions rf;
  rf.video = {config.frames, config.height, config.width, config.text, true};
  rf.sparsity = static_cast<float>(config.sparsity);
  const sparse::Layout layout = sparse::checked_layout("test", rf);
  const HeadPattern patterns[] = {HeadPattern::spatial, HeadPattern::temporal,
                                  HeadPattern::textural};
  ASSERT_EQ(plan.kept.size(), 3u);
  double kept_pairs = 0;
  for (int mask = 0; mask < 3; ++mask) {
    const sparse::PatternPlan library = sparse::plan_pattern(patterns[mask], layout);
    for (int q_tile = 0; q_tile < 4; ++q_tile) {
      std::vector<int> expected;
      for (int block = 0; block < 4; ++block) {
        bool any = false;
        for (int p = q_tile * 128; p < q_tile * 128 + 128 && !any; ++p) {
          for (int k = block * 128; k < block * 128 + 128 && !any; ++k) {
            any = library.attends(library.order[p], library.order[k]);
          }
        }
        if (any) expected.push_back(block);
      }
      EXPECT_EQ(plan.kept[mask][q_tile], expected) << plan.mask_names[mask] << " q tile " << q_tile;
      kept_pairs += static_cast<double>(expected.size());
    }
  }
  // Heads 0, 1, 2 run spatial, temporal, textural; the cube work follows the kept blocks.
  const Program program = build_fa_program(config, hw);
  EXPECT_DOUBLE_EQ(cube_cycles(program, simulate(program, hw)), kept_pairs * 1024.0);
  EXPECT_LT(kept_pairs, 3 * 16.0);  // sparse enough to skip blocks
}

// K and V cross HBM once per head while the heads in flight fit L2; the later query tiles of
// the head hit L2. Without room in L2 every query tile reads them from HBM.
TEST(FaProgram, LaterQueryTilesOfAHeadReadKAndVFromL2) {
  HwParams hw;
  FaConfig config = small(1024);  // 2 heads x 8 query tiles, 4 cores
  const double q_bytes = 2 * 1024.0 * 128 * 2;
  const double kv_once = 2 * 2 * 1024.0 * 128 * 2;  // K and V of both heads
  EXPECT_DOUBLE_EQ(simulate(build_fa_program(config, hw), hw).hbm_bytes, q_bytes + kv_once);
  config.seq = 8192;  // 64 query tiles; heads in flight 2, 4 MiB each
  hw.l2_bytes = 4 * 1024 * 1024;
  FaPlan plan = plan_fa(config, hw);
  EXPECT_FALSE(plan.kv_reuse);
  hw.l2_bytes = 8 * 1024 * 1024;
  EXPECT_TRUE(plan_fa(config, hw).kv_reuse);
  config.seq = 2048;      // 16 query tiles per head
  hw.l2_bytes = 1 << 20;  // 2 heads in flight x 1 MiB of K and V do not fit
  const double kv_per_tile = 2 * 2048.0 * 128 * 2;
  EXPECT_DOUBLE_EQ(simulate(build_fa_program(config, hw), hw).hbm_bytes,
                   2 * q_bytes + 2 * 16 * kv_per_tile);
}

class FaInvariants : public ::testing::TestWithParam<int> {};

TEST_P(FaInvariants, HoldForDenseSparseAndInt8) {
  const HwParams hw;
  const int chunk = GetParam();
  std::vector<FaConfig> configs = {small(640, chunk), rainfusion("spatial,textural")};
  configs[1].chunk = chunk;
  configs.push_back(small(300, chunk));  // partial query tile and KV block
  configs.back().int8 = true;
  configs.back().kv_seq = 1000;
  configs.back().opts = parse_mla_opts("all");
  for (const FaConfig& config : configs) {
    SCOPED_TRACE(describe(config));
    const Program program = build_fa_program(config, hw);
    EngineOptions options;
    options.record_instructions = true;
    testing::expect_invariants(program, simulate(program, hw, options), hw);
    testing::expect_deterministic([&] { return build_fa_program(config, hw); }, hw);
  }
}

INSTANTIATE_TEST_SUITE_P(Chunks, FaInvariants, ::testing::Values(1, 2, 4));

TEST(FaProgram, InstructionEstimateIsClose) {
  const HwParams hw;
  for (FaConfig config : {small(1024), rainfusion("spatial,temporal,textural")}) {
    const double built = static_cast<double>(build_fa_program(config, hw).instrs.size());
    const double estimate = static_cast<double>(estimate_fa_instructions(config, hw));
    EXPECT_NEAR(estimate, built, 0.1 * built) << describe(config);
  }
}

TEST(FaProgram, RejectsBadAndHostileConfigurations) {
  const HwParams hw;
  const auto rejects = [&](FaConfig config, const std::string& mentions) {
    try {
      plan_fa(config, hw);
      ADD_FAILURE() << "accepted: " << describe(config);
    } catch (const SimError& error) {
      EXPECT_NE(std::string(error.what()).find(mentions), std::string::npos) << error.what();
    }
  };
  FaConfig config = small(512);
  config.chunk = 3;
  rejects(config, "chunk");
  config = small(512);
  config.dim = 100;
  rejects(config, "dim");
  config = small(512);
  config.density = 0;
  rejects(config, "density");
  config = small(1 << 20);  // (2^13)^2 query tile x KV block pairs: more than the masks may hold
  rejects(config, "pairs");
  config = rainfusion("spatial");
  config.text = 0;  // no longer S tokens
  rejects(config, "seq");
  config = rainfusion("spatial");
  config.sparsity = 1;
  rejects(config, "sparsity");
  config = small(512);
  config.dim = 512;  // q, K, V and P of one block exceed L1
  rejects(config, "L1");
  EXPECT_THROW(parse_fa_patterns("spatial,diagonal"), SimError);
}

}  // namespace
}  // namespace ditops::sim
