#include "sim/engine.hpp"

#include <algorithm>
#include <limits>
#include <queue>

#include "sim/error.hpp"

namespace ditops::sim {
namespace {

enum class EventKind : std::uint8_t { pipe_done, transfer_head_done, transfer_done, visible };

/// Events one instruction may cause, with room to spare (see Engine::run).
constexpr std::uint64_t kEventsPerInstruction = 8;

struct Event {
  double time;
  std::uint64_t seq;  // ties broken by creation order, so runs are deterministic
  EventKind kind;
  std::uint32_t a;
  std::uint32_t b;
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : seq > other.seq;
  }
};

/// A flag or event counter: the increments that became visible and were not consumed yet.
struct Counter {
  std::vector<std::pair<double, std::uint32_t>> visible;  // (time, set instruction)
  std::size_t head = 0;
  int waiter = -1;  // global pipe blocked on this counter
  std::size_t count() const { return visible.size() - head; }
};

struct PipeState {
  std::size_t pos = 0;
  bool blocked = false;
  double block_start = 0;
  double issue_time = 0;  // start of the running instruction
  double last_end = 0;    // when the pipe was last released
  double retire = 0;      // when all issued work has retired
};

struct Transfer {
  int resource = -1;  // 0 = L2, 1 = HBM while active
  double bytes = 0;   // the instruction's, kept here: every completion check reads it
  double remaining = 0;
  double rate = 0;
  double cap = 0;
  int weight = 1;  // transfers it stands for (2: a mirrored AIV's), each at `rate`
};

struct Resource {
  double capacity = 0;
  double last_update = 0;
  std::uint32_t version = 0;  // bumped whenever rates change
  std::vector<int> active;    // global pipes
  std::size_t weight = 0;     // the active transfers' weights: how many they stand for
  // The earliest completion under the current rates. Only the latest one counts (every start
  // or end of a transfer replaces it), so it is kept here instead of in the event heap, where
  // the replaced ones would stay as stale entries: most of the heap in a transfer-heavy run.
  bool completion_pending = false;
  Event completion{};
};

class Engine {
 public:
  Engine(const Program& program, const HwParams& hw, const EngineOptions& options)
      : program_(program), hw_(hw), options_(options) {
    cores_ = program.num_cores;
    event_ids_ = static_cast<int>(hw.intra_core_event_ids);
    flag_ids_ = static_cast<int>(hw.cross_core_flag_ids);
    max_pending_ = static_cast<std::size_t>(hw.cross_core_max_pending);
    pipes_.resize(static_cast<std::size_t>(cores_) * kPipesPerCore);
    transfers_.resize(pipes_.size());
    result_.pipes.resize(pipes_.size());
    event_counters_.resize(static_cast<std::size_t>(cores_) * kUnitsPerCore * kNumPipeKinds *
                           kNumPipeKinds * event_ids_);
    flag_counters_.resize(static_cast<std::size_t>(cores_) * kUnitsPerCore * flag_ids_);
    mode2_up_sets_.assign(static_cast<std::size_t>(cores_) * flag_ids_ * 2, 0);
    mode2_up_released_.assign(static_cast<std::size_t>(cores_) * flag_ids_, 0);
    mode1_sets_.assign(static_cast<std::size_t>(cores_) * flag_ids_ * 2, 0);
    mode1_released_.assign(static_cast<std::size_t>(cores_) * flag_ids_, 0);
    mode0_sets_.assign(static_cast<std::size_t>(2) * flag_ids_ * cores_ * 2, 0);
    mode0_released_.assign(static_cast<std::size_t>(2) * flag_ids_, 0);
    occupancy_.assign(static_cast<std::size_t>(cores_) * kUnitsPerCore * kNumBuffers, 0.0);
    result_.buffer_peak.assign(occupancy_.size(), 0.0);
    resources_[0].capacity = hw.l2_bandwidth_bytes_per_cycle;
    resources_[1].capacity = hw.hbm_bandwidth_bytes_per_cycle;
    capacity_[static_cast<int>(Buffer::l1)] = hw.l1_bytes;
    capacity_[static_cast<int>(Buffer::l0a)] = hw.l0a_bytes;
    capacity_[static_cast<int>(Buffer::l0b)] = hw.l0b_bytes;
    capacity_[static_cast<int>(Buffer::l0c)] = hw.l0c_bytes;
    capacity_[static_cast<int>(Buffer::ub)] = hw.ub_bytes;
    if (options.record_instructions) result_.records.resize(program.instrs.size());
  }

