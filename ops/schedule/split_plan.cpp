#include "ops/schedule/split_plan.hpp"

#include <algorithm>
#include <numeric>

namespace ditops::schedule {

std::int64_t kv_splits(std::int64_t items, std::int64_t target_items, std::int64_t blocks,
                       std::int64_t min_blocks_per_split) noexcept {
  if (items <= 0 || items >= target_items) return 1;
  const std::int64_t wanted = (target_items + items - 1) / items;
  const std::int64_t allowed = blocks / std::max<std::int64_t>(min_blocks_per_split, 1);
  return std::max<std::int64_t>(1, std::min(wanted, allowed));
}

BlockRange split_blocks(std::int64_t blocks, std::int64_t splits, std::int64_t split) noexcept {
  return {blocks * split / splits, blocks * (split + 1) / splits};
}

std::vector<std::int64_t> longest_first(std::span<const double> cost) {
  std::vector<std::int64_t> order(cost.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int64_t a, std::int64_t b) { return cost[a] > cost[b]; });
  return order;
}

}  // namespace ditops::schedule
