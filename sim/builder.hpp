#pragma once
// The kit every kernel program is built from: typed instruction emitters (compute, GM copies,
// intra-core events, cross-core flags), ping-pong buffer rings guarded by events, a cube matmul
// tiled to the L0 buffers, the vector cost formula, and the task planning (KV splits, longest
// task first onto the least loaded core). sim/mla.cpp (MLA decode) and sim/fa.cpp (prefill
// flash attention) describe their kernels with it; neither re-implements a piece.

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "sim/hw.hpp"
#include "sim/program.hpp"

namespace ditops::sim {

inline constexpr int kAccBytes = 4;  // int32 / fp32 cube results and vector accumulators

/// A ping-pong ring of buffer slots between two pipes of one unit, guarded by intra-core
/// events: the producer waits `free` before refilling a slot, sets `ready` when the slot is
/// filled; the consumer waits `ready`; the releaser sets `free` when the data is dead.
struct Ring {
  int unit = 0;
  Pipe producer = Pipe::mte2;
  Pipe consumer = Pipe::mte1;
  Pipe releaser = Pipe::mte1;
  int first_ready_id = 0;
  int first_free_id = 0;
  int slots = 2;
  long long uses = 0;
  std::uint32_t ready_label = 0;
  std::uint32_t free_label = 0;
};

/// The rings of the staged QK-SM-PV-UP pipeline on one AI core (the MLA decode and prefill
/// flash-attention programs): on the AIC the K (and V) tiles, the P tiles and q in L1 (MTE2 ->
/// MTE1), the L0A/L0B and L0C double buffers; on each AIV the S tiles in (MTE2 -> V), the P
/// tiles out (V -> MTE3), the O_tmp tiles in (MTE2 -> V) and the running O (released by MTE3).
struct StagedRings {
  Ring k_tiles, v_tiles, p_tiles, q_tile, l0, l0c;  // AIC; v_tiles only where V has its own
  Ring s_in[2], p_out[2], o_tmp[2], o_acc[2];       // per AIV
};

/// Where the kernels' rings differ: slot counts and the AIC's MTE2 -> MTE1 event ids (K tiles
/// from 0; V tiles, where they have their own, 2-3 with K at 0-1).
struct StagedRingLayout {
  int k_slots = 2;
  bool v_tiles = false;
  int p_id = 4;  // the P tiles (2 slots)
  int q_id = 6;
  int o_tmp_slots = 1;  // 2 with UP ping-pong
  int o_acc_slots = 1;
};

/// One matmul C[m, n] = A[m, k] B[k, n] on the AIC, A and B in L1, C to GM.
struct Matmul {
  int m, n, k;
  double a_bytes, b_bytes;  // bytes per element of A (L0A) and B (L0B)
  bool int8;
  StageTag stage;
  int block;
  const char* name;
};

/// What a stage's instructions depend on besides its core, unit and ring slots (kernel-defined:
/// stage kind, tile tokens, rows, which flags it waits on or sets, ...). Coarse mode folds a
/// stage once per distinct key.
struct StageKey {
  std::array<std::int32_t, 8> values{};
  bool operator==(const StageKey& other) const = default;
};

class ProgramBuilder {
 public:
  ProgramBuilder(int cores, const HwParams& hw, SimMode mode = SimMode::fine);

  Program take() { return std::move(program_); }
  Program& program() { return program_; }

  std::uint32_t label(const std::string& text) { return program_.intern_label(text); }

  // ---- instructions ---------------------------------------------------------------------------
  void compute(int core, int unit, Pipe pipe, StageTag stage, int block, std::uint32_t text,
               double cycles, Buffer alloc = Buffer::none, double alloc_bytes = 0,
               Buffer release = Buffer::none, double free_bytes = 0);
  /// GM -> local by MTE2: the small-copy head and (nd2nz) the ND->NZ conversion, then the bytes
  /// at the unit's HBM or L2 port rate, landing the level's latency later.
  void gm_read(int core, int unit, StageTag stage, int block, std::uint32_t text, double bytes,
               MemLevel level, bool nd2nz, Buffer alloc, double alloc_bytes);
  /// Local -> L2 by FIX (AIC) or MTE3 (AIV).
  void gm_write(int core, int unit, StageTag stage, int block, std::uint32_t text, double bytes);
  void set_event(int core, int unit, Pipe from, Pipe to, int id, StageTag stage, int block,
                 Buffer alloc = Buffer::none, double alloc_bytes = 0, Buffer release = Buffer::none,
                 double free_bytes = 0);
  void wait_event(int core, int unit, Pipe from, Pipe on, int id, StageTag stage, int block,
                  std::uint32_t text);
  void set_cross(int core, int unit, Pipe pipe, int flag, int mode, StageTag stage, int block);
  /// `text` labels the wait in the reports (0: the flag's name), so a kernel can report one
  /// hand-off of a flag apart from the others.
  void wait_cross(int core, int unit, Pipe pipe, int flag, StageTag stage, int block,
                  std::uint32_t text = 0);