  SimResult run() {
    validate_program();
    for (std::size_t pipe = 0; pipe < pipes_.size(); ++pipe) try_issue(static_cast<int>(pipe), 0);
    // Every instruction schedules a few events (a transfer: its head, and a bandwidth share
    // when it starts and when it ends); more than this many is a loop that makes no progress.
    const std::uint64_t max_events = kEventsPerInstruction * (program_.instrs.size() + 8);
    std::uint64_t processed = 0;
    Event event{};
    while (pop_next_event(event)) {
      if (++processed > max_events) {
        throw SimError("the simulation makes no progress: more than " + std::to_string(max_events) +
                       " events for " + std::to_string(program_.instrs.size()) +
                       " instructions, the last at " + event_cause(event) +
                       " (an engine bug: please report the command)");
      }
      if (event.time > kMaxCycles) {
        throw SimError("simulated time passed " + number_text(kMaxCycles) + " cycles at " +
                       event_cause(event) +
                       ": the hardware parameters make the program far too slow");
      }
      now_ = event.time;
      switch (event.kind) {
        case EventKind::pipe_done:
          finish(static_cast<int>(event.a), now_);
          break;
        case EventKind::transfer_head_done:
          start_flow(static_cast<int>(event.a));
          break;
        case EventKind::transfer_done:
          complete_flows(static_cast<int>(event.a), event.b);
          break;
        case EventKind::visible:
          make_visible(event.a, event.b, now_);
          break;
      }
    }
    check_finished();
    finalize_stats();
    return std::move(result_);
  }

 private:
  /// What an event belongs to, for an error message.
  std::string event_cause(const Event& event) const {
    switch (event.kind) {
      case EventKind::pipe_done:
      case EventKind::transfer_head_done:
        return program_.describe(head_index(static_cast<int>(event.a)));
      case EventKind::transfer_done:
        return event.a == 1 ? "the HBM transfers" : "the L2 transfers";
      case EventKind::visible:
        return program_.describe(event.b);
    }
    return "an unknown event";
  }

  /// The earliest event by (time, creation order): the heap's top or a resource's completion.
  bool pop_next_event(Event& event) {
    const Event* next = events_.empty() ? nullptr : &events_.top();
    int next_resource = -1;
    for (int index = 0; index < 2; ++index) {
      const Resource& resource = resources_[index];
      if (resource.completion_pending && (next == nullptr || *next > resource.completion)) {
        next = &resource.completion;
        next_resource = index;
      }
    }
    if (next == nullptr) return false;
    event = *next;
    if (next_resource >= 0) {
      resources_[next_resource].completion_pending = false;
    } else {
      events_.pop();
    }
    return true;
  }

