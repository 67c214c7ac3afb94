#pragma once
// A simulator program: per AI core, one in-order instruction queue per pipe.
//
// Units of one AI core: the AIC (cube core, pipes MTE2 MTE1 M FIX; buffers L1 L0A L0B L0C) and
// two AIVs (vector cores, pipes MTE2 V MTE3; a UB each). An instruction occupies its pipe from
// start to end; pipes of a core run concurrently and only meet through events (intra-core
// SET_FLAG/WAIT_FLAG between two pipes of one unit) and cross-core flags (CrossCoreSetFlag /
// CrossCoreWaitFlag between units, modes 0/1/2).

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ditops::sim {

enum class Pipe : std::uint8_t { mte2, mte1, m, fix, v, mte3 };
inline constexpr int kNumPipeKinds = 6;

enum class UnitKind : std::uint8_t { aic, aiv };
inline constexpr int kUnitsPerCore = 3;   // unit 0 = AIC, 1 = AIV0, 2 = AIV1
inline constexpr int kPipesPerCore = 10;  // AIC: 4 pipes, each AIV: 3 pipes

enum class Buffer : std::uint8_t { none, l1, l0a, l0b, l0c, ub };
inline constexpr int kNumBuffers = 6;

enum class MemLevel : std::uint8_t { l2, hbm };

enum class Op : std::uint8_t {
  compute,     // `cycles` on the pipe (cube mmad, vector op, MTE1 load, FIX L0C read)
  gm_read,     // GM -> local: head `cycles`, then `bytes` through the unit port and `level`;
               // the pipe is free after that, the data lands `latency` later (DMA pipelining)
  gm_write,    // local -> GM: same, written into `level`
  set_event,   // intra-unit SET_FLAG(pipe -> peer_pipe, flag)
  wait_event,  // intra-unit WAIT_FLAG(peer_pipe -> pipe, flag)
  set_cross,   // CrossCoreSetFlag<mode, pipe>(flag)
  wait_cross,  // CrossCoreWaitFlag(flag)
  stage,       // coarse mode: one folded stage of a unit. Waits for its cross-core flag
               // (InstrCost::wait_flag, unless kNoFlag), then holds its pipe like a transfer
               // (head `cycles`, then `bytes` on `level` at up to `port_rate`), retires
               // `latency` later and then sets cross-core `flag` in `mode` (unless kNoFlag)
};

/// How a program models the kernel (sim/README.md, "Simulator scale"): every instruction, or one
/// folded event per (core, unit, stage) with the same flags and the same L2/HBM sharing.
enum class SimMode : std::uint8_t { fine, coarse };
const char* sim_mode_name(SimMode mode) noexcept;  // "fine", "coarse"

/// No cross-core flag: a coarse stage that waits for nothing or sets nothing.
inline constexpr std::uint8_t kNoFlag = 0xff;

/// Tag used by reports to color and group work: the pipeline stage an instruction belongs to.
enum class StageTag : std::uint8_t { setup, qk, sm, pv, up, combine, sync };
inline constexpr int kNumStageTags = 7;
const char* stage_tag_name(StageTag tag) noexcept;

/// One instruction as a builder writes it; Program::add stores it packed (PackedInstr +
/// InstrCost).
struct Instr {
  Op op = Op::compute;
  Pipe pipe = Pipe::mte2;
  std::uint8_t unit = 0;  // 0 AIC, 1 AIV0, 2 AIV1
  std::uint8_t flag = 0;  // event id or cross-core flag id
  std::uint8_t mode = 2;  // cross-core mode (0, 1, 2)
  Pipe peer_pipe = Pipe::mte2;
  MemLevel level = MemLevel::l2;
  StageTag stage = StageTag::setup;
  Buffer alloc_buffer = Buffer::none;  // reserved when the instruction starts
  Buffer free_buffer = Buffer::none;   // released when it ends
  std::int32_t core = 0;
  std::int32_t block = -1;  // KV block within the task, for labels
  std::uint32_t label = 0;  // index into Program::labels
  std::uint32_t alloc_bytes = 0;
  std::uint32_t free_bytes = 0;
  double cycles = 0;        // compute time, or the fixed head of a transfer (per-copy overhead)
  double latency = 0;       // transfer: from the last byte leaving the port to the data landing
  double bytes = 0;         // transfer size
  double port_rate = 0;     // B/cycle limit of this unit's port for a transfer
  double ideal_cycles = 0;  // head + bytes / port rate: the pipe time without contention
  // Op::stage only: the cross-core flag waited for before the stage, and the wait's label.
  std::uint8_t wait_flag = kNoFlag;
  std::uint32_t wait_label = 0;
};

/// The numbers of an instruction (Instr's fields of the same names). A program has millions of
/// instructions but few distinct costs (one per tile shape and stage), so each distinct cost is
/// stored once in Program::costs and instructions refer to it by index.
struct InstrCost {
  double cycles = 0;
  double latency = 0;
  double bytes = 0;
  double port_rate = 0;
  double ideal_cycles = 0;
  std::uint32_t alloc_bytes = 0;
  std::uint32_t free_bytes = 0;
  // Op::stage only (kept here, not per instruction: a stage's wait repeats across every tile).
  std::uint8_t wait_flag = kNoFlag;
  std::uint32_t wait_label = 0;
};

/// An instruction as a program stores it: Instr without its numbers, which are in
/// Program::costs[cost]. 24 bytes instead of 72: the Wan-sized programs hold tens of millions.
struct PackedInstr {
  Op op = Op::compute;
  Pipe pipe = Pipe::mte2;
  std::uint8_t unit = 0;
  std::uint8_t flag = 0;
  std::uint8_t mode = 2;
  Pipe peer_pipe = Pipe::mte2;
  MemLevel level = MemLevel::l2;
  StageTag stage = StageTag::setup;
  Buffer alloc_buffer = Buffer::none;
  Buffer free_buffer = Buffer::none;
  std::uint16_t core = 0;  // Program::add checks it is below num_cores (at most 4096)
  std::int32_t block = -1;
  std::uint32_t label = 0;
  std::uint32_t cost = 0;  // index into Program::costs
};

/// Global pipe index = core * kPipesPerCore + local index.
int local_pipe_index(int unit, Pipe pipe);  // throws SimError for a pipe the unit does not have
Pipe pipe_of_local(int local_index) noexcept;
int unit_of_local(int local_index) noexcept;
const char* pipe_name(Pipe pipe) noexcept;        // "MTE2", "MTE1", "M", "FIX", "V", "MTE3"
const char* unit_name(int unit) noexcept;         // "AIC", "AIV0", "AIV1"
const char* buffer_name(Buffer buffer) noexcept;  // "L1", "L0A", ...
/// "AIC.M", "AIV0.V", ...
std::string local_pipe_name(int local_index);

struct Program {
  int num_cores = 0;
  // Coarse flash attention: the two AIVs of a core run the same stages on the two halves of a
  // query tile, so only AIV0's are in the program and stand for both (their flags count for
  // both AIVs, their transfers twice in the L2/HBM shares and traffic, their statistics for
  // AIV1 too).
  bool mirrored_aivs = false;
  std::vector<PackedInstr> instrs;
  std::vector<InstrCost> costs;                    // the distinct costs; costs[0] is all zeros
  std::vector<std::vector<std::uint32_t>> queues;  // per global pipe: instruction indices
  std::vector<std::string> labels;                 // instruction labels ("QK3 mmad nope")
  std::vector<std::string> cross_flag_names;       // per cross-core flag id, for reports

  explicit Program(int cores = 0);
  /// Appends `instr` to its pipe's queue; returns its index.
  std::uint32_t add(const Instr& instr);
  /// Room for about `instructions` instructions, so a large program is not copied while it
  /// grows (each copy touches every page again).
  void reserve(std::size_t instructions);
  const InstrCost& cost(const PackedInstr& instr) const { return costs[instr.cost]; }
  /// The index of `label` in `labels`, adding it once.
  std::uint32_t intern_label(const std::string& label);
  std::string describe(std::uint32_t index) const;  // "core 3 AIC.M instruction #12 'QK mmad'"

 private:
  std::uint32_t intern_cost(const InstrCost& cost, std::uint32_t label);

  std::unordered_map<std::string, std::uint32_t> label_index_;
  // Costs by content, and per label the last few costs its instructions used: instructions of
  // one label nearly always repeat one of them (label 0, the intra-core sets, alternates between
  // the buffers it frees), which spares the hash lookup.
  struct CostHash {
    std::size_t operator()(const InstrCost& cost) const noexcept;
  };
  struct CostEqual {
    bool operator()(const InstrCost& a, const InstrCost& b) const noexcept;
  };
  std::unordered_map<InstrCost, std::uint32_t, CostHash, CostEqual> cost_index_;
  static constexpr std::size_t kRecentCosts = 4;
  std::vector<std::array<std::uint32_t, kRecentCosts>> recent_costs_of_label_;
};

}  // namespace ditops::sim
