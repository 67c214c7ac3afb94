#include "sim/builder.hpp"

#include <algorithm>
#include <cmath>

#include "ops/schedule/split_plan.hpp"
#include "sim/error.hpp"

namespace ditops::sim {
namespace {

Instr make_instr(int core, int unit, Pipe pipe, StageTag stage, int block, std::uint32_t text) {
  Instr instr;
  instr.core = core;
  instr.unit = static_cast<std::uint8_t>(unit);
  instr.pipe = pipe;
  instr.stage = stage;
  instr.block = block;
  instr.label = text;
  return instr;
}

}  // namespace

ProgramBuilder::ProgramBuilder(int cores, const HwParams& hw, SimMode mode)
    : hw_(hw), program_(cores), mode_(mode) {
  program_.cross_flag_names.assign(static_cast<std::size_t>(hw.cross_core_flag_ids), "");
}

void ProgramBuilder::compute(int core, int unit, Pipe pipe, StageTag stage, int block,
                             std::uint32_t text, double cycles, Buffer alloc, double alloc_bytes,
                             Buffer release, double free_bytes) {
  Instr instr = make_instr(core, unit, pipe, stage, block, text);
  instr.op = Op::compute;
  instr.cycles = cycles;
  instr.alloc_buffer = alloc;
  instr.alloc_bytes = static_cast<std::uint32_t>(alloc_bytes);
  instr.free_buffer = release;
  instr.free_bytes = static_cast<std::uint32_t>(free_bytes);
  emit(instr);
}

void ProgramBuilder::gm_read(int core, int unit, StageTag stage, int block, std::uint32_t text,
                             double bytes, MemLevel level, bool nd2nz, Buffer alloc,
                             double alloc_bytes) {
  Instr instr = make_instr(core, unit, Pipe::mte2, stage, block, text);
  instr.op = Op::gm_read;
  instr.level = level;
  instr.bytes = bytes;
  const bool hbm = level == MemLevel::hbm;
  instr.port_rate = hbm ? hw_.mte2_gm_bytes_per_cycle : hw_.l2_read_bytes_per_cycle;
  instr.cycles = (bytes < hw_.mte2_small_copy_bytes ? hw_.mte2_small_copy_head_cycles : 0) +
                 (nd2nz ? hw_.nd2nz_cycles : 0);
  instr.latency = hbm ? hw_.hbm_latency_cycles : hw_.l2_read_latency_cycles;
  instr.ideal_cycles = instr.cycles + bytes / instr.port_rate;
  instr.alloc_buffer = alloc;
  instr.alloc_bytes = static_cast<std::uint32_t>(alloc_bytes);
  emit(instr);
}

void ProgramBuilder::gm_write(int core, int unit, StageTag stage, int block, std::uint32_t text,
                              double bytes) {
  const Pipe pipe = unit == 0 ? Pipe::fix : Pipe::mte3;
  Instr instr = make_instr(core, unit, pipe, stage, block, text);
  instr.op = Op::gm_write;
  instr.level = MemLevel::l2;
  instr.bytes = bytes;
  instr.port_rate =
      unit == 0 ? std::min(hw_.fix_gm_write_bytes_per_cycle, hw_.fix_l0c_read_bytes_per_cycle)
                : hw_.mte3_ub_to_l2_bytes_per_cycle;
  instr.latency = hw_.l2_write_latency_cycles;
  instr.ideal_cycles = instr.cycles + bytes / instr.port_rate;
  emit(instr);
}

void ProgramBuilder::set_event(int core, int unit, Pipe from, Pipe to, int id, StageTag stage,
                               int block, Buffer alloc, double alloc_bytes, Buffer release,
                               double free_bytes) {
  Instr instr = make_instr(core, unit, from, stage, block, 0);
  instr.op = Op::set_event;
  instr.peer_pipe = to;
  instr.flag = static_cast<std::uint8_t>(id);
  instr.alloc_buffer = alloc;
  instr.alloc_bytes = static_cast<std::uint32_t>(alloc_bytes);
  instr.free_buffer = release;
  instr.free_bytes = static_cast<std::uint32_t>(free_bytes);
  emit(instr);
}

void ProgramBuilder::wait_event(int core, int unit, Pipe from, Pipe on, int id, StageTag stage,
                                int block, std::uint32_t text) {
  Instr instr = make_instr(core, unit, on, stage, block, text);
  instr.op = Op::wait_event;
  instr.peer_pipe = from;
  instr.flag = static_cast<std::uint8_t>(id);
  emit(instr);
}

void ProgramBuilder::set_cross(int core, int unit, Pipe pipe, int flag, int mode, StageTag stage,
                               int block) {
  Instr instr = make_instr(core, unit, pipe, stage, block,
                           label(program_.cross_flag_names[static_cast<std::size_t>(flag)]));
  instr.op = Op::set_cross;
  instr.flag = static_cast<std::uint8_t>(flag);
  instr.mode = static_cast<std::uint8_t>(mode);
  emit(instr);
}

void ProgramBuilder::wait_cross(int core, int unit, Pipe pipe, int flag, StageTag stage, int block,
                                std::uint32_t text) {
  Instr instr = make_instr(
      core, unit, pipe, stage, block,
      text != 0 ? text : label(program_.cross_flag_names[static_cast<std::size_t>(flag)]));
  instr.op = Op::wait_cross;
  instr.flag = static_cast<std::uint8_t>(flag);
  emit(instr);
}

Ring ProgramBuilder::make_ring(int unit, Pipe producer, Pipe consumer, Pipe releaser, int ready_id,
                               int free_id, int slots, const std::string& name) {
  Ring ring;
  ring.unit = unit;
  ring.producer = producer;
  ring.consumer = consumer;
  ring.releaser = releaser;
  ring.first_ready_id = ready_id;
  ring.first_free_id = free_id;
  ring.slots = slots;
  ring.ready_label = label("wait " + name + " ready");
  ring.free_label = label("wait " + name + " free");
  return ring;
}

StagedRings ProgramBuilder::make_staged_rings(const StagedRingLayout& layout) {
  StagedRings rings;
  rings.k_tiles =
      make_ring(0, Pipe::mte2, Pipe::mte1, Pipe::mte1, 0, 0, layout.k_slots, "K tile (L1)");
  if (layout.v_tiles) {
    rings.v_tiles = make_ring(0, Pipe::mte2, Pipe::mte1, Pipe::mte1, 2, 2, 2, "V tile (L1)");
  }
  rings.p_tiles =
      make_ring(0, Pipe::mte2, Pipe::mte1, Pipe::mte1, layout.p_id, layout.p_id, 2, "P tile (L1)");
  rings.q_tile =
      make_ring(0, Pipe::mte2, Pipe::mte1, Pipe::mte1, layout.q_id, layout.q_id, 1, "q (L1)");
  rings.l0 = make_ring(0, Pipe::mte1, Pipe::m, Pipe::m, 0, 0, 2, "L0A/L0B");
  rings.l0c = make_ring(0, Pipe::m, Pipe::fix, Pipe::fix, 0, 0, 2, "L0C");
  for (int aiv = 0; aiv < 2; ++aiv) {
    const int unit = aiv + 1;
    rings.s_in[aiv] = make_ring(unit, Pipe::mte2, Pipe::v, Pipe::v, 0, 0, 2, "S tile (UB)");
    rings.p_out[aiv] = make_ring(unit, Pipe::v, Pipe::mte3, Pipe::mte3, 0, 0, 2, "P tile (UB)");
    rings.o_tmp[aiv] =
        make_ring(unit, Pipe::mte2, Pipe::v, Pipe::v, 4, 4, layout.o_tmp_slots, "O_tmp tile (UB)");
    rings.o_acc[aiv] =
        make_ring(unit, Pipe::mte2, Pipe::v, Pipe::mte3, 6, 0, layout.o_acc_slots, "O tile (UB)");
  }
  return rings;
}

int ProgramBuilder::acquire(int core, Ring& ring, StageTag stage, int block) {
  const int slot = static_cast<int>(ring.uses % ring.slots);
  if (ring.uses >= ring.slots) {
    wait_event(core, ring.unit, ring.releaser, ring.producer, ring.first_free_id + slot, stage,
               block, ring.free_label);
  }
  ++ring.uses;
  return slot;
}

void ProgramBuilder::ready(int core, const Ring& ring, int slot, StageTag stage, int block,
                           Buffer alloc, double alloc_bytes) {
  set_event(core, ring.unit, ring.producer, ring.consumer, ring.first_ready_id + slot, stage, block,
            alloc, alloc_bytes);
}

void ProgramBuilder::await(int core, const Ring& ring, int slot, StageTag stage, int block) {
  wait_event(core, ring.unit, ring.producer, ring.consumer, ring.first_ready_id + slot, stage,
             block, ring.ready_label);
}

void ProgramBuilder::release(int core, const Ring& ring, int slot, StageTag stage, int block,
                             Buffer buffer, double bytes) {
  set_event(core, ring.unit, ring.releaser, ring.producer, ring.first_free_id + slot, stage, block,
            Buffer::none, 0, buffer, bytes);
}

double ProgramBuilder::mmad_cycles(int m, int n, int k, bool int8) const {
  const double macs = int8 ? hw_.cube_int8_macs_per_cycle : hw_.cube_fp16_macs_per_cycle;
  const double k0 = macs / 256.0;
  return std::ceil(m / 16.0) * std::ceil(n / 16.0) * std::ceil(k / k0);
}

double ProgramBuilder::vector_cycles(double passes, double tile_bytes, int instrs) const {
  return instrs * hw_.vector_issue_cycles + passes * tile_bytes / hw_.vector_bytes_per_cycle;
}

void ProgramBuilder::emit_matmul(int core, const Matmul& mm, Ring& l0, Ring& l0c,
                                 int unit_flag_pieces) {
  int n_tile = mm.n;
  while (n_tile > 16 && mm.m * static_cast<double>(n_tile) * kAccBytes > hw_.l0c_bytes / 2) {
    n_tile = (n_tile + 1) / 2;
  }
  int k_slice = mm.k;
  while (k_slice > 16 && (mm.m * static_cast<double>(k_slice) * mm.a_bytes > hw_.l0a_bytes / 2 ||
                          k_slice * static_cast<double>(n_tile) * mm.b_bytes > hw_.l0b_bytes / 2)) {
    k_slice = (k_slice + 1) / 2;
  }
  const std::string prefix = std::string(stage_tag_name(mm.stage)) + " " + mm.name;
  const std::uint32_t load_a = label(prefix + " L1->L0A");
  const std::uint32_t load_b = label(prefix + " L1->L0B");
  const std::uint32_t mmad = label(prefix + " mmad");
  const std::uint32_t fix = label(prefix + " FIX L0C->GM");
  for (int n0 = 0; n0 < mm.n; n0 += n_tile) {
    const int n_len = std::min(n_tile, mm.n - n0);
    const double c_bytes = static_cast<double>(mm.m) * n_len * kAccBytes;
    const int c_slot = acquire(core, l0c, mm.stage, mm.block);
    for (int k0 = 0; k0 < mm.k; k0 += k_slice) {
      const int k_len = std::min(k_slice, mm.k - k0);
      const double a = static_cast<double>(mm.m) * k_len * mm.a_bytes;
      const double b = static_cast<double>(k_len) * n_len * mm.b_bytes;
      const int slot = acquire(core, l0, mm.stage, mm.block);
      compute(core, 0, Pipe::mte1, mm.stage, mm.block, load_a,
              hw_.mte1_start_cycles + a / hw_.mte1_l0a_bytes_per_cycle, Buffer::l0a, a);
      compute(core, 0, Pipe::mte1, mm.stage, mm.block, load_b,
              hw_.mte1_start_cycles + b / hw_.mte1_l0b_bytes_per_cycle, Buffer::l0b, b);
      ready(core, l0, slot, mm.stage, mm.block);
      await(core, l0, slot, mm.stage, mm.block);
      const bool first_k = k0 == 0;
      const bool last_k = k0 + k_len >= mm.k;
      const double cycles = mmad_cycles(mm.m, n_len, k_len, mm.int8);
      const int pieces = last_k ? unit_flag_pieces : 1;
      for (int piece = 0; piece < pieces; ++piece) {
        // The mmad releases L0A when it ends; the set below releases L0B.
        compute(core, 0, Pipe::m, mm.stage, mm.block, mmad, cycles / pieces,
                first_k && piece == 0 ? Buffer::l0c : Buffer::none,
                first_k && piece == 0 ? c_bytes : 0,
                piece == pieces - 1 ? Buffer::l0a : Buffer::none, piece == pieces - 1 ? a : 0);
        if (last_k) ready(core, l0c, c_slot, mm.stage, mm.block);
      }
      release(core, l0, slot, mm.stage, mm.block, Buffer::l0b, b);
    }
    for (int piece = 0; piece < unit_flag_pieces; ++piece) {
      await(core, l0c, c_slot, mm.stage, mm.block);
      gm_write(core, 0, mm.stage, mm.block, fix, c_bytes / unit_flag_pieces);
    }
    release(core, l0c, c_slot, mm.stage, mm.block, Buffer::l0c, c_bytes);
  }
}

void ProgramBuilder::emit(const Instr& instr) {
  if (recording_) {
    recorded_.push_back(instr);
    return;
  }
  if (mode_ == SimMode::coarse) {
    throw SimError("coarse mode: an instruction outside a stage: " + program_.labels[instr.label]);
  }
  program_.add(instr);
}

std::size_t ProgramBuilder::StageKeyHash::operator()(const StageKey& key) const noexcept {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const std::int32_t value : key.values) {
    hash = (hash ^ static_cast<std::uint32_t>(value)) * 0x100000001b3ULL;
  }
  return static_cast<std::size_t>(hash ^ (hash >> 29));
}

