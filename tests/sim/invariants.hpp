#pragma once
// Invariants every simulated program must satisfy, shared by the MLA and flash-attention tests:
// per-pipe accounting (busy + blocked + tail = makespan, no overlap on a pipe), dependencies
// (waits after their sets plus latency, sets after earlier work retired), buffer capacities,
// report ratios, and bitwise determinism.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "sim/engine.hpp"
#include "sim/hw.hpp"
#include "sim/program.hpp"
#include "sim/report.hpp"

namespace ditops::sim::testing {

inline constexpr double kEps = 1e-6;  // cycles; times are sums of a few hundred doubles

/// Needs `result` simulated with EngineOptions::record_instructions.
inline void expect_invariants(const Program& program, const SimResult& result, const HwParams& hw) {
  ASSERT_GT(result.makespan, 0);
  // Per pipe: busy + blocked + tail = makespan, and instructions never overlap on a pipe.
  for (std::size_t pipe = 0; pipe < program.queues.size(); ++pipe) {
    const PipeStats& stats = result.pipes[pipe];
    EXPECT_NEAR(stats.busy + stats.blocked + stats.tail, result.makespan, kEps) << pipe;
    double free_at = 0;
    double busy = 0;
    for (const std::uint32_t index : program.queues[pipe]) {
      const InstrRecord& record = result.records[index];
      EXPECT_GE(record.start, free_at - kEps) << program.describe(index);
      EXPECT_GE(record.release, record.start - kEps);
      EXPECT_GE(record.end, record.release - kEps);
      EXPECT_LE(record.end, result.makespan + kEps);
      const Op op = program.instrs[index].op;
      if (op == Op::compute || op == Op::gm_read || op == Op::gm_write) {
        busy += record.release - record.start;
      }
      free_at = record.release;
    }
    EXPECT_NEAR(busy, stats.busy, kEps);
  }

  // No instruction starts before its dependencies: a wait ends after the set it consumed became
  // visible, and a set takes effect only after every earlier instruction of its pipe retired.
  for (std::size_t pipe = 0; pipe < program.queues.size(); ++pipe) {
    double retired = 0;
    for (const std::uint32_t index : program.queues[pipe]) {
      const PackedInstr& instr = program.instrs[index];
      const InstrRecord& record = result.records[index];
      if (instr.op == Op::set_event || instr.op == Op::set_cross) {
        EXPECT_GE(record.end, retired - kEps) << program.describe(index);
      }
      if (instr.op == Op::wait_event || instr.op == Op::wait_cross) {
        ASSERT_NE(record.source, kNoInstr) << program.describe(index);
        const PackedInstr& set = program.instrs[record.source];
        const double latency = instr.op == Op::wait_event ? hw.intra_core_event_latency_cycles
                                                          : hw.cross_core_flag_latency_cycles;
        EXPECT_EQ(set.op == Op::set_event, instr.op == Op::wait_event);
        EXPECT_EQ(set.flag, instr.flag);
        EXPECT_GE(record.end, result.records[record.source].end + latency - kEps)
            << program.describe(index) << " released before " << program.describe(record.source);
      }
      retired = std::max(retired, record.end);
    }
  }

  // Buffer occupancy never exceeds capacity.
  for (int core = 0; core < program.num_cores; ++core) {
    for (int unit = 0; unit < kUnitsPerCore; ++unit) {
      for (const Buffer buffer : {Buffer::l1, Buffer::l0a, Buffer::l0b, Buffer::l0c, Buffer::ub}) {
        const double peak =
            result
                .buffer_peak[(static_cast<std::size_t>(core) * kUnitsPerCore + unit) * kNumBuffers +
                             static_cast<std::size_t>(buffer)];
        EXPECT_LE(peak, buffer_capacity(hw, buffer)) << buffer_name(buffer) << " core " << core;
      }
    }
  }

  // The report's ratios are consistent with the same accounting.
  const Summary summary = summarize(program, result, hw);
  for (const PipeSummary& pipe : summary.pipes) {
    EXPECT_NEAR(pipe.busy + pipe.blocked + pipe.done, 1.0, 1e-9) << pipe.name;
  }
}

/// Two builds of the same input simulate to bitwise identical records.
inline void expect_deterministic(const std::function<Program()>& build, const HwParams& hw) {
  EngineOptions options;
  options.record_instructions = true;
  const Program first = build();
  const Program second = build();
  ASSERT_EQ(first.instrs.size(), second.instrs.size());
  const SimResult a = simulate(first, hw, options);
  const SimResult b = simulate(second, hw, options);
  EXPECT_EQ(a.makespan, b.makespan);  // bitwise: the engine breaks ties by creation order
  for (std::size_t i = 0; i < a.records.size(); ++i) {
    ASSERT_EQ(a.records[i].start, b.records[i].start) << i;
    ASSERT_EQ(a.records[i].end, b.records[i].end) << i;
  }
}

}  // namespace ditops::sim::testing
