#pragma once
// Event-driven execution of a Program on the hardware model.
//
// Time is in cycles (double: shared-bandwidth transfers finish at fractional times). Each pipe
// runs its queue in order; an instruction starts when its predecessor has released the pipe.
// A transfer releases its pipe once its bytes have left the port and retires `latency` later
// (DMA engines keep several copies in flight). Waits block the pipe until their counter is
// positive; a set takes effect once the pipe's earlier work has retired and becomes visible
// after the event or flag latency; it does not hold the pipe. GM transfers pay a fixed head
// (small-copy head, ND->NZ conversion) and then move their bytes at min(port rate, max-min fair
// share of the L2 or HBM bandwidth among the transfers active at that moment), so cores reading HBM
// together slow each other down.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/hw.hpp"
#include "sim/program.hpp"

namespace ditops::sim {

inline constexpr std::uint32_t kNoInstr = 0xffffffffu;

/// Simulated time past which a run stops with an error (~6 days at 1.8 GHz): every parameter in
/// range gives programs far shorter, and doubles still resolve a fraction of a cycle there.
inline constexpr double kMaxCycles = 1e15;

/// What happened to one instruction (only when EngineOptions::record_instructions).
struct InstrRecord {
  double start = -1;    // issue time (for a wait: when the pipe reached it)
  double end = -1;      // retirement: transfer data landed, compute done, wait released, set
                        // effective (after the pipe's earlier work retired)
  double release = -1;  // when the pipe could start its next instruction
  double ready = 0;     // waits: when the consumed set became visible
  std::uint32_t source = kNoInstr;  // waits: the set instruction whose increment was consumed
};

struct PipeStats {
  double busy = 0;        // cycles occupied by compute and transfer instructions
  double blocked = 0;     // cycles blocked on waits
  double tail = 0;        // cycles after the pipe's last instruction until the makespan
  double contention = 0;  // part of `busy` lost to shared-bandwidth contention
  std::uint64_t instructions = 0;
  std::vector<std::pair<std::uint32_t, double>> blocked_by_label;  // wait label -> cycles
};

struct SimResult {
  double makespan = 0;  // cycles
  std::uint64_t instructions = 0;
  std::vector<PipeStats> pipes;     // per global pipe (core * kPipesPerCore + local)
  std::vector<double> buffer_peak;  // per (core * kUnitsPerCore + unit) * kNumBuffers + buffer
  double hbm_bytes = 0;
  double l2_bytes = 0;
  std::vector<InstrRecord> records;  // per instruction, when recorded
  std::vector<std::pair<std::uint32_t, std::uint32_t>> cross_flows;  // (set, wait) pairs
};

struct EngineOptions {
  bool record_instructions = false;
};

/// Runs `program`. Throws SimError on buffer overflow (naming buffer, core and instruction),
/// deadlock (naming core, pipe and flag), too many pending flag sets, a malformed program, or a
/// run that passes kMaxCycles or stops making progress (naming the instruction).
SimResult simulate(const Program& program, const HwParams& hw, const EngineOptions& options = {});

/// Capacity in bytes of `buffer` under `hw`.
double buffer_capacity(const HwParams& hw, Buffer buffer);

}  // namespace ditops::sim
