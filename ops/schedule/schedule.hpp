#pragma once
// The QK-SM-PV-UP stage schedule of the int8 attention pipeline, as plain data.
//
// One schedule drives both the CPU int8 kernel and the Ascend simulator, so it carries no
// simulator or kernel types: an ordered list of stage instances for the cube side (QK, PV) and
// one for the vector side (SM, UP), with the ping-pong workspace slot each instance touches.
//
// Stages per KV block b: QK(b) writes S(b); SM(b) reads S(b) and writes P(b); PV(b) reads P(b)
// and writes O_tmp(b); UP(b) reads O_tmp(b). `chunk` (1, 2 or 4) sets how many QK blocks run
// ahead of their PV (sim/README.md, "Pipelines by chunk size"):
//   chunk=1  QK0 QK1 PV0 QK2 PV1 ... PVn-1          (preload depth 1, the open ATB kernel)
//   chunk=2  QK0 QK1 | PV0 PV1 | QK2 QK3 | PV2 PV3  (groups of 2)
//   chunk=4  QK0..QK3 | PV0..PV3 | QK4..QK7 | ...   (groups of 4)
// The vector side mirrors the cube side with QK -> SM and PV -> UP (with interleave_cube it
// runs the SMs one group ahead of the UPs: SM0..3 SM4..7 UP0..3 SM8..11 UP4..7 ...).

#include <cstdint>
#include <string>
#include <vector>

namespace ditops::schedule {

enum class Stage : std::uint8_t { qk, sm, pv, up };

/// The engine a stage runs on: the cube (matrix) unit or the vector unit.
enum class Engine : std::uint8_t { cube, vector };

inline constexpr int kNumSlots = 2;  // S, P and O_tmp workspaces are ping-pong buffers

/// One stage for one KV block.
struct StageInstance {
  Stage stage;
  int block;  // KV block index within the task, 0-based
  int group;  // block / chunk: blocks of one group share one workspace slot
  int slot;   // ping-pong slot, group % kNumSlots
  int sub;    // position of the block inside its slot, block % chunk
};

struct ScheduleOptions {
  // Cube-bubble reduction (sim/README.md): from the second group on, the QKs of the next group
  // are interleaved with the PVs of the current one (QK4 PV0 QK5 PV1 ...), so the cube has QK
  // work while it waits for SM, and the vector side runs the next group's SMs before this
  // group's UPs. Only meaningful for chunk >= 2.
  bool interleave_cube = false;
};

struct Schedule {
  int num_blocks = 0;
  int chunk = 1;
  std::vector<StageInstance> cube;    // QK and PV in issue order
  std::vector<StageInstance> vector;  // SM and UP in issue order
};

/// True for the chunk sizes the pipeline supports (1, 2, 4).
bool valid_chunk(int chunk) noexcept;

/// The stage order for `num_blocks` KV blocks (>= 0) at `chunk` (1, 2 or 4). Throws
/// std::invalid_argument for other values.
Schedule make_schedule(int num_blocks, int chunk, const ScheduleOptions& options = {});

/// The vector stage that mirrors a cube stage: QK -> SM, PV -> UP.
constexpr Stage vector_stage_for(Stage cube_stage) noexcept {
  return cube_stage == Stage::qk ? Stage::sm : Stage::up;
}
Engine engine_of(Stage stage) noexcept;
const char* stage_name(Stage stage) noexcept;  // "QK", "SM", "PV", "UP"

/// The S / P / O_tmp buffer of an instance among the 2 * chunk a kernel keeps: its ping-pong
/// slot, then its position inside the slot.
constexpr int buffer_index(const StageInstance& instance, int chunk) noexcept {
  return instance.slot * chunk + instance.sub;
}

/// Runs a cube order (Schedule::cube) the way a CPU kernel executes it on one core: each run of
/// equal cube stages, then that run's vector mirrors (a run of QKs, then their SMs; a run of
/// PVs, then their UPs). This is the simulator's stage order with the cube and vector sides
/// taking turns. Instances of blocks >= `blocks` are skipped: the order for fewer blocks is
/// the order for more without the later blocks (tested in the schedule tests), so one order
/// serves every task of a call. run(instance) sees instance.stage in {qk, sm, pv, up}.
template <class Run>
void walk_stages(const StageInstance* order, std::int64_t size, std::int64_t blocks,
                 const Run& run) {
  const auto next_kept = [&](std::int64_t i) {
    while (i < size && order[i].block >= blocks) ++i;
    return i;
  };
  std::int64_t run_begin = next_kept(0);
  while (run_begin < size) {
    const Stage cube_stage = order[run_begin].stage;
    std::int64_t run_end = run_begin;
    for (; run_end < size && order[run_end].stage == cube_stage; run_end = next_kept(run_end + 1)) {
      run(order[run_end]);
    }
    for (std::int64_t i = run_begin; i < run_end; i = next_kept(i + 1)) {
      StageInstance mirror = order[i];
      mirror.stage = vector_stage_for(cube_stage);
      run(mirror);
    }
    run_begin = run_end;
  }
}

/// "QK0 QK1 PV0 ..." for logs and tests.
std::string to_string(const std::vector<StageInstance>& order);

}  // namespace ditops::schedule