  // ---- stages -------------------------------------------------------------------------------
  /// One stage of `unit` on `core` (block: for labels): `emit_stage` calls the emitters above.
  /// Fine mode emits them as they are. Coarse mode folds them into one Op::stage per run of
  /// "cross-core wait, work, cross-core set" (fold_stage), and reuses the fold of an earlier
  /// stage with the same `key` without calling `emit_stage` again: a layer has millions of
  /// tiles but a few distinct tile shapes.
  template <class EmitStage>
  void stage(int core, int unit, int block, const StageKey& key, EmitStage&& emit_stage) {
    if (mode_ == SimMode::fine) {
      emit_stage();
      return;
    }
    for (Instr instr : folded(core, unit, key, emit_stage)) {
      instr.core = core;
      instr.unit = static_cast<std::uint8_t>(unit);
      instr.pipe = unit == 0 ? Pipe::m : Pipe::v;
      instr.block = block;
      program_.add(instr);
    }
  }

  /// Coarse mode: the time a stage holds its unit without contention (its folded ops' heads and
  /// transfers), for cost models; nothing is added to the program.
  template <class EmitStage>
  double stage_hold(int core, int unit, const StageKey& key, EmitStage&& emit_stage) {
    double hold = 0;
    for (const Instr& op : folded(core, unit, key, emit_stage)) hold += op.ideal_cycles;
    return hold;
  }

  // ---- rings ----------------------------------------------------------------------------------
  Ring make_ring(int unit, Pipe producer, Pipe consumer, Pipe releaser, int ready_id, int free_id,
                 int slots, const std::string& name);
  /// The staged pipeline's rings of one core (AIV event ids: MTE2 -> V 0-1 S, 4-5 O_tmp, 6-7 O;
  /// V -> MTE3 0-1 P; MTE3 -> MTE2 0-1 O free).
  StagedRings make_staged_rings(const StagedRingLayout& layout);
  /// The next slot; the producer first waits until the slot's previous contents were released.
  int acquire(int core, Ring& ring, StageTag stage, int block);
  void ready(int core, const Ring& ring, int slot, StageTag stage, int block,
             Buffer alloc = Buffer::none, double alloc_bytes = 0);
  void await(int core, const Ring& ring, int slot, StageTag stage, int block);
  void release(int core, const Ring& ring, int slot, StageTag stage, int block, Buffer buffer,
               double bytes);

  // ---- costs and the cube ---------------------------------------------------------------------
  /// One cycle per 16 x k0 x 16 fractal: k0 = 32 for int8, 16 for fp16/bf16 (the MAC rates).
  double mmad_cycles(int m, int n, int k, bool int8) const;
  /// `instrs` vector instructions plus `passes` passes over `tile_bytes` at the vector rate.
  double vector_cycles(double passes, double tile_bytes, int instrs) const;
  /// MTE1 L1->L0A/L0B, M mmad into L0C, FIX L0C->GM, double-buffered in L0 (`l0`) and L0C
  /// (`l0c`). Tiles are sized from the L0 capacities the way a tiling function would (half of
  /// each buffer, for ping-pong). With unit_flag_pieces > 1 the last k-slice's mmad is cut in
  /// that many pieces and FIX drains each piece while M continues.
  void emit_matmul(int core, const Matmul& mm, Ring& l0, Ring& l0c, int unit_flag_pieces);

 protected:
  const HwParams& hw_;
  Program program_;

 private:
  /// The fold of the stage `key`, recorded (kFoldCopies times) and folded on first use.
  template <class EmitStage>
  const std::vector<Instr>& folded(int core, int unit, const StageKey& key, EmitStage& emit_stage) {
    auto found = folds_.find(key);
    if (found == folds_.end()) {
      recording_ = true;
      recorded_.clear();
      emit_stage();
      const std::size_t copy_size = recorded_.size();
      for (int copy = 1; copy < kFoldCopies; ++copy) emit_stage();
      recording_ = false;
      found = folds_.emplace(key, fold_stage(recorded_, copy_size, core, unit)).first;
    }
    return found->second;
  }
  /// Fine mode: to the program. Coarse mode: recorded for the stage being folded.
  void emit(const Instr& instr);
  /// A stage is recorded this many times back to back, to time how far its repetitions overlap.
  static constexpr int kFoldCopies = 4;
  /// The Op::stage instructions of a recorded stage (`recorded`: kFoldCopies copies of
  /// `copy_size` instructions each); core, unit and block are set by the caller.
  std::vector<Instr> fold_stage(const std::vector<Instr>& recorded, std::size_t copy_size, int core,
                                int unit);
  /// One run: `first`..`last` of `recorded`, waiting on `wait` (a wait_cross, or nullptr),
  /// setting `set` (a set_cross, or nullptr), its occupancy scaled by `overlap_loss`.
  void fold_run(const std::vector<Instr>& recorded, std::size_t first, std::size_t last,
                const Instr* wait, const Instr* set, double overlap_loss, std::vector<Instr>& out);

  struct StageKeyHash {
    std::size_t operator()(const StageKey& key) const noexcept;
  };
  SimMode mode_;
  bool recording_ = false;
  std::vector<Instr> recorded_;
  std::unordered_map<StageKey, std::vector<Instr>, StageKeyHash> folds_;
};

// ---- task planning ------------------------------------------------------------------------------

// KV splits and block ranges: ops/schedule/split_plan.hpp, the plan the CPU drivers use too.

/// Longest task first onto the least loaded core (LPT). Returns per core the task indices in
/// execution order; ties go to the lower core and keep the task order (deterministic).
std::vector<std::vector<std::size_t>> assign_longest_first(const std::vector<double>& costs,
                                                           int cores);

}  // namespace ditops::sim
