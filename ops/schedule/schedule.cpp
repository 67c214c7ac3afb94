#include "ops/schedule/schedule.hpp"

#include <algorithm>
#include <stdexcept>

namespace ditops::schedule {
namespace {

StageInstance instance(Stage stage, int block, int chunk) {
  const int group = block / chunk;
  return StageInstance{stage, block, group, group % kNumSlots, block % chunk};
}

void append_group(std::vector<StageInstance>& order, Stage stage, int group, int num_blocks,
                  int chunk) {
  for (int block = group * chunk; block < num_blocks && block < (group + 1) * chunk; ++block) {
    order.push_back(instance(stage, block, chunk));
  }
}

}  // namespace

bool valid_chunk(int chunk) noexcept { return chunk == 1 || chunk == 2 || chunk == 4; }

Engine engine_of(Stage stage) noexcept {
  return stage == Stage::qk || stage == Stage::pv ? Engine::cube : Engine::vector;
}

const char* stage_name(Stage stage) noexcept {
  switch (stage) {
    case Stage::qk:
      return "QK";
    case Stage::sm:
      return "SM";
    case Stage::pv:
      return "PV";
    case Stage::up:
      return "UP";
  }
  return "?";
}

Schedule make_schedule(int num_blocks, int chunk, const ScheduleOptions& options) {
  if (!valid_chunk(chunk)) {
    throw std::invalid_argument("make_schedule: chunk must be 1, 2 or 4 (got " +
                                std::to_string(chunk) + ")");
  }
  if (num_blocks < 0) {
    throw std::invalid_argument("make_schedule: num_blocks must be >= 0 (got " +
                                std::to_string(num_blocks) + ")");
  }
  Schedule schedule;
  schedule.num_blocks = num_blocks;
  schedule.chunk = chunk;
  auto& cube = schedule.cube;
  cube.reserve(2 * static_cast<std::size_t>(num_blocks));
  const int num_groups = (num_blocks + chunk - 1) / chunk;
  if (chunk == 1) {
    // Preload depth 1: QK(b+1) is issued before PV(b), so SM(b+1) can run while PV(b) waits.
    if (num_blocks > 0) cube.push_back(instance(Stage::qk, 0, 1));
    for (int block = 0; block < num_blocks; ++block) {
      if (block + 1 < num_blocks) cube.push_back(instance(Stage::qk, block + 1, 1));
      cube.push_back(instance(Stage::pv, block, 1));
    }
  } else {
    for (int group = 0; group < num_groups; ++group) {
      append_group(cube, Stage::qk, group, num_blocks, chunk);
      append_group(cube, Stage::pv, group, num_blocks, chunk);
    }
  }
  schedule.vector.reserve(cube.size());
  for (const StageInstance& item : cube) {
    StageInstance mirrored = item;
    mirrored.stage = vector_stage_for(item.stage);
    schedule.vector.push_back(mirrored);
  }
  if (options.interleave_cube && chunk > 1 && num_groups > 1) {
    // QK(next group, i) goes right before PV(group, i). The vector side mirrors this at group
    // granularity: the SMs of the next group run before the UPs of this group (the UPs of one
    // group stay adjacent and share one pass over O). With the plain vector order the SMs of the
    // next group waited behind this group's UP pass, so the next group's PVs, now issued right
    // after this group's, waited for that whole pass and the interleaving lost time.
    cube.clear();
    append_group(cube, Stage::qk, 0, num_blocks, chunk);
    auto& vector = schedule.vector;
    vector.clear();
    append_group(vector, Stage::sm, 0, num_blocks, chunk);
    for (int group = 0; group < num_groups; ++group) {
      append_group(vector, Stage::sm, group + 1, num_blocks, chunk);
      append_group(vector, Stage::up, group, num_blocks, chunk);
    }
    for (int group = 0; group < num_groups; ++group) {
      const int first = group * chunk;
      const int last = std::min(num_blocks, first + chunk);
      for (int block = first; block < last; ++block) {
        const int ahead = block + chunk;
        if (ahead < num_blocks) cube.push_back(instance(Stage::qk, ahead, chunk));
        cube.push_back(instance(Stage::pv, block, chunk));
      }
    }
  }
  return schedule;
}

std::string to_string(const std::vector<StageInstance>& order) {
  std::string text;
  for (const StageInstance& item : order) {
    if (!text.empty()) text += ' ';
    text += stage_name(item.stage);
    text += std::to_string(item.block);
  }
  return text;
}

}  // namespace ditops::schedule
