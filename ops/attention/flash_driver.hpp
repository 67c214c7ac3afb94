#pragma once
// The flash driver: runs a validated problem's tasks on the thread team with the flash (or
// int8) kernel of the active ISA level. Dense and varlen calls state their tasks through
// run_flash (a task plan, split over the keys where too few); the block-sparse families state
// their own and call run_flash_tasks.

#include <vector>

#include "ops/attention/attention_kernel.hpp"

namespace ditops::attention {

/// Runs `tasks` (with `cost`, one estimate per task, for the order) on the thread team with the
/// flash kernel of the active ISA: packs K and V once (in p.k_order when set), hands the tasks
/// out most expensive first, grouped by KV head. With int8_chunk > 0, prepares the int8
/// operands and runs the int8 kernel instead (it picks its own row groups).
void run_flash_tasks(const FlashProblem& p, const FlashTiles& tiles,
                     const std::vector<FlashTask>& tasks, const std::vector<double>& cost,
                     int threads, int int8_chunk = 0);

/// Runs a dense or varlen problem with the flash kernel (or with int8_chunk > 0 the int8
/// kernel): tasks of ~96 query rows per (sequence, KV head), split over the KV range when too
/// few to occupy the threads, the splits merged by their LSE.
void run_flash(const FlashProblem& p, const FlashTiles& tiles, int threads, int int8_chunk = 0);

}  // namespace ditops::attention
