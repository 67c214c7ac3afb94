#include "ops/attention/flash_driver.hpp"

#include <algorithm>
#include <numeric>
#include <optional>

#include "ops/attention/amx_flash.hpp"
#include "ops/attention/int8.hpp"
#include "ops/attention/kernels.hpp"
#include "ops/attention/packing.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"
#include "ops/schedule/split_plan.hpp"

namespace ditops::attention {
namespace {

template <class Arch>
constexpr AttentionKernels attention_kernels_of() {
  return {&flash_task<Arch>,         &flash_merge_splits<Arch>,   &widen_row<Arch>,
          &transpose_k_panel<Arch>,  &merge_attention_rows<Arch>, &int8_quantize_kv_head<Arch>,
          &int8_attention_task<Arch>};
}

}  // namespace

const AttentionKernels& attention_kernels() noexcept {
  static constexpr core::IsaTable<AttentionKernels> table =
      DITOPS_KERNEL_TABLE(attention_kernels_of);
  return table.get();
}

namespace {

/// The task kernel of a run: flash_bf16's on AMX-BF16 tiles (amx_flash.cpp) where the CPU, the
/// OS and DITOPS_ISA allow them (bf16_dot is set only where the avx512+bf16+vnni variant runs,
/// whose kernel that is), else the variant's. The one place the AMX kernel is chosen.
decltype(AttentionKernels::flash_task) flash_task_kernel(
    [[maybe_unused]] const FlashTiles& tiles) {  // unread where no AMX kernel is compiled
#if defined(DITOPS_AMX_COMPILED) && DITOPS_AMX_COMPILED
  if (tiles.bf16_dot && tiles.k_layout == KLayout::packed &&
      core::amx_usable(core::AmxUnit::bf16)) {
    return &amx::flash_task_amx<avx512_bf16>;
  }
#endif
  return attention_kernels().flash_task;
}

/// The order the team takes tasks in: the tasks of one (sequence, KV head) together, most
/// expensive first, and those heads by their most expensive task. Consecutive tasks re-read the
/// head's packed K/V from L2/L3 (a plain cost order, under causal masking, cycles through every
/// head's K/V between two uses and measured 1.2x slower), and the tail of the schedule is short
/// tasks.
std::vector<std::int64_t> task_order(const FlashProblem& p, const std::vector<FlashTask>& tasks,
                                     const std::vector<double>& cost) {
  std::vector<double> head_cost(p.batch * p.kv_heads, 0.);
  auto head_of = [&](std::int64_t t) { return tasks[t].seq * p.kv_heads + tasks[t].kv_head; };
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    head_cost[head_of(t)] = std::max(head_cost[head_of(t)], cost[t]);
  }
  std::vector<std::int64_t> order(tasks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    const std::int64_t head_a = head_of(a), head_b = head_of(b);
    if (head_a != head_b) {
      if (head_cost[head_a] != head_cost[head_b]) return head_cost[head_a] > head_cost[head_b];
      return head_a < head_b;
    }
    return cost[a] > cost[b];
  });
  return order;
}

/// The tasks of a dense or varlen problem, and where split-KV tasks leave their partials.
struct TaskPlan {
  std::vector<FlashTask> tasks;  ///< what the team runs
  std::vector<double> cost;
  /// Split-KV only (splits > 1): the unsplit tasks whose rows the merge writes, their first
  /// row in the partials, and the partials ([task rows][splits] blocks of rows).
  std::int64_t splits = 1;
  std::vector<FlashTask> whole;
  std::vector<std::int64_t> first_row;
  core::AlignedArray<float> partial_out, partial_lse;
};

/// Tasks: (sequence, KV head, block of query positions). ~96 rows (16 micro-tiles of 6) per
/// task amortize the row-group set-up; GQA heads count as rows of the same task.
void add_row_tasks(const FlashProblem& p, TaskPlan& plan) {
  const std::int64_t group = p.heads / p.kv_heads;
  const std::int64_t q_block = std::max<std::int64_t>(1, 96 / group);
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    const Sequence s = sequence_of(p, seq);
    for (std::int64_t head = 0; head < p.kv_heads; ++head) {
      for (std::int64_t q0 = 0; q0 < s.q_len; q0 += q_block) {
        FlashTask task;
        task.seq = seq;
        task.kv_head = head;
        task.q_begin = q0;
        task.q_end = std::min(s.q_len, q0 + q_block);
        task.kv_end = s.kv_len;
        // Keys the last row of the block sees: with causal masking the later blocks cost more.
        std::int64_t keys = s.kv_len;
        if (p.causal) keys = std::clamp<std::int64_t>(task.q_end + s.kv_len - s.q_len, 0, s.kv_len);
        plan.tasks.push_back(task);
        plan.cost.push_back(static_cast<double>(task.q_end - q0) * group * (keys + kKvBlock));
      }
    }
  }
}