  // ---- validation -------------------------------------------------------------------------------
  void validate_program() const {
    for (std::uint32_t index = 0; index < program_.instrs.size(); ++index) {
      const PackedInstr& instr = program_.instrs[index];
      const auto fail = [&](const std::string& what) {
        throw SimError("malformed program: " + program_.describe(index) + ": " + what);
      };
      if (instr.op == Op::set_event || instr.op == Op::wait_event) {
        if (instr.flag >= event_ids_) {
          fail("event id " + std::to_string(instr.flag) + " >= " + std::to_string(event_ids_));
        }
        (void)local_pipe_index(instr.unit, instr.peer_pipe);  // throws for a foreign pipe
        if (instr.peer_pipe == instr.pipe) fail("an event needs two different pipes");
      }
      if (instr.op == Op::stage) {
        const std::uint8_t wait = cost_of(instr).wait_flag;
        if (wait != kNoFlag && wait >= flag_ids_) {
          fail("cross-core flag id " + std::to_string(wait) + " >= " + std::to_string(flag_ids_));
        }
      }
      if (program_.mirrored_aivs &&
          (instr.unit == 2 ||
           (instr.unit == 1 && instr.mode != 2 &&
            (instr.op == Op::set_cross || (instr.op == Op::stage && instr.flag != kNoFlag))))) {
        fail("with mirrored AIVs only AIV0 has instructions and its flags are mode 2");
      }
      const bool sets_flag = instr.op == Op::stage && instr.flag != kNoFlag;
      if (instr.op == Op::set_cross || instr.op == Op::wait_cross || sets_flag) {
        if (instr.flag >= flag_ids_) {
          fail("cross-core flag id " + std::to_string(instr.flag) +
               " >= " + std::to_string(flag_ids_));
        }
        if (instr.mode > 2) fail("cross-core mode must be 0, 1 or 2");
        if (instr.op != Op::wait_cross && instr.mode == 1 && instr.unit == 0) {
          fail("mode 1 synchronizes the two AIVs of a core; the AIC cannot set it");
        }
      }
      if ((instr.op == Op::gm_read || instr.op == Op::gm_write || instr.op == Op::stage) &&
          (cost_of(instr).bytes < 0 ||
           (cost_of(instr).bytes > 0 && !(cost_of(instr).port_rate > 0)))) {
        fail("a transfer needs bytes >= 0 and a positive port rate");
      }
      if (cost_of(instr).cycles < 0) fail("negative cycles");
      const auto check_buffer = [&](Buffer buffer) {
        if (buffer == Buffer::none) return;
        const bool cube_buffer = buffer != Buffer::ub;
        if (cube_buffer != (instr.unit == 0)) {
          fail(std::string("buffer ") + buffer_name(buffer) + " does not exist on " +
               unit_name(instr.unit));
        }
      };
      check_buffer(instr.alloc_buffer);
      check_buffer(instr.free_buffer);
    }
  }

  // ---- pipes
  // -------------------------------------------------------------------------------------
  const InstrCost& cost_of(const PackedInstr& instr) const { return program_.cost(instr); }

  /// An AIV0 instruction that stands for both AIVs (Program::mirrored_aivs).
  bool mirrored(const PackedInstr& instr) const {
    return program_.mirrored_aivs && instr.unit == 1;
  }

  const PackedInstr& head(int pipe) const {
    return program_.instrs[program_.queues[static_cast<std::size_t>(pipe)][pipes_[pipe].pos]];
  }
  std::uint32_t head_index(int pipe) const {
    return program_.queues[static_cast<std::size_t>(pipe)][pipes_[pipe].pos];
  }

  void try_issue(int pipe, double time) {
    PipeState& state = pipes_[static_cast<std::size_t>(pipe)];
    const auto& queue = program_.queues[static_cast<std::size_t>(pipe)];
    while (state.pos < queue.size()) {
      const std::uint32_t index = queue[state.pos];
      const PackedInstr& instr = program_.instrs[index];
      switch (instr.op) {
        case Op::wait_event:
        case Op::wait_cross: {
          const std::size_t counter_index = wait_counter(instr);
          Counter& counter = instr.op == Op::wait_event ? event_counters_[counter_index]
                                                        : flag_counters_[counter_index];
          if (!take_increment(pipe, index, instr.label, counter, time)) return;
          retire_instant(pipe, index, instr, time);
          continue;
        }
        case Op::set_event:
        case Op::set_cross: {
          apply_alloc(index, instr);
          const double effect = std::max(time, state.retire);
          if (instr.op == Op::set_event) {
            schedule(effect + hw_.intra_core_event_latency_cycles, EventKind::visible,
                     static_cast<std::uint32_t>(event_counter(instr.core, instr.unit, instr.pipe,
                                                              instr.peer_pipe, instr.flag)),
                     index);
          } else {
            set_cross(index, instr, effect);
          }
          if (options_.record_instructions) {
            result_.records[index] = InstrRecord{time, effect, time};
          }
          retire_instant(pipe, index, instr, time);
          continue;
        }
        case Op::compute:
          apply_alloc(index, instr);
          state.issue_time = time;
          schedule(time + cost_of(instr).cycles, EventKind::pipe_done,
                   static_cast<std::uint32_t>(pipe), 0);
          return;
        case Op::stage: {
          const InstrCost& cost = cost_of(instr);
          if (cost.wait_flag != kNoFlag &&
              !take_increment(pipe, index, cost.wait_label,
                              flag_counters_[flag_counter(instr.core, instr.unit, cost.wait_flag)],
                              time)) {
            return;
          }
          state.issue_time = time;
          schedule(time + cost.cycles, EventKind::transfer_head_done,
                   static_cast<std::uint32_t>(pipe), 0);
          return;
        }
        case Op::gm_read:
        case Op::gm_write:
          apply_alloc(index, instr);
          state.issue_time = time;
          schedule(time + cost_of(instr).cycles, EventKind::transfer_head_done,
                   static_cast<std::uint32_t>(pipe), 0);
          return;
      }
    }
  }

