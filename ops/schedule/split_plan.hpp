#pragma once
// How work items (query blocks, head groups, sequences) are split along their KV blocks and
// ordered for the workers: the plan the CPU attention and MLA drivers and the simulator's
// planner share, so a rule changes in one place. Plain data, no kernel or simulator types.

#include <cstdint>
#include <span>
#include <vector>

namespace ditops::schedule {

/// KV splits per item when `items` items would leave workers idle: none (1) when items reach
/// `target_items`, else ceil(target_items / items), capped so that every split keeps at least
/// `min_blocks_per_split` of the `blocks` KV blocks (splitting costs a partial and a merge).
std::int64_t kv_splits(std::int64_t items, std::int64_t target_items, std::int64_t blocks,
                       std::int64_t min_blocks_per_split) noexcept;

/// KV blocks [begin, end) of split `split` of `splits` over `blocks` blocks: equal shares, the
/// remainder spread (blocks * s / splits), so no split is empty while splits <= blocks.
struct BlockRange {
  std::int64_t begin = 0, end = 0;
};
BlockRange split_blocks(std::int64_t blocks, std::int64_t splits, std::int64_t split) noexcept;

/// Indices of `cost`, most expensive first, ties in index order: the hand-out order that
/// leaves short items for the tail.
std::vector<std::int64_t> longest_first(std::span<const double> cost);

}  // namespace ditops::schedule
