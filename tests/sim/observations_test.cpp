// The int8 MLA decode observations from real runs (sim/README.md, "Observations from real runs")
// checked on the default hardware parameters. The model is deterministic, so the orderings are
// exact; a parameter or kernel change that breaks one fails here. Where the model reproduces an
// observation only in part, the test pins the part it reproduces and says so.

#include <gtest/gtest.h>

#include <string>

#include "sim/engine.hpp"
#include "sim/hw.hpp"
#include "sim/mla.hpp"
#include "sim/report.hpp"

namespace ditops::sim {
namespace {

struct Simulated {
  double time_us = 0;
  Summary summary;
};

Simulated run(int batch, int kv, int chunk, const std::string& opts) {
  const HwParams hw;
  MlaConfig config;
  config.batch = batch;
  config.kv = kv;
  config.chunk = chunk;
  config.opts = parse_mla_opts(opts);
  const Program program = build_mla_program(config, hw);
  Simulated result;
  result.summary = summarize(program, simulate(program, hw), hw);
  result.time_us = result.summary.time_us;
  return result;
}

/// Share of the makespan the AIC's MTE2 spent blocked on `wait` (0 if it never waited on it).
double aic_wait(const Simulated& run, const std::string& wait) {
  for (const PipeSummary& pipe : run.summary.pipes) {
    if (pipe.name != "AIC.MTE2") continue;
    for (const auto& [name, share] : pipe.waits) {
      if (name == wait) return share;
    }
  }
  return 0;
}

// 1. Chunk 1: SM is long and the last PVs wait for it, a large bubble at the end. The PVs issued
// after a task's last QK wait on SOFTMAX_READY ("drain") for a larger share of the run than all
// the mid-pipeline hand-offs together, and chunk 4 shortens that drain.
TEST(Observations, ChunkOneEndsWithALargeBubbleWhereTheLastPvsWaitForSm) {
  const Simulated chunk1 = run(1, 2048, 1, "none");
  const double drain = aic_wait(chunk1, "SOFTMAX_READY (drain)");
  EXPECT_GT(drain, 0.10);
  EXPECT_GT(drain, 2 * aic_wait(chunk1, "SOFTMAX_READY"));
  EXPECT_LT(aic_wait(run(1, 2048, 4, "none"), "SOFTMAX_READY (drain)"), drain);
}

// 2. Chunk 2 beats chunk 1 at batch 1, by more at kv 2048 than at 4096. Both kv split into tasks
// of 4 blocks (4 and 8 splits), so the per-core saving is the same; the chunk-independent
// combine pass over 8 partial outputs dilutes it more at kv 4096. The margin is small (README).
TEST(Observations, ChunkTwoGainsMoreAtKv2048ThanAt4096) {
  const double ratio_2048 = run(1, 2048, 2, "none").time_us / run(1, 2048, 1, "none").time_us;
  const double ratio_4096 = run(1, 4096, 2, "none").time_us / run(1, 4096, 1, "none").time_us;
  EXPECT_LT(ratio_2048, 1.0);
  EXPECT_LT(ratio_4096, 1.0);
  EXPECT_LT(ratio_2048, ratio_4096);
}

// 3. Chunk 4 with cube_reorder: the cube never waits for the vector side. Where a task has two
// chunk-4 groups (batch 8, kv 2048: 3 splits of 5-6 blocks; batch 4, kv 4096: 6 splits) the AIC
// is never blocked on SOFTMAX_READY, against 40 % of the run without the switch.
TEST(Observations, ChunkFourWithCubeReorderLeavesNoCubeBubble) {
  for (const auto& [batch, kv] : {std::pair{8, 2048}, std::pair{4, 4096}}) {
    SCOPED_TRACE("batch " + std::to_string(batch) + " kv " + std::to_string(kv));
    const Simulated plain = run(batch, kv, 4, "none");
    const Simulated reordered = run(batch, kv, 4, "cube_reorder");
    EXPECT_GT(aic_wait(plain, "SOFTMAX_READY") + aic_wait(plain, "SOFTMAX_READY (drain)"), 0.3);
    EXPECT_EQ(aic_wait(reordered, "SOFTMAX_READY"), 0.0);
    EXPECT_EQ(aic_wait(reordered, "SOFTMAX_READY (drain)"), 0.0);
    EXPECT_LT(reordered.time_us, plain.time_us);
  }
}

// 4. --opt all on chunk 4 is faster than chunk 4 alone for every batch 1-48 and kv 512 / 2048 /
// 4096, and gains least at kv 512 (one chunk-4 group per task: nothing for the reorder and the
// ping-pong to overlap). "Largest at kv 2048" holds at batch 8 only (README).
TEST(Observations, AllOptimizationsAreFasterEverywhereAndGainLeastAtKv512) {
  for (const int batch : {1, 2, 4, 8, 16, 24, 48}) {
    double gain[3] = {};
    const int kvs[3] = {512, 2048, 4096};
    for (int i = 0; i < 3; ++i) {
      const double plain = run(batch, kvs[i], 4, "none").time_us;
      const double all = run(batch, kvs[i], 4, "all").time_us;
      gain[i] = 1 - all / plain;
      EXPECT_GT(gain[i], 0.0) << "batch " << batch << " kv " << kvs[i];
    }
    EXPECT_LT(gain[0], gain[1]) << "batch " << batch;
    EXPECT_LT(gain[0], gain[2]) << "batch " << batch;
    if (batch == 8) {
      EXPECT_GT(gain[1], gain[2]);
    }
  }
}

}  // namespace
}  // namespace ditops::sim