namespace {

/// Instructions `first`..`last` of a recorded stage timed on an idle unit, as the engine would
/// time them without contention: each pipe runs its instructions in order, an intra-core wait
/// takes the earliest recorded set it matches, and a wait no recorded set can release (its set
/// came from an earlier stage) finds its slot free. Cross-core flags are taken as already set.
struct RunTiming {
  double occupancy = 0;         // the busiest pipe's busy time
  double critical = 0;          // until the last pipe is free and its work retired
  double bytes[2] = {0, 0};     // per level (L2, HBM)
  double transfer[2] = {0, 0};  // the pipes' transfer time at their port rates, per level
};

RunTiming time_run(const std::vector<Instr>& recorded, std::size_t first, std::size_t last,
                   double event_latency) {
  struct PipeClock {
    std::vector<std::size_t> queue;
    std::size_t pos = 0;
    double free = 0;    // when the pipe can start its next instruction
    double retire = 0;  // when its issued work has retired (DMA data landed)
    double busy = 0;
    double transfer[2] = {0, 0};
  };
  struct PendingSet {
    Pipe from, to;
    std::uint8_t id;
    double visible;
  };
  std::array<PipeClock, kNumPipeKinds> pipes{};
  for (std::size_t i = first; i < last; ++i) {
    pipes[static_cast<std::size_t>(recorded[i].pipe)].queue.push_back(i);
  }
  std::vector<PendingSet> sets;
  RunTiming timing;
  // Runs every pipe as far as its waits allow; returns false when no pipe moved.
  const auto advance = [&](bool force_first_wait) {
    bool moved = false;
    for (PipeClock& pipe : pipes) {
      while (pipe.pos < pipe.queue.size()) {
        const Instr& instr = recorded[pipe.queue[pipe.pos]];
        if (instr.op == Op::wait_event) {
          const auto match = std::find_if(sets.begin(), sets.end(), [&](const PendingSet& set) {
            return set.from == instr.peer_pipe && set.to == instr.pipe && set.id == instr.flag;
          });
          if (match != sets.end()) {
            pipe.free = std::max(pipe.free, match->visible);
            sets.erase(match);
          } else if (!force_first_wait) {
            break;
          }
          force_first_wait = false;
        } else if (instr.op == Op::compute) {
          pipe.free += instr.cycles;
          pipe.busy += instr.cycles;
          pipe.retire = std::max(pipe.retire, pipe.free);
        } else if (instr.op == Op::gm_read || instr.op == Op::gm_write) {
          const double moving = instr.bytes > 0 ? instr.bytes / instr.port_rate : 0;
          const int level = instr.level == MemLevel::hbm ? 1 : 0;
          pipe.free += instr.cycles + moving;
          pipe.busy += instr.cycles + moving;
          pipe.retire = std::max(pipe.retire, pipe.free + instr.latency);
          pipe.transfer[level] += moving;
          timing.bytes[level] += instr.bytes;
        } else if (instr.op == Op::set_event) {
          sets.push_back({instr.pipe, instr.peer_pipe, instr.flag,
                          std::max(pipe.free, pipe.retire) + event_latency});
        }
        ++pipe.pos;
        moved = true;
      }
    }
    return moved;
  };
  const auto unfinished = [&] {
    return std::any_of(pipes.begin(), pipes.end(),
                       [](const PipeClock& pipe) { return pipe.pos < pipe.queue.size(); });
  };
  while (unfinished()) {
    if (!advance(false)) advance(true);
  }
  for (const PipeClock& pipe : pipes) {
    timing.occupancy = std::max(timing.occupancy, pipe.busy);
    timing.critical = std::max({timing.critical, pipe.free, pipe.retire});
    for (int level = 0; level < 2; ++level) timing.transfer[level] += pipe.transfer[level];
  }
  return timing;
}

}  // namespace

