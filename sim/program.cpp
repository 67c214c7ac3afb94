#include "sim/program.hpp"

#include <algorithm>
#include <bit>
#include <limits>

#include "sim/error.hpp"

namespace ditops::sim {

const char* stage_tag_name(StageTag tag) noexcept {
  switch (tag) {
    case StageTag::setup:
      return "setup";
    case StageTag::qk:
      return "QK";
    case StageTag::sm:
      return "SM";
    case StageTag::pv:
      return "PV";
    case StageTag::up:
      return "UP";
    case StageTag::combine:
      return "combine";
    case StageTag::sync:
      return "sync";
  }
  return "?";
}

const char* sim_mode_name(SimMode mode) noexcept {
  return mode == SimMode::coarse ? "coarse" : "fine";
}

int local_pipe_index(int unit, Pipe pipe) {
  if (unit == 0) {
    switch (pipe) {
      case Pipe::mte2:
        return 0;
      case Pipe::mte1:
        return 1;
      case Pipe::m:
        return 2;
      case Pipe::fix:
        return 3;
      default:
        break;
    }
  } else if (unit == 1 || unit == 2) {
    const int base = unit == 1 ? 4 : 7;
    switch (pipe) {
      case Pipe::mte2:
        return base;
      case Pipe::v:
        return base + 1;
      case Pipe::mte3:
        return base + 2;
      default:
        break;
    }
  }
  throw SimError(std::string("unit ") + unit_name(unit) + " has no pipe " + pipe_name(pipe));
}

Pipe pipe_of_local(int local_index) noexcept {
  static constexpr Pipe kPipes[kPipesPerCore] = {Pipe::mte2, Pipe::mte1, Pipe::m,    Pipe::fix,
                                                 Pipe::mte2, Pipe::v,    Pipe::mte3, Pipe::mte2,
                                                 Pipe::v,    Pipe::mte3};
  return kPipes[local_index];
}

int unit_of_local(int local_index) noexcept {
  return local_index < 4 ? 0 : (local_index < 7 ? 1 : 2);
}

const char* pipe_name(Pipe pipe) noexcept {
  switch (pipe) {
    case Pipe::mte2:
      return "MTE2";
    case Pipe::mte1:
      return "MTE1";
    case Pipe::m:
      return "M";
    case Pipe::fix:
      return "FIX";
    case Pipe::v:
      return "V";
    case Pipe::mte3:
      return "MTE3";
  }
  return "?";
}

const char* unit_name(int unit) noexcept {
  switch (unit) {
    case 0:
      return "AIC";
    case 1:
      return "AIV0";
    case 2:
      return "AIV1";
    default:
      return "?";
  }
}

const char* buffer_name(Buffer buffer) noexcept {
  switch (buffer) {
    case Buffer::none:
      return "none";
    case Buffer::l1:
      return "L1";
    case Buffer::l0a:
      return "L0A";
    case Buffer::l0b:
      return "L0B";
    case Buffer::l0c:
      return "L0C";
    case Buffer::ub:
      return "UB";
  }
  return "?";
}

std::string local_pipe_name(int local_index) {
  return std::string(unit_name(unit_of_local(local_index))) + "." +
         pipe_name(pipe_of_local(local_index));
}

Program::Program(int cores) : num_cores(cores) {
  queues.resize(static_cast<std::size_t>(cores) * kPipesPerCore);
  labels.emplace_back("");
  label_index_.emplace("", 0);
  costs.emplace_back();
  cost_index_.emplace(InstrCost{}, 0);
  recent_costs_of_label_.push_back({});
}

namespace {

// Costs are compared and hashed by their bits: two costs are shared only when every number is
// the same double, so packing never changes a result.
bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

}  // namespace

std::size_t Program::CostHash::operator()(const InstrCost& cost) const noexcept {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  const auto mix = [&](std::uint64_t value) { hash = (hash ^ value) * 0x100000001b3ULL; };
  for (const double value :
       {cost.cycles, cost.latency, cost.bytes, cost.port_rate, cost.ideal_cycles}) {
    mix(std::bit_cast<std::uint64_t>(value));
  }
  mix((static_cast<std::uint64_t>(cost.alloc_bytes) << 32) | cost.free_bytes);
  mix((static_cast<std::uint64_t>(cost.wait_label) << 8) | cost.wait_flag);
  return static_cast<std::size_t>(hash ^ (hash >> 29));
}

bool Program::CostEqual::operator()(const InstrCost& a, const InstrCost& b) const noexcept {
  return same_bits(a.cycles, b.cycles) && same_bits(a.latency, b.latency) &&
         same_bits(a.bytes, b.bytes) && same_bits(a.port_rate, b.port_rate) &&
         same_bits(a.ideal_cycles, b.ideal_cycles) && a.alloc_bytes == b.alloc_bytes &&
         a.free_bytes == b.free_bytes && a.wait_flag == b.wait_flag && a.wait_label == b.wait_label;
}

std::uint32_t Program::intern_cost(const InstrCost& cost, std::uint32_t label) {
  if (label >= recent_costs_of_label_.size()) {
    recent_costs_of_label_.resize(std::max<std::size_t>(labels.size(), label + 1),
                                  std::array<std::uint32_t, kRecentCosts>{});
  }
  auto& recent = recent_costs_of_label_[label];
  for (const std::uint32_t index : recent) {
    if (CostEqual{}(costs[index], cost)) return index;
  }
  const auto [found, added] =
      cost_index_.try_emplace(cost, static_cast<std::uint32_t>(costs.size()));
  if (added) costs.push_back(cost);
  // The newest first; the oldest drops out.
  std::copy_backward(recent.begin(), recent.end() - 1, recent.end());
  recent.front() = found->second;
  return found->second;
}

std::uint32_t Program::add(const Instr& instr) {
  if (instr.core < 0 || instr.core >= num_cores ||
      instr.core > std::numeric_limits<std::uint16_t>::max()) {
    throw SimError("instruction for core " + std::to_string(instr.core) + " but the program has " +
                   std::to_string(num_cores) + " cores");
  }
  const int local = local_pipe_index(instr.unit, instr.pipe);
  const auto index = static_cast<std::uint32_t>(instrs.size());
  PackedInstr packed;
  packed.op = instr.op;
  packed.pipe = instr.pipe;
  packed.unit = instr.unit;
  packed.flag = instr.flag;
  packed.mode = instr.mode;
  packed.peer_pipe = instr.peer_pipe;
  packed.level = instr.level;
  packed.stage = instr.stage;
  packed.alloc_buffer = instr.alloc_buffer;
  packed.free_buffer = instr.free_buffer;
  packed.core = static_cast<std::uint16_t>(instr.core);
  packed.block = instr.block;
  packed.label = instr.label;
  packed.cost = intern_cost(
      InstrCost{instr.cycles, instr.latency, instr.bytes, instr.port_rate, instr.ideal_cycles,
                instr.alloc_bytes, instr.free_bytes, instr.wait_flag, instr.wait_label},
      instr.label);
  instrs.push_back(packed);
  queues[static_cast<std::size_t>(instr.core) * kPipesPerCore + local].push_back(index);
  return index;
}

void Program::reserve(std::size_t instructions) { instrs.reserve(instructions); }

std::uint32_t Program::intern_label(const std::string& label) {
  const auto found = label_index_.find(label);
  if (found != label_index_.end()) return found->second;
  labels.push_back(label);
  const auto index = static_cast<std::uint32_t>(labels.size() - 1);
  label_index_.emplace(label, index);
  return index;
}

std::string Program::describe(std::uint32_t index) const {
  const PackedInstr& instr = instrs[index];
  std::string text = "core " + std::to_string(instr.core) + " " + unit_name(instr.unit) + "." +
                     pipe_name(instr.pipe) + " instruction #" + std::to_string(index);
  if (instr.label != 0) text += " '" + labels[instr.label] + "'";
  if (instr.block >= 0) text += " (block " + std::to_string(instr.block) + ")";
  return text;
}

}  // namespace ditops::sim