/// Replaces each task by `splits` tasks over equal ranges of its KV blocks, each writing
/// normalized partial rows and their LSE for the merge.
void split_over_keys(const FlashProblem& p, std::int64_t splits, TaskPlan& plan) {
  const std::int64_t group = p.heads / p.kv_heads;
  plan.splits = splits;
  plan.whole = std::move(plan.tasks);
  plan.tasks.clear();
  plan.cost.clear();
  plan.first_row.assign(plan.whole.size() + 1, 0);
  for (std::size_t t = 0; t < plan.whole.size(); ++t) {
    plan.first_row[t + 1] =
        plan.first_row[t] + group * (plan.whole[t].q_end - plan.whole[t].q_begin);
  }
  const std::int64_t rows_total = plan.first_row.back();
  plan.partial_out = core::aligned_array<float>(rows_total * splits * p.dv_padded);
  plan.partial_lse = core::aligned_array<float>(rows_total * splits);
  for (std::size_t t = 0; t < plan.whole.size(); ++t) {
    const FlashTask& whole = plan.whole[t];
    const std::int64_t rows = plan.first_row[t + 1] - plan.first_row[t];
    const std::int64_t row0 = plan.first_row[t] * splits;
    for (std::int64_t s = 0; s < splits; ++s) {
      FlashTask part = whole;
      const schedule::BlockRange range = schedule::split_blocks(blocks_of(whole.kv_end), splits, s);
      part.kv_begin = std::min(whole.kv_end, range.begin * kKvBlock);
      part.kv_end = std::min(whole.kv_end, range.end * kKvBlock);
      part.partial_out = plan.partial_out.get() + (row0 + s * rows) * p.dv_padded;
      part.partial_lse = plan.partial_lse.get() + row0 + s * rows;
      plan.tasks.push_back(part);
      plan.cost.push_back(static_cast<double>(rows) * (part.kv_end - part.kv_begin));
    }
  }
}

/// Row tasks, split over the keys when too few to occupy the threads (decode-like shapes) and
/// the keys long enough: aiming at 2 tasks per thread, at least 4 blocks per split.
TaskPlan plan_tasks(const FlashProblem& p, int threads) {
  TaskPlan plan;
  add_row_tasks(p, plan);
  std::int64_t longest_kv = 0;
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    longest_kv = std::max(longest_kv, sequence_of(p, seq).kv_len);
  }
  const std::int64_t splits =
      threads > 1 ? schedule::kv_splits(static_cast<std::int64_t>(plan.tasks.size()), 2 * threads,
                                        blocks_of(longest_kv), 4)
                  : 1;
  if (splits > 1) split_over_keys(p, splits, plan);
  return plan;
}

/// Writes each split row from its partials, weighted by their LSE (log2 domain):
/// out = sum 2^(lse_s - lse) O_s.
void merge_splits(const FlashProblem& p, const TaskPlan& plan, int threads) {
  const auto merge = attention_kernels().flash_merge_splits;
  auto merged = core::aligned_array<float>(p.dv_padded * threads);
  core::parallel_ranges(
      static_cast<std::int64_t>(plan.whole.size()), threads,
      [&](std::int64_t begin, std::int64_t end, int thread) {
        for (std::int64_t t = begin; t < end; ++t) {
          const std::int64_t row0 = plan.first_row[t] * plan.splits;
          merge(p, plan.whole[t], plan.splits, plan.partial_out.get() + row0 * p.dv_padded,
                plan.partial_lse.get() + row0, merged.get() + thread * p.dv_padded);
        }
      });
}

}  // namespace

void run_flash_tasks(const FlashProblem& p, const FlashTiles& tiles,
                     const std::vector<FlashTask>& tasks, const std::vector<double>& cost,
                     int threads, int int8_chunk) {
  if (tasks.empty()) return;
  const auto kernel = flash_task_kernel(tiles);
  const std::vector<std::int64_t> order = task_order(p, tasks, cost);

  std::optional<Int8Backend> int8;
  PackedKV packed;
  if (int8_chunk > 0) {
    int8.emplace(p, int8_chunk, threads);
  } else {
    packed = PackedKV::pack(p, tiles, tasks, threads);
  }
  const FlashRun run{p, tiles, packed.view()};
  const int team = static_cast<int>(std::min<std::int64_t>(threads, tasks.size()));
  const std::int64_t scratch_floats =
      round_up(int8 ? int8->scratch_floats() : flash_scratch_floats(p), 16);
  float* scratch = core::thread_scratch<float>(
      core::ScratchUse::attention_tasks, core::CheckedSize(scratch_floats) * std::max(team, 1));
  core::parallel_tasks(static_cast<std::int64_t>(tasks.size()), team,
                       [&](std::int64_t index, int thread) {
                         float* task_scratch = scratch + thread * scratch_floats;
                         if (int8) {
                           int8->run(tasks[order[index]], task_scratch);
                         } else {
                           kernel(run, tasks[order[index]], task_scratch);
                         }
                       });
}

void run_flash(const FlashProblem& p, const FlashTiles& tiles, int threads, int int8_chunk) {
  if (p.batch == 0 || p.heads == 0) return;
  const TaskPlan plan = plan_tasks(p, threads);
  run_flash_tasks(p, tiles, plan.tasks, plan.cost, threads, int8_chunk);
  if (plan.splits > 1) merge_splits(p, plan, threads);
}

}  // namespace ditops::attention