  /// A wait on `counter` by the head of `pipe`: consumes one visible increment and returns true,
  /// or blocks the pipe (it is retried when an increment becomes visible) and returns false.
  bool take_increment(int pipe, std::uint32_t index, std::uint32_t label, Counter& counter,
                      double time) {
    PipeState& state = pipes_[static_cast<std::size_t>(pipe)];
    if (counter.count() == 0) {
      if (counter.waiter >= 0 && counter.waiter != pipe) {
        throw SimError("two pipes wait on the same counter at once: " + program_.describe(index));
      }
      counter.waiter = pipe;
      if (!state.blocked) {
        state.blocked = true;
        state.block_start = time;
      }
      return false;
    }
    const auto [ready, source] = counter.visible[counter.head++];
    if (counter.head == counter.visible.size()) {
      counter.visible.clear();
      counter.head = 0;
    }
    counter.waiter = -1;
    const double start = state.blocked ? state.block_start : time;
    if (state.blocked) {
      add_blocked(pipe, label, time - state.block_start);
      state.blocked = false;
    }
    if (options_.record_instructions) {
      result_.records[index] = InstrRecord{start, time, time, ready, source};
      if (program_.instrs[index].op != Op::wait_event) {
        result_.cross_flows.emplace_back(source, index);
      }
    }
    return true;
  }

  void retire_instant(int pipe, std::uint32_t index, const PackedInstr& instr, double time) {
    apply_free(instr);
    PipeState& state = pipes_[static_cast<std::size_t>(pipe)];
    state.last_end = std::max(state.last_end, time);
    ++result_.pipes[static_cast<std::size_t>(pipe)].instructions;
    ++state.pos;
    (void)index;
  }

  void finish(int pipe, double time) {
    PipeState& state = pipes_[static_cast<std::size_t>(pipe)];
    const std::uint32_t index = head_index(pipe);
    const PackedInstr& instr = program_.instrs[index];
    PipeStats& stats = result_.pipes[static_cast<std::size_t>(pipe)];
    const double duration = time - state.issue_time;
    stats.busy += duration;
    double retire = time;
    if (instr.op == Op::gm_read || instr.op == Op::gm_write || instr.op == Op::stage) {
      const InstrCost& cost = cost_of(instr);
      stats.contention += std::max(0.0, duration - cost.ideal_cycles);
      (instr.level == MemLevel::hbm ? result_.hbm_bytes : result_.l2_bytes) +=
          cost.bytes * (mirrored(instr) ? 2 : 1);
      retire = time + cost.latency;
    }
    state.retire = std::max(state.retire, retire);
    if (options_.record_instructions) {
      result_.records[index] = InstrRecord{state.issue_time, retire, time};
    }
    apply_free(instr);
    state.last_end = time;
    ++stats.instructions;
    ++state.pos;
    // A folded stage's flag is set once its work has retired, as a set_cross after it would be.
    if (instr.op == Op::stage && instr.flag != kNoFlag) set_cross(index, instr, state.retire);
    try_issue(pipe, time);
  }

  void add_blocked(int pipe, std::uint32_t label, double cycles) {
    PipeStats& stats = result_.pipes[static_cast<std::size_t>(pipe)];
    stats.blocked += cycles;
    for (auto& [key, value] : stats.blocked_by_label) {
      if (key == label) {
        value += cycles;
        return;
      }
    }
    stats.blocked_by_label.emplace_back(label, cycles);
  }