std::vector<Instr> ProgramBuilder::fold_stage(const std::vector<Instr>& recorded,
                                              std::size_t copy_size, int core, int unit) {
  for (const Instr& instr : recorded) {
    if (instr.core != core || instr.unit != unit) {
      throw SimError("coarse mode: a stage of core " + std::to_string(core) + " " +
                     unit_name(unit) + " emits for core " + std::to_string(instr.core) + " " +
                     unit_name(instr.unit));
    }
  }
  // The stage's period when it repeats back to back (its rings let the next copy start only as
  // far as their slots allow), over the busiest pipe's time: how much the unit's pipes fail to
  // overlap. Each run's occupancy is its busiest pipe scaled by that.
  const double latency = hw_.intra_core_event_latency_cycles;
  const RunTiming once = time_run(recorded, 0, copy_size, latency);
  const RunTiming repeated = time_run(recorded, 0, recorded.size(), latency);
  const double copies = static_cast<double>(recorded.size()) / static_cast<double>(copy_size);
  const double period = (repeated.critical - once.critical) / (copies - 1);
  const double overlap_loss = once.occupancy > 0 ? std::max(1.0, period / once.occupancy) : 1.0;
  // Runs of "wait, work, set": a cross-core wait after work starts a new run, a set ends one,
  // so every flag keeps its place between the work before and after it.
  std::vector<Instr> out;
  const Instr* wait = nullptr;
  std::size_t first = 0;
  bool work = false;
  for (std::size_t i = 0; i < copy_size; ++i) {
    const Instr& instr = recorded[i];
    if (instr.op == Op::wait_cross) {
      if (work || wait != nullptr) fold_run(recorded, first, i, wait, nullptr, overlap_loss, out);
      wait = &instr;
      first = i + 1;
      work = false;
    } else if (instr.op == Op::set_cross) {
      fold_run(recorded, first, i, wait, &instr, overlap_loss, out);
      wait = nullptr;
      first = i + 1;
      work = false;
    } else if (instr.op == Op::compute || instr.op == Op::gm_read || instr.op == Op::gm_write) {
      work = true;
    }
  }
  if (work || wait != nullptr) {
    fold_run(recorded, first, copy_size, wait, nullptr, overlap_loss, out);
  }
  return out;
}

