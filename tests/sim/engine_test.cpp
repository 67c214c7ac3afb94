// Analytic cases of the event engine: each expectation is computed by hand from the formulas
// in sim/engine.hpp, so a change in the timing rules shows up as a failure here.

#include "sim/engine.hpp"

#include <gtest/gtest.h>

#include <string>

#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "sim/program.hpp"

namespace ditops::sim {
namespace {

Instr compute(int core, int unit, Pipe pipe, double cycles) {
  Instr instr;
  instr.op = Op::compute;
  instr.core = core;
  instr.unit = static_cast<std::uint8_t>(unit);
  instr.pipe = pipe;
  instr.cycles = cycles;
  return instr;
}

Instr read(int core, int unit, double bytes, double port, double head, double latency,
           MemLevel level = MemLevel::hbm) {
  Instr instr;
  instr.op = Op::gm_read;
  instr.core = core;
  instr.unit = static_cast<std::uint8_t>(unit);
  instr.pipe = Pipe::mte2;
  instr.bytes = bytes;
  instr.port_rate = port;
  instr.cycles = head;
  instr.latency = latency;
  instr.level = level;
  instr.ideal_cycles = head + bytes / port;
  return instr;
}

Instr set_cross(int core, int unit, Pipe pipe, int flag, int mode) {
  Instr instr;
  instr.op = Op::set_cross;
  instr.core = core;
  instr.unit = static_cast<std::uint8_t>(unit);
  instr.pipe = pipe;
  instr.flag = static_cast<std::uint8_t>(flag);
  instr.mode = static_cast<std::uint8_t>(mode);
  return instr;
}

Instr wait_cross(int core, int unit, Pipe pipe, int flag) {
  Instr instr;
  instr.op = Op::wait_cross;
  instr.core = core;
  instr.unit = static_cast<std::uint8_t>(unit);
  instr.pipe = pipe;
  instr.flag = static_cast<std::uint8_t>(flag);
  return instr;
}

Instr event(Op op, int core, int unit, Pipe pipe, Pipe peer, int id) {
  Instr instr;
  instr.op = op;
  instr.core = core;
  instr.unit = static_cast<std::uint8_t>(unit);
  instr.pipe = pipe;
  instr.peer_pipe = peer;
  instr.flag = static_cast<std::uint8_t>(id);
  return instr;
}

HwParams quiet_hw() {
  HwParams hw;
  hw.cross_core_flag_latency_cycles = 250;
  hw.intra_core_event_latency_cycles = 10;
  return hw;
}

/// The message of the SimError `program` stops with ("" and a failure if it runs to the end).
std::string error_of(const Program& program, const HwParams& hw) {
  try {
    simulate(program, hw);
  } catch (const SimError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a SimError";
  return "";
}

TEST(Engine, OneComputeTakesItsCycles) {
  Program program(1);
  program.add(compute(0, 0, Pipe::m, 1234));
  const SimResult result = simulate(program, quiet_hw());
  EXPECT_DOUBLE_EQ(result.makespan, 1234);
  EXPECT_DOUBLE_EQ(result.pipes[local_pipe_index(0, Pipe::m)].busy, 1234);
  EXPECT_EQ(result.instructions, 1u);
}

TEST(Engine, OneTransferTakesHeadPlusBytesOverPortPlusLatency) {
  Program program(1);
  program.add(read(0, 0, 64000, 64, 100, 600));
  const SimResult result = simulate(program, quiet_hw());
  EXPECT_DOUBLE_EQ(result.makespan, 100 + 64000.0 / 64 + 600);
  // The pipe is busy while the bytes move; the latency is in flight, not on the pipe.
  EXPECT_DOUBLE_EQ(result.pipes[0].busy, 100 + 64000.0 / 64);
  EXPECT_DOUBLE_EQ(result.hbm_bytes, 64000);
}

TEST(Engine, IndependentPipesOverlap) {
  Program program(1);
  program.add(compute(0, 0, Pipe::m, 500));
  program.add(compute(0, 0, Pipe::mte1, 300));
  program.add(compute(0, 1, Pipe::v, 700));
  program.add(compute(0, 2, Pipe::v, 200));
  program.add(read(0, 0, 6400, 64, 0, 0));
  EXPECT_DOUBLE_EQ(simulate(program, quiet_hw()).makespan, 700);
}

TEST(Engine, OnePipeSerializes) {
  Program program(1);
  program.add(compute(0, 1, Pipe::v, 500));
  program.add(compute(0, 1, Pipe::v, 300));
  EXPECT_DOUBLE_EQ(simulate(program, quiet_hw()).makespan, 800);
}

TEST(Engine, TransfersOnOnePipeOverlapTheirLatency) {
  Program program(1);
  program.add(read(0, 0, 6400, 64, 0, 600));
  program.add(read(0, 0, 6400, 64, 0, 600));
  // Second copy starts when the first one's bytes have left the port.
  EXPECT_DOUBLE_EQ(simulate(program, quiet_hw()).makespan, 100 + 100 + 600);
}

// AIC and both AIVs bounce two mode-2 flags `round_trips` times: each hop is one flag latency.
Program ping_pong(int round_trips, double work) {
  Program program(1);
  for (int trip = 0; trip < round_trips; ++trip) {
    if (work > 0) program.add(compute(0, 0, Pipe::fix, work));
    program.add(set_cross(0, 0, Pipe::fix, 0, 2));
    program.add(wait_cross(0, 0, Pipe::fix, 1));
    for (int unit = 1; unit <= 2; ++unit) {
      program.add(wait_cross(0, unit, Pipe::mte3, 0));
      program.add(set_cross(0, unit, Pipe::mte3, 1, 2));
    }
  }
  return program;
}

TEST(Engine, ChainOfFlagWaitsAddsLatencyEachTime) {
  HwParams hw = quiet_hw();
  for (const int trips : {1, 2, 5}) {
    for (const double latency : {100.0, 250.0, 1000.0}) {
      hw.cross_core_flag_latency_cycles = latency;
      EXPECT_DOUBLE_EQ(simulate(ping_pong(trips, 0), hw).makespan, 2 * trips * latency)
          << trips << " trips, latency " << latency;
      EXPECT_DOUBLE_EQ(simulate(ping_pong(trips, 40), hw).makespan, trips * (2 * latency + 40));
    }
  }
}

TEST(Engine, IntraCoreEventChainAddsEventLatency) {
  Program program(1);
  // MTE2 -> MTE1 -> M -> FIX, each hand-off one event.
  program.add(event(Op::set_event, 0, 0, Pipe::mte2, Pipe::mte1, 0));
  program.add(event(Op::wait_event, 0, 0, Pipe::mte1, Pipe::mte2, 0));
  program.add(event(Op::set_event, 0, 0, Pipe::mte1, Pipe::m, 0));
  program.add(event(Op::wait_event, 0, 0, Pipe::m, Pipe::mte1, 0));
  program.add(event(Op::set_event, 0, 0, Pipe::m, Pipe::fix, 0));
  program.add(event(Op::wait_event, 0, 0, Pipe::fix, Pipe::m, 0));
  program.add(compute(0, 0, Pipe::fix, 5));
  EXPECT_DOUBLE_EQ(simulate(program, quiet_hw()).makespan, 3 * 10 + 5);
}

TEST(Engine, SetTakesEffectWhenEarlierWorkRetired) {
  Program program(1);
  program.add(read(0, 1, 6400, 64, 0, 300, MemLevel::l2));
  program.add(event(Op::set_event, 0, 1, Pipe::mte2, Pipe::v, 1));
  program.add(event(Op::wait_event, 0, 1, Pipe::v, Pipe::mte2, 1));
  program.add(compute(0, 1, Pipe::v, 50));
  EXPECT_DOUBLE_EQ(simulate(program, quiet_hw()).makespan, 100 + 300 + 10 + 50);
}

double hbm_read_time(int cores, double hbm_bandwidth) {
  HwParams hw = quiet_hw();
  hw.hbm_bandwidth_bytes_per_cycle = hbm_bandwidth;
  Program program(cores);
  for (int core = 0; core < cores; ++core) program.add(read(core, 0, 1 << 20, 64, 0, 0));
  return simulate(program, hw).makespan;
}

TEST(Engine, CoresReadingHbmTogetherShareItsBandwidth) {
  const double one = hbm_read_time(1, 64);
  EXPECT_DOUBLE_EQ(one, (1 << 20) / 64.0);
  // HBM as fast as one port: N readers take N times as long.
  for (const int cores : {2, 3, 8, 24}) EXPECT_NEAR(hbm_read_time(cores, 64), cores * one, 1e-6);
  // HBM as fast as four ports: no slowdown up to 4 readers, then linear.
  EXPECT_NEAR(hbm_read_time(4, 256), one, 1e-6);
  EXPECT_NEAR(hbm_read_time(8, 256), 2 * one, 1e-6);
  EXPECT_NEAR(hbm_read_time(24, 256), 6 * one, 1e-6);
}

TEST(Engine, UnequalPortsGetMaxMinFairShares) {
  HwParams hw = quiet_hw();
  hw.l2_bandwidth_bytes_per_cycle = 100;
  Program program(2);
  program.add(read(0, 1, 3000, 30, 0, 0, MemLevel::l2));   // capped at 30 B/cycle
  program.add(read(1, 1, 7000, 110, 0, 0, MemLevel::l2));  // gets the other 70
  EXPECT_NEAR(simulate(program, hw).makespan, 100, 1e-9);
}

TEST(Engine, Mode2AicWaitNeedsBothAivs) {
  Program program(1);
  program.add(set_cross(0, 1, Pipe::mte3, 3, 2));
  program.add(compute(0, 2, Pipe::mte3, 400));
  program.add(set_cross(0, 2, Pipe::mte3, 3, 2));
  program.add(wait_cross(0, 0, Pipe::mte2, 3));
  program.add(compute(0, 0, Pipe::mte2, 1));
  EXPECT_DOUBLE_EQ(simulate(program, quiet_hw()).makespan, 400 + 250 + 1);
}

TEST(Engine, Mode1SynchronizesTheTwoAivs) {
  Program program(1);
  program.add(set_cross(0, 1, Pipe::v, 5, 1));
  program.add(wait_cross(0, 1, Pipe::v, 5));
  program.add(compute(0, 1, Pipe::v, 1));
  program.add(compute(0, 2, Pipe::v, 300));
  program.add(set_cross(0, 2, Pipe::v, 5, 1));
  program.add(wait_cross(0, 2, Pipe::v, 5));
  EXPECT_DOUBLE_EQ(simulate(program, quiet_hw()).makespan, 300 + 250 + 1);
}

TEST(Engine, Mode0IsABarrierOverAllAivs) {
  Program program(3);
  for (int core = 0; core < 3; ++core) {
    for (int unit = 1; unit <= 2; ++unit) {
      if (core == 2 && unit == 2) program.add(compute(core, unit, Pipe::mte3, 700));
      program.add(set_cross(core, unit, Pipe::mte3, 4, 0));
      program.add(wait_cross(core, unit, Pipe::mte2, 4));
      program.add(compute(core, unit, Pipe::mte2, 1));
    }
  }
  const SimResult result = simulate(program, quiet_hw());
  EXPECT_DOUBLE_EQ(result.makespan, 700 + 250 + 1);
  // Every AIV's MTE2 was blocked until the last one arrived.
  EXPECT_DOUBLE_EQ(result.pipes[local_pipe_index(1, Pipe::mte2)].blocked, 950);
}

TEST(Engine, BusyPlusBlockedPlusTailIsMakespan) {
  const SimResult result = simulate(ping_pong(3, 40), quiet_hw());
  for (const PipeStats& pipe : result.pipes) {
    EXPECT_NEAR(pipe.busy + pipe.blocked + pipe.tail, result.makespan, 1e-9);
  }
}

TEST(Engine, DeadlockNamesCorePipeAndFlag) {
  Program program(2);
  program.cross_flag_names = {"A", "B", "SOFTMAX_READY"};
  program.cross_flag_names.resize(11);
  program.add(compute(1, 0, Pipe::m, 10));
  program.add(wait_cross(1, 0, Pipe::mte2, 2));
  const std::string message = error_of(program, quiet_hw());
  EXPECT_NE(message.find("deadlock"), std::string::npos) << message;
  EXPECT_NE(message.find("core 1 AIC pipe MTE2"), std::string::npos) << message;
  EXPECT_NE(message.find("SOFTMAX_READY"), std::string::npos) << message;
}

TEST(Engine, DeadlockOnAnIntraCoreEvent) {
  Program program(1);
  program.add(event(Op::wait_event, 0, 2, Pipe::v, Pipe::mte2, 3));
  const std::string message = error_of(program, quiet_hw());
  EXPECT_NE(message.find("core 0 AIV1 pipe V"), std::string::npos) << message;
  EXPECT_NE(message.find("event MTE2->V id 3"), std::string::npos) << message;
}

TEST(Engine, BufferOverflowNamesBufferCoreAndInstruction) {
  Program program(2);
  Instr first = read(1, 0, 1024, 64, 0, 0);
  first.alloc_buffer = Buffer::l1;
  first.alloc_bytes = 300 * 1024;
  Instr second = first;
  second.label = program.intern_label("load K tile");
  program.add(first);
  program.add(second);
  const std::string message = error_of(program, quiet_hw());
  EXPECT_NE(message.find("L1 overflow on core 1 AIC"), std::string::npos) << message;
  EXPECT_NE(message.find("load K tile"), std::string::npos) << message;
  // Freeing in between makes it fit, and the peak is recorded.
  Program fits(1);
  first.core = second.core = 0;
  first.free_buffer = Buffer::l1;
  first.free_bytes = first.alloc_bytes;
  fits.add(first);
  fits.add(second);
  const SimResult result = simulate(fits, quiet_hw());
  EXPECT_DOUBLE_EQ(result.buffer_peak[static_cast<std::size_t>(Buffer::l1)], 300 * 1024);
}

TEST(Engine, UbOverflowOnAnAiv) {
  Program program(1);
  Instr big = compute(0, 2, Pipe::v, 1);
  big.alloc_buffer = Buffer::ub;
  big.alloc_bytes = 193 * 1024;
  big.label = program.intern_label("softmax");
  program.add(big);
  const std::string message = error_of(program, quiet_hw());
  EXPECT_NE(message.find("UB overflow on core 0 AIV1"), std::string::npos) << message;
}

TEST(Engine, MoreThanSixteenPendingSetsIsAnError) {
  Program program(1);
  for (int i = 0; i < 17; ++i) program.add(set_cross(0, 0, Pipe::fix, 0, 2));
  EXPECT_THROW(simulate(program, quiet_hw()), SimError);
  Program sixteen(1);
  for (int i = 0; i < 16; ++i) sixteen.add(set_cross(0, 0, Pipe::fix, 0, 2));
  EXPECT_NO_THROW(simulate(sixteen, quiet_hw()));
}

TEST(Engine, MalformedProgramsAreRejected) {
  Program bad_event(1);
  bad_event.add(event(Op::set_event, 0, 0, Pipe::mte2, Pipe::mte1, 8));
  EXPECT_THROW(simulate(bad_event, quiet_hw()), SimError);
  Program bad_flag(1);
  bad_flag.add(set_cross(0, 0, Pipe::fix, 11, 2));
  EXPECT_THROW(simulate(bad_flag, quiet_hw()), SimError);
  Program wrong_pipe(1);
  EXPECT_THROW(wrong_pipe.add(compute(0, 1, Pipe::m, 1)), SimError);  // an AIV has no cube
  Program wrong_buffer(1);
  Instr ub_on_aic = compute(0, 0, Pipe::m, 1);
  ub_on_aic.alloc_buffer = Buffer::ub;
  ub_on_aic.alloc_bytes = 1;
  wrong_buffer.add(ub_on_aic);
  EXPECT_THROW(simulate(wrong_buffer, quiet_hw()), SimError);
}

// Late in a long run, unequal shares leave a transfer a remainder (after the rounding of
// remaining -= rate * elapsed) whose time is below the clock's resolution: now_ + t == now_. It
// must complete instead of rescheduling itself at the same time forever (ctest's TIMEOUT turns a
// regression into a failure rather than a hang).
TEST(Engine, RemainderBelowTheClockResolutionCompletes) {
  constexpr double kLate = 3e13, kBytes = 1234567;
  Program program(1);
  program.add(compute(0, 1, Pipe::mte2, kLate));
  program.add(read(0, 1, kBytes, 64, 0, 0));
  program.add(read(0, 2, kBytes, 44.8, 0, 0));
  program.add(compute(0, 0, Pipe::mte2, kLate * 1.0000001));
  program.add(read(0, 0, kBytes * 1.3, 64, 0, 0));
  const SimResult result = simulate(program, HwParams{});
  EXPECT_NEAR(result.makespan, kLate * 1.0000001 + kBytes * 1.3 / 64, 1.0);
}

TEST(Engine, RunsPastTheTimeLimitStopWithAnErrorNamingTheInstruction) {
  Program program(1);
  program.add(compute(0, 2, Pipe::v, kMaxCycles * 2));
  const std::string message = error_of(program, quiet_hw());
  EXPECT_NE(message.find("simulated time passed 1e+15 cycles"), std::string::npos) << message;
  EXPECT_NE(message.find("core 0 AIV1.V instruction #0"), std::string::npos) << message;
}

TEST(Engine, RecordsLinkWaitsToTheirSets) {
  EngineOptions options;
  options.record_instructions = true;
  const Program program = ping_pong(2, 10);
  const SimResult result = simulate(program, quiet_hw(), options);
  std::size_t waits = 0;
  for (std::uint32_t i = 0; i < program.instrs.size(); ++i) {
    if (program.instrs[i].op != Op::wait_cross) continue;
    ++waits;
    const std::uint32_t source = result.records[i].source;
    ASSERT_NE(source, kNoInstr);
    EXPECT_EQ(program.instrs[source].op, Op::set_cross);
    EXPECT_GE(result.records[i].end, result.records[source].end + 250 - 1e-9);
  }
  EXPECT_EQ(waits, 6u);
  EXPECT_EQ(result.cross_flows.size(), waits);
}

}  // namespace
}  // namespace ditops::sim