  // ---- buffers
  // -----------------------------------------------------------------------------------
  std::size_t occupancy_index(const PackedInstr& instr, Buffer buffer) const {
    return (static_cast<std::size_t>(instr.core) * kUnitsPerCore + instr.unit) * kNumBuffers +
           static_cast<std::size_t>(buffer);
  }

  void apply_alloc(std::uint32_t index, const PackedInstr& instr) {
    if (instr.alloc_buffer == Buffer::none) return;
    const std::uint32_t bytes = cost_of(instr).alloc_bytes;
    if (bytes == 0) return;
    const std::size_t slot = occupancy_index(instr, instr.alloc_buffer);
    const double capacity = capacity_[static_cast<int>(instr.alloc_buffer)];
    const double in_use = occupancy_[slot];
    if (in_use + bytes > capacity) {
      throw SimError(std::string(buffer_name(instr.alloc_buffer)) + " overflow on core " +
                     std::to_string(instr.core) + " " + unit_name(instr.unit) + ": " +
                     program_.describe(index) + " needs " + std::to_string(bytes) + " B while " +
                     std::to_string(static_cast<long long>(in_use)) + " of " +
                     std::to_string(static_cast<long long>(capacity)) + " B are in use");
    }
    occupancy_[slot] = in_use + bytes;
    result_.buffer_peak[slot] = std::max(result_.buffer_peak[slot], occupancy_[slot]);
  }

  void apply_free(const PackedInstr& instr) {
    if (instr.free_buffer == Buffer::none) return;
    const std::uint32_t bytes = cost_of(instr).free_bytes;
    if (bytes == 0) return;
    double& in_use = occupancy_[occupancy_index(instr, instr.free_buffer)];
    in_use = std::max(0.0, in_use - bytes);
  }

  // ---- events and flags ------------------------------------------------------------------------
  void schedule(double time, EventKind kind, std::uint32_t a, std::uint32_t b) {
    events_.push(Event{time, seq_++, kind, a, b});
  }

  std::size_t event_counter(int core, int unit, Pipe src, Pipe dst, int id) const {
    return ((((static_cast<std::size_t>(core) * kUnitsPerCore + unit) * kNumPipeKinds +
              static_cast<std::size_t>(src)) *
                 kNumPipeKinds +
             static_cast<std::size_t>(dst)) *
                event_ids_ +
            id);
  }
  std::size_t flag_counter(int core, int unit, int id) const {
    return (static_cast<std::size_t>(core) * kUnitsPerCore + unit) * flag_ids_ + id;
  }
  std::size_t wait_counter(const PackedInstr& instr) const {
    return instr.op == Op::wait_event
               ? event_counter(instr.core, instr.unit, instr.peer_pipe, instr.pipe, instr.flag)
               : flag_counter(instr.core, instr.unit, instr.flag);
  }

  // Visibility events carry the counter in `a`; cross-core counters are offset past the events.
  void make_visible(std::uint32_t counter_index, std::uint32_t source, double time) {
    const bool cross = counter_index >= event_counters_.size();
    Counter& counter = cross ? flag_counters_[counter_index - event_counters_.size()]
                             : event_counters_[counter_index];
    counter.visible.emplace_back(time, source);
    if (cross && counter.count() > max_pending_) {
      throw SimError("cross-core flag overflow: more than " + std::to_string(max_pending_) +
                     " pending sets, the last by " + program_.describe(source));
    }
    if (counter.waiter >= 0) try_issue(counter.waiter, time);
  }

  void release_to(int core, int unit, int flag, std::uint32_t source, double time) {
    schedule(time + hw_.cross_core_flag_latency_cycles, EventKind::visible,
             static_cast<std::uint32_t>(event_counters_.size() + flag_counter(core, unit, flag)),
             source);
  }

  void check_pending(long long pending, std::uint32_t index) const {
    if (pending > static_cast<long long>(max_pending_)) {
      throw SimError("cross-core flag overflow: more than " + std::to_string(max_pending_) +
                     " pending sets, the last by " + program_.describe(index));
    }
  }