void ProgramBuilder::fold_run(const std::vector<Instr>& recorded, std::size_t first,
                              std::size_t last, const Instr* wait, const Instr* set,
                              double overlap_loss, std::vector<Instr>& out) {
  const RunTiming timing = time_run(recorded, first, last, hw_.intra_core_event_latency_cycles);
  StageTag tag = set != nullptr ? set->stage : (wait != nullptr ? wait->stage : StageTag::setup);
  if (first < last) tag = recorded[first].stage;
  const std::uint32_t text = label(std::string(stage_tag_name(tag)) + " stage (folded)");
  // The unit is held for the occupancy; the rest of the critical path is the last op's latency,
  // after which its flag is set. One op per level with traffic (HBM first) moves the level's
  // bytes in the time its ports spend on them together (as one port that carries them in turn,
  // so it asks the level for no more than the ports did), or faster when that would not fit in
  // the occupancy.
  const double held = timing.occupancy * overlap_loss;
  const double port_time = timing.transfer[0] + timing.transfer[1];
  const double squeeze = port_time > held ? held / port_time : 1.0;
  std::vector<Instr> ops;
  for (const int level : {1, 0}) {
    if (timing.bytes[level] <= 0) continue;
    Instr op;
    op.level = level == 1 ? MemLevel::hbm : MemLevel::l2;
    op.bytes = timing.bytes[level];
    op.port_rate = timing.bytes[level] / (timing.transfer[level] * squeeze);
    ops.push_back(op);
  }
  if (ops.empty()) ops.emplace_back();
  double moving = 0;
  for (const Instr& op : ops) moving += op.bytes > 0 ? op.bytes / op.port_rate : 0;
  ops.back().cycles = std::max(0.0, held - moving);
  ops.back().latency = std::max(0.0, timing.critical - held);
  for (Instr& op : ops) {
    op.op = Op::stage;
    op.stage = tag;
    op.label = text;
    op.flag = kNoFlag;
    op.ideal_cycles = op.cycles + (op.bytes > 0 ? op.bytes / op.port_rate : 0);
  }
  if (wait != nullptr) {
    ops.front().wait_flag = wait->flag;
    ops.front().wait_label = wait->label;
  }
  if (set != nullptr) {
    ops.back().flag = set->flag;
    ops.back().mode = set->mode;
  }
  out.insert(out.end(), ops.begin(), ops.end());
}

std::vector<std::vector<std::size_t>> assign_longest_first(const std::vector<double>& costs,
                                                           int cores) {
  std::vector<double> load(static_cast<std::size_t>(cores), 0.0);
  std::vector<std::vector<std::size_t>> per_core(static_cast<std::size_t>(cores));
  for (const std::int64_t index : schedule::longest_first(costs)) {
    const auto target =
        static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[target] += costs[index];
    per_core[target].push_back(index);
  }
  return per_core;
}

}  // namespace ditops::sim
