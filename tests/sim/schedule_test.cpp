// Stage orders of ops/schedule against sim/README.md's pipelines, and the ping-pong safety
// argument: in-order queues plus the three hand-off flags must order every slot reuse.

#include "ops/schedule/schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "ops/schedule/split_plan.hpp"

namespace ditops::schedule {
namespace {

TEST(Schedule, Chunk1IsPreloadDepthOne) {
  // sim/README.md: QK QK PV QK PV QK PV PV / SM SM UP SM UP SM UP UP
  const Schedule s = make_schedule(4, 1);
  EXPECT_EQ(to_string(s.cube), "QK0 QK1 PV0 QK2 PV1 QK3 PV2 PV3");
  EXPECT_EQ(to_string(s.vector), "SM0 SM1 UP0 SM2 UP1 SM3 UP2 UP3");
}

TEST(Schedule, Chunk2RunsGroupsOfTwo) {
  const Schedule s = make_schedule(4, 2);
  EXPECT_EQ(to_string(s.cube), "QK0 QK1 PV0 PV1 QK2 QK3 PV2 PV3");
  EXPECT_EQ(to_string(s.vector), "SM0 SM1 UP0 UP1 SM2 SM3 UP2 UP3");
}

TEST(Schedule, Chunk4RunsGroupsOfFour) {
  const Schedule s = make_schedule(8, 4);
  EXPECT_EQ(to_string(s.cube), "QK0 QK1 QK2 QK3 PV0 PV1 PV2 PV3 QK4 QK5 QK6 QK7 PV4 PV5 PV6 PV7");
  EXPECT_EQ(to_string(s.vector), "SM0 SM1 SM2 SM3 UP0 UP1 UP2 UP3 SM4 SM5 SM6 SM7 UP4 UP5 UP6 UP7");
}

TEST(Schedule, PartialLastGroupAndTinyInputs) {
  EXPECT_EQ(to_string(make_schedule(3, 2).cube), "QK0 QK1 PV0 PV1 QK2 PV2");
  EXPECT_EQ(to_string(make_schedule(1, 1).cube), "QK0 PV0");
  EXPECT_EQ(to_string(make_schedule(1, 4).vector), "SM0 UP0");
  EXPECT_TRUE(make_schedule(0, 2).cube.empty());
}

// The int8 attention kernel runs row groups with fewer blocks than the longest sequence on
// one order: the order for n blocks must be the longer order without its blocks >= n.
TEST(Schedule, FewerBlocksAreTheLongerOrderFiltered) {
  for (int chunk : {1, 2, 4}) {
    const Schedule longest = make_schedule(13, chunk);
    for (int n = 0; n <= 13; ++n) {
      std::vector<StageInstance> filtered;
      for (const StageInstance& item : longest.cube) {
        if (item.block < n) filtered.push_back(item);
      }
      const Schedule own = make_schedule(n, chunk);
      ASSERT_EQ(to_string(filtered), to_string(own.cube)) << "chunk " << chunk << " n " << n;
      for (std::size_t i = 0; i < filtered.size(); ++i) {
        EXPECT_EQ(filtered[i].slot, own.cube[i].slot);
        EXPECT_EQ(filtered[i].sub, own.cube[i].sub);
      }
    }
  }
}

// Model change: the vector side used to keep the plain group order (SM0-3 UP0-3 SM4-7 UP4-7),
// which made the next group's PVs wait for this group's whole UP pass.
TEST(Schedule, InterleavedCubeRunsTheVectorSmsOneGroupAhead) {
  ScheduleOptions options;
  options.interleave_cube = true;
  const Schedule s = make_schedule(8, 4, options);
  EXPECT_EQ(to_string(s.cube), "QK0 QK1 QK2 QK3 QK4 PV0 QK5 PV1 QK6 PV2 QK7 PV3 PV4 PV5 PV6 PV7");
  EXPECT_EQ(to_string(s.vector), "SM0 SM1 SM2 SM3 SM4 SM5 SM6 SM7 UP0 UP1 UP2 UP3 UP4 UP5 UP6 UP7");
  EXPECT_EQ(to_string(make_schedule(9, 2, options).vector),
            "SM0 SM1 SM2 SM3 UP0 UP1 SM4 SM5 UP2 UP3 SM6 SM7 UP4 UP5 SM8 UP6 UP7 UP8");
  // Chunk 1 is already interleaved: the switch changes nothing.
  EXPECT_EQ(to_string(make_schedule(4, 1, options).cube), to_string(make_schedule(4, 1).cube));
}

TEST(Schedule, SlotsAndGroups) {
  const Schedule s = make_schedule(9, 4);
  for (const StageInstance& item : s.cube) {
    EXPECT_EQ(item.group, item.block / 4);
    EXPECT_EQ(item.slot, item.group % kNumSlots);
    EXPECT_EQ(item.sub, item.block % 4);
  }
}

TEST(Schedule, RejectsBadArguments) {
  EXPECT_THROW(make_schedule(4, 3), std::invalid_argument);
  EXPECT_THROW(make_schedule(4, 0), std::invalid_argument);
  EXPECT_THROW(make_schedule(-1, 2), std::invalid_argument);
}

// Happens-before over the two in-order queues plus the hand-offs QK(b) -> SM(b) (QK_READY),
// SM(b) -> PV(b) (SOFTMAX_READY) and PV(b) -> UP(b) (UPDATE_READY). Slot reuse is safe when the
// consumer of a slot's previous contents happens before the producer that overwrites it.
class HappensBefore {
 public:
  explicit HappensBefore(const Schedule& s) {
    const auto add_queue = [&](const std::vector<StageInstance>& queue) {
      for (std::size_t i = 0; i < queue.size(); ++i) {
        const Node node{queue[i].stage, queue[i].block};
        index_[node] = static_cast<int>(nodes_.size());
        nodes_.push_back(node);
        if (i > 0) edges_.emplace_back(Node{queue[i - 1].stage, queue[i - 1].block}, node);
      }
    };
    add_queue(s.cube);
    add_queue(s.vector);
    for (int b = 0; b < s.num_blocks; ++b) {
      edges_.emplace_back(Node{Stage::qk, b}, Node{Stage::sm, b});
      edges_.emplace_back(Node{Stage::sm, b}, Node{Stage::pv, b});
      edges_.emplace_back(Node{Stage::pv, b}, Node{Stage::up, b});
    }
    reach_.assign(nodes_.size(), std::vector<bool>(nodes_.size(), false));
    for (const auto& [from, to] : edges_) reach_[index_.at(from)][index_.at(to)] = true;
    const std::size_t n = nodes_.size();
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t i = 0; i < n; ++i) {
        if (!reach_[i][k]) continue;
        for (std::size_t j = 0; j < n; ++j) {
          if (reach_[k][j]) reach_[i][j] = true;
        }
      }
    }
  }
  bool before(Stage a, int block_a, Stage b, int block_b) const {
    return reach_[index_.at({a, block_a})][index_.at({b, block_b})];
  }
  bool acyclic() const {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (reach_[i][i]) return false;
    }
    return true;
  }

 private:
  using Node = std::pair<Stage, int>;
  std::vector<Node> nodes_;
  std::map<Node, int> index_;
  std::vector<std::pair<Node, Node>> edges_;
  std::vector<std::vector<bool>> reach_;
};