  void set_cross(std::uint32_t index, const PackedInstr& instr, double time) {
    const int core = instr.core;
    const int flag = instr.flag;
    if (instr.mode == 2) {
      if (instr.unit == 0) {
        // An AIC set releases one wait on each of its two AIVs (mirrored: AIV0 stands for both).
        release_to(core, 1, flag, index, time);
        if (!program_.mirrored_aivs) release_to(core, 2, flag, index, time);
        return;
      }
      // The AIC counter rises once both AIVs have set.
      const std::size_t base = static_cast<std::size_t>(core) * flag_ids_ + flag;
      long long& mine = mode2_up_sets_[base * 2 + (instr.unit - 1)];
      ++mine;
      if (mirrored(instr)) ++mode2_up_sets_[base * 2 + 1];
      check_pending(mine - mode2_up_released_[base], index);
      const long long both = std::min(mode2_up_sets_[base * 2], mode2_up_sets_[base * 2 + 1]);
      if (both > mode2_up_released_[base]) {
        ++mode2_up_released_[base];
        release_to(core, 0, flag, index, time);
      }
      return;
    }
    if (instr.mode == 1) {
      const std::size_t base = static_cast<std::size_t>(core) * flag_ids_ + flag;
      long long& mine = mode1_sets_[base * 2 + (instr.unit - 1)];
      ++mine;
      check_pending(mine - mode1_released_[base], index);
      const long long both = std::min(mode1_sets_[base * 2], mode1_sets_[base * 2 + 1]);
      if (both > mode1_released_[base]) {
        ++mode1_released_[base];
        release_to(core, 1, flag, index, time);
        release_to(core, 2, flag, index, time);
      }
      return;
    }
    // Mode 0: a barrier over every unit of the setter's kind (all AICs or all AIVs).
    const int kind = instr.unit == 0 ? 0 : 1;
    const int members = kind == 0 ? cores_ : 2 * cores_;
    const std::size_t base = (static_cast<std::size_t>(kind) * flag_ids_ + flag) * cores_ * 2;
    const int member = kind == 0 ? core : core * 2 + (instr.unit - 1);
    long long& mine = mode0_sets_[base + member];
    ++mine;
    long long& released = mode0_released_[static_cast<std::size_t>(kind) * flag_ids_ + flag];
    check_pending(mine - released, index);
    long long lowest = std::numeric_limits<long long>::max();
    for (int other = 0; other < members; ++other)
      lowest = std::min(lowest, mode0_sets_[base + other]);
    if (lowest > released) {
      ++released;
      for (int other_core = 0; other_core < cores_; ++other_core) {
        if (kind == 0) {
          release_to(other_core, 0, flag, index, time);
        } else {
          release_to(other_core, 1, flag, index, time);
          release_to(other_core, 2, flag, index, time);
        }
      }
    }
  }

  // ---- shared bandwidth ------------------------------------------------------------------------
  void start_flow(int pipe) {
    const PackedInstr& instr = head(pipe);
    const InstrCost& cost = cost_of(instr);
    if (cost.bytes <= 0) {
      finish(pipe, now_);
      return;
    }
    const int resource_index = instr.level == MemLevel::hbm ? 1 : 0;
    Resource& resource = resources_[resource_index];
    advance(resource);
    Transfer& transfer = transfers_[static_cast<std::size_t>(pipe)];
    transfer.resource = resource_index;
    transfer.bytes = cost.bytes;
    transfer.remaining = cost.bytes;
    transfer.cap = cost.port_rate;
    transfer.rate = 0;
    transfer.weight = mirrored(instr) ? 2 : 1;
    resource.active.push_back(pipe);
    resource.weight += static_cast<std::size_t>(transfer.weight);
    share(resource_index);
  }

