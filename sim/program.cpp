#include "sim/program.hpp"

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
}

std::uint32_t Program::add(const Instr& instr) {
  if (instr.core < 0 || instr.core >= num_cores) {
    throw SimError("instruction for core " + std::to_string(instr.core) + " but the program has " +
                   std::to_string(num_cores) + " cores");
  }
  const int local = local_pipe_index(instr.unit, instr.pipe);
  const auto index = static_cast<std::uint32_t>(instrs.size());
  instrs.push_back(instr);
  queues[static_cast<std::size_t>(instr.core) * kPipesPerCore + local].push_back(index);
  return index;
}

std::uint32_t Program::intern_label(const std::string& label) {
  const auto found = label_index_.find(label);
  if (found != label_index_.end()) return found->second;
  labels.push_back(label);
  const auto index = static_cast<std::uint32_t>(labels.size() - 1);
  label_index_.emplace(label, index);
  return index;
}

std::string Program::describe(std::uint32_t index) const {
  const Instr& instr = instrs[index];
  std::string text = "core " + std::to_string(instr.core) + " " + unit_name(instr.unit) + "." +
                     pipe_name(instr.pipe) + " instruction #" + std::to_string(index);
  if (instr.label != 0) text += " '" + labels[instr.label] + "'";
  if (instr.block >= 0) text += " (block " + std::to_string(instr.block) + ")";
  return text;
}

}  // namespace ditops::sim