class SlotReuse : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(SlotReuse, ProducerNeverOverwritesUnreadSlot) {
  const auto [num_blocks, chunk, interleave] = GetParam();
  ScheduleOptions options;
  options.interleave_cube = interleave;
  const Schedule s = make_schedule(num_blocks, chunk, options);
  const HappensBefore order(s);
  ASSERT_TRUE(order.acyclic()) << "the schedule deadlocks";
  // The previous user of block b's (slot, sub) is block b - kNumSlots * chunk.
  const int distance = kNumSlots * chunk;
  for (int b = distance; b < num_blocks; ++b) {
    const int prev = b - distance;
    EXPECT_TRUE(order.before(Stage::sm, prev, Stage::qk, b))
        << "S slot: QK" << b << " vs SM" << prev;
    EXPECT_TRUE(order.before(Stage::pv, prev, Stage::sm, b))
        << "P slot: SM" << b << " vs PV" << prev;
    EXPECT_TRUE(order.before(Stage::up, prev, Stage::pv, b))
        << "O_tmp slot: PV" << b << " vs UP" << prev;
  }
  // And a slot is not reused any sooner: blocks closer than `distance` use different slots.
  for (const StageInstance& a : s.cube) {
    for (const StageInstance& b : s.cube) {
      if (a.block != b.block && std::abs(a.block - b.block) < distance) {
        EXPECT_FALSE(a.slot == b.slot && a.sub == b.sub) << a.block << " " << b.block;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllChunks, SlotReuse,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 8, 13, 17),
                                            ::testing::Values(1, 2, 4), ::testing::Bool()));

}  // namespace
}  // namespace ditops::schedule

// ---- the split plan shared by the CPU drivers and the simulator's planner ----------------------

TEST(SplitPlan, SplitsOnlyWhenItemsLeaveWorkersIdle) {
  using ditops::schedule::kv_splits;
  EXPECT_EQ(kv_splits(4, 4, 100, 4), 1);  // enough items
  EXPECT_EQ(kv_splits(9, 4, 100, 4), 1);
  EXPECT_EQ(kv_splits(1, 4, 100, 4), 4);   // one item, four workers
  EXPECT_EQ(kv_splits(3, 4, 100, 4), 2);   // ceil(4 / 3)
  EXPECT_EQ(kv_splits(1, 24, 40, 4), 10);  // capped: 4 blocks per split at least
  EXPECT_EQ(kv_splits(1, 4, 7, 4), 1);     // too short to split
  EXPECT_EQ(kv_splits(0, 4, 100, 4), 1);   // nothing to split
  EXPECT_EQ(kv_splits(1, 4, 100, 0), 4);   // a zero minimum counts as 1
}

TEST(SplitPlan, BlockRangesCoverEveryBlockOnceAndDifferByAtMostOne) {
  for (std::int64_t blocks : {1, 2, 7, 64, 65}) {
    for (std::int64_t splits = 1; splits <= blocks && splits <= 9; ++splits) {
      std::int64_t next = 0, smallest = blocks, largest = 0;
      for (std::int64_t s = 0; s < splits; ++s) {
        const auto range = ditops::schedule::split_blocks(blocks, splits, s);
        EXPECT_EQ(range.begin, next) << blocks << " / " << splits;
        smallest = std::min(smallest, range.end - range.begin);
        largest = std::max(largest, range.end - range.begin);
        next = range.end;
      }
      EXPECT_EQ(next, blocks);
      EXPECT_GE(smallest, 1);
      EXPECT_LE(largest - smallest, 1);
    }
  }
}

TEST(SplitPlan, LongestFirstKeepsTiesInIndexOrder) {
  const std::vector<double> cost = {1., 5., 3., 5., 0.};
  EXPECT_EQ(ditops::schedule::longest_first(cost), (std::vector<std::int64_t>{1, 3, 2, 0, 4}));
  EXPECT_TRUE(ditops::schedule::longest_first({}).empty());
}