  // The earliest completion on a resource: finish every transfer that is done by now (in pipe
  // order, for determinism), then share the bandwidth among the rest again.
  void complete_flows(int resource_index, std::uint32_t version) {
    Resource& resource = resources_[resource_index];
    if (version != resource.version) return;
    advance(resource);
    finished_.clear();
    for (const int pipe : resource.active) {
      const Transfer& transfer = transfers_[static_cast<std::size_t>(pipe)];
      // Relative slack for the rounding of remaining -= rate * elapsed; and a remainder whose
      // time is below the clock's resolution at now_ (now_ + t == now_) is done too, or its
      // completion event would come back at now_ forever.
      if (transfer.remaining <= 1e-9 * transfer.bytes + 1e-9 ||
          now_ + transfer.remaining / transfer.rate <= now_) {
        finished_.push_back(pipe);
      }
    }
    std::sort(finished_.begin(), finished_.end());
    for (const int pipe : finished_) {
      resource.active.erase(std::find(resource.active.begin(), resource.active.end(), pipe));
      transfers_[static_cast<std::size_t>(pipe)].resource = -1;
      resource.weight -=
          static_cast<std::size_t>(transfers_[static_cast<std::size_t>(pipe)].weight);
    }
    share(resource_index);
    for (const int pipe : finished_) finish(pipe, now_);
  }

  void advance(Resource& resource) {
    const double elapsed = now_ - resource.last_update;
    if (elapsed > 0) {
      for (const int pipe : resource.active) {
        Transfer& transfer = transfers_[static_cast<std::size_t>(pipe)];
        transfer.remaining = std::max(0.0, transfer.remaining - transfer.rate * elapsed);
      }
    }
    resource.last_update = now_;
  }

  // Max-min fair rates (water filling): transfers whose port cap is below the equal share keep
  // their cap, the rest split what is left equally. Caps take few distinct values, so the
  // rounds are few. One event is kept per resource: its earliest completion.
  void share(int resource_index) {
    Resource& resource = resources_[resource_index];
    ++resource.version;
    resource.completion_pending = false;
    const std::size_t count = resource.active.size();
    if (count == 0) return;
    // Resetting the rates is fused into the first round and filling the open ones into the search
    // for the earliest completion: two passes over the active transfers instead of four (this
    // runs at every transfer start and end), with the same operations in the same order, so the
    // rates are bit-identical to the plain rounds.
    // A transfer of weight w counts as w transfers of its cap (w = 1 but for mirrored AIVs).
    double left = resource.capacity;
    std::size_t open = resource.weight;
    double equal = left / static_cast<double>(open);
    std::size_t capped = 0;
    for (const int pipe : resource.active) {
      Transfer& transfer = transfers_[static_cast<std::size_t>(pipe)];
      transfer.rate = 0;
      if (transfer.cap <= equal) {
        transfer.rate = transfer.cap;
        left -= transfer.cap * transfer.weight;
        capped += static_cast<std::size_t>(transfer.weight);
      }
    }
    while (capped > 0) {
      open -= capped;
      if (open == 0) break;
      equal = left / static_cast<double>(open);
      capped = 0;
      for (const int pipe : resource.active) {
        Transfer& transfer = transfers_[static_cast<std::size_t>(pipe)];
        if (transfer.rate == 0 && transfer.cap <= equal) {
          transfer.rate = transfer.cap;
          left -= transfer.cap * transfer.weight;
          capped += static_cast<std::size_t>(transfer.weight);
        }
      }
    }
    const bool fill_open = capped == 0;  // the last round capped nothing: the rest share `equal`
    // The open transfers all move at `equal`, so the least remaining of them finishes first:
    // one division for all of them gives the same double (rounding is monotonic).
    double earliest = std::numeric_limits<double>::infinity();
    double least_open = std::numeric_limits<double>::infinity();
    for (const int pipe : resource.active) {
      Transfer& transfer = transfers_[static_cast<std::size_t>(pipe)];
      if (fill_open && transfer.rate == 0) {
        transfer.rate = equal;
        least_open = std::min(least_open, transfer.remaining);
      } else {
        earliest = std::min(earliest, transfer.remaining / transfer.rate);
      }
    }
    if (least_open != std::numeric_limits<double>::infinity()) {
      earliest = std::min(earliest, least_open / equal);
    }
    // Numbered from the same sequence as the heap's events, so ties resolve as before.
    resource.completion = Event{now_ + earliest, seq_++, EventKind::transfer_done,
                                static_cast<std::uint32_t>(resource_index), resource.version};
    resource.completion_pending = true;
  }

  // ---- end of run
  // --------------------------------------------------------------------------------
  std::string wait_target(const PackedInstr& instr) const {
    if (instr.op == Op::wait_event) {
      return std::string("event ") + pipe_name(instr.peer_pipe) + "->" + pipe_name(instr.pipe) +
             " id " + std::to_string(instr.flag);
    }
    const std::uint8_t flag = instr.op == Op::stage ? cost_of(instr).wait_flag : instr.flag;
    std::string name = "cross-core flag " + std::to_string(flag);
    if (flag < program_.cross_flag_names.size() && !program_.cross_flag_names[flag].empty()) {
      name += " (" + program_.cross_flag_names[flag] + ")";
    }
    return name;
  }

  void check_finished() const {
    int stuck = 0;
    int first = -1;
    for (std::size_t pipe = 0; pipe < pipes_.size(); ++pipe) {
      if (pipes_[pipe].pos < program_.queues[pipe].size()) {
        if (first < 0) first = static_cast<int>(pipe);
        ++stuck;
      }
    }
    if (first < 0) return;
    const std::uint32_t index = head_index(first);
    const PackedInstr& instr = program_.instrs[index];
    throw SimError("deadlock: core " + std::to_string(instr.core) + " " + unit_name(instr.unit) +
                   " pipe " + pipe_name(instr.pipe) + " waits forever on " + wait_target(instr) +
                   " at " + program_.describe(index) + " (" + std::to_string(stuck) +
                   " pipe(s) blocked, no pending set can release them)");
  }

  void finalize_stats() {
    double makespan = 0;
    for (const PipeState& state : pipes_) {
      makespan = std::max({makespan, state.last_end, state.retire});
    }
    result_.makespan = makespan;
    std::uint64_t total = 0;
    for (std::size_t pipe = 0; pipe < pipes_.size(); ++pipe) {
      PipeStats& stats = result_.pipes[pipe];
      stats.tail = makespan - pipes_[pipe].last_end;
      total += stats.instructions;
    }
    result_.instructions = total;
    if (program_.mirrored_aivs) {
      for (int core = 0; core < cores_; ++core) {
        for (const Pipe pipe : {Pipe::mte2, Pipe::v, Pipe::mte3}) {
          const auto global = [&](int unit) {
            return static_cast<std::size_t>(core) * kPipesPerCore +
                   static_cast<std::size_t>(local_pipe_index(unit, pipe));
          };
          result_.pipes[global(2)] = result_.pipes[global(1)];
        }
      }
    }
  }

  const Program& program_;
  const HwParams& hw_;
  const EngineOptions options_;
  int cores_ = 0;
  int event_ids_ = 8;
  int flag_ids_ = 11;
  std::size_t max_pending_ = 16;
  double now_ = 0;
  std::uint64_t seq_ = 0;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::vector<PipeState> pipes_;
  std::vector<Transfer> transfers_;
  Resource resources_[2];
  std::vector<int> finished_;
  std::vector<Counter> event_counters_;
  std::vector<Counter> flag_counters_;
  std::vector<long long> mode2_up_sets_, mode2_up_released_;
  std::vector<long long> mode1_sets_, mode1_released_;
  std::vector<long long> mode0_sets_, mode0_released_;
  std::vector<double> occupancy_;
  double capacity_[kNumBuffers] = {};
  SimResult result_;
};

}  // namespace

double buffer_capacity(const HwParams& hw, Buffer buffer) {
  switch (buffer) {
    case Buffer::l1:
      return hw.l1_bytes;
    case Buffer::l0a:
      return hw.l0a_bytes;
    case Buffer::l0b:
      return hw.l0b_bytes;
    case Buffer::l0c:
      return hw.l0c_bytes;
    case Buffer::ub:
      return hw.ub_bytes;
    case Buffer::none:
      break;
  }
  return 0;
}

SimResult simulate(const Program& program, const HwParams& hw, const EngineOptions& options) {
  validate(hw);
  Engine engine(program, hw, options);
  return engine.run();
}

}  // namespace ditops::sim
