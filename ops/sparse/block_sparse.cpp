// Block-sparse attention on the flash kernel: block_sparse_attention (a block mask),
// rainfusion_attention (per-head RainFusion patterns) and attention_forward's sparse backend (a
// boolean token mask). Each states its tasks as (sequence, heads, query range, KV block list);
// the flash driver (attention::run_flash_tasks) packs K and V and runs them with the dense
// kernel, which walks the
// list instead of every block. Inside a listed block the kernel masks only where a row's window
// or mask cuts it, so the cost follows the kept blocks.

#include "ops/sparse/block_sparse.hpp"

#include <algorithm>
#include <cstring>
#include <ditops/sparse.hpp>
#include <span>
#include <string>
#include <vector>

#include "ops/attention/flash_driver.hpp"
#include "ops/core/check.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"
#include "ops/sparse/layout.hpp"

namespace ditops {
namespace sparse {
namespace {

using attention::FlashProblem;
using attention::FlashTask;
using attention::kKvBlock;
using attention::kMaxRowGroup;
using attention::kMaxTileRows;

/// Query rows per task where the caller is free to choose: one full row group.
constexpr std::int64_t kTaskRows = kMaxRowGroup * kMaxTileRows;

using attention::blocks_of;

/// Tasks with their KV block lists, run once every list is final (the tasks point into one
/// array that may move while it grows).
class TaskList {
 public:
  /// `blocks`: ascending 64-key block numbers; the task's cost estimate is rows x blocks.
  void add(FlashTask task, std::span<const std::int32_t> blocks) {
    // The lists of a call with many heads and long keys can outgrow memory: an Error naming
    // the call and the size, never std::bad_alloc.
    const core::CheckedSize total = core::CheckedSize(static_cast<std::int64_t>(blocks_.size())) +
                                    static_cast<std::int64_t>(blocks.size());
    core::check_allocation(total, sizeof(std::int32_t));
    try {
      blocks_.insert(blocks_.end(), blocks.begin(), blocks.end());
    } catch (const std::bad_alloc&) {
      core::allocation_failed(total.value * static_cast<std::int64_t>(sizeof(std::int32_t)));
    }
    first_.push_back(static_cast<std::int64_t>(blocks_.size() - blocks.size()));
    task.block_count = static_cast<std::int64_t>(blocks.size());
    const std::int64_t heads = std::max<std::int64_t>(task.head_count, 1);
    cost_.push_back(static_cast<double>((task.q_end - task.q_begin) * heads) *
                    static_cast<double>(task.block_count + 1));
    tasks_.push_back(task);
  }
  /// Runs the tasks with fp32 dot products over packed K and V, full row groups.
  void run(const FlashProblem& p, int threads) {
    for (std::size_t t = 0; t < tasks_.size(); ++t) {
      tasks_[t].blocks = blocks_.data() + first_[t];  // non-null: an empty list visits nothing
    }
    const attention::FlashTiles tiles{attention::KLayout::packed, kMaxRowGroup, false};
    attention::run_flash_tasks(p, tiles, tasks_, cost_, threads);
  }

 private:
  std::vector<FlashTask> tasks_;
  std::vector<double> cost_;
  std::vector<std::int64_t> first_;
  std::vector<std::int32_t> blocks_{0};  // never empty: data() stays non-null
};

FlashTask task_of(std::int64_t seq, std::int64_t head, std::int64_t group, bool whole_group,
                  std::int64_t q_begin, std::int64_t q_end, std::int64_t kv_len) {
  FlashTask task;
  task.seq = seq;
  task.kv_head = head / group;
  task.head_begin = whole_group ? 0 : head % group;
  task.head_count = whole_group ? 0 : 1;
  task.q_begin = q_begin;
  task.q_end = q_end;
  task.kv_end = kv_len;
  return task;
}

}  // namespace

void run_sparse_backend(const attention::Call& call, int threads) {
  const FlashProblem& p = call.problem;
  if (p.batch == 0 || p.heads == 0 || p.q_len == 0) return;
  const std::int64_t group = p.heads / p.kv_heads;
  const std::int64_t key_blocks = blocks_of(p.kv_len);
  // Per distinct mask slice (batch and head, 0 where broadcast) and chunk of kTaskRows query
  // rows: the 64-key blocks any of the rows keeps anything of. The mask is read once here.
  const bool per_batch = p.mask_strides[0] != 0, per_head = p.mask_strides[1] != 0;
  const std::int64_t slices_b = per_batch ? p.batch : 1, slices_h = per_head ? p.heads : 1;
  const std::int64_t chunks = (p.q_len + kTaskRows - 1) / kTaskRows;
  std::vector<std::vector<std::int32_t>> lists(slices_b * slices_h * chunks);
  core::parallel_tasks(
      static_cast<std::int64_t>(lists.size()), threads, [&](std::int64_t index, int) {
        const std::int64_t chunk = index % chunks, slice = index / chunks;
        const std::int64_t b = slice / slices_h, h = slice % slices_h;
        const auto* mask = static_cast<const std::uint8_t*>(p.mask);
        std::vector<std::uint8_t> any(p.kv_len, 0);
        const std::int64_t q_end = std::min(p.q_len, (chunk + 1) * kTaskRows);
        // A mask broadcast over queries (stride 0) has one row for all of them.
        const std::int64_t rows_end = p.mask_strides[2] == 0 ? chunk * kTaskRows + 1 : q_end;
        for (std::int64_t q = chunk * kTaskRows; q < rows_end; ++q) {
          const std::uint8_t* row =
              mask + b * p.mask_strides[0] + h * p.mask_strides[1] + q * p.mask_strides[2];
          for (std::int64_t key = 0; key < p.kv_len; ++key) any[key] |= row[key];
        }
        for (std::int64_t block = 0; block < key_blocks; ++block) {
          const std::int64_t end = std::min(p.kv_len, (block + 1) * kKvBlock);
          if (std::any_of(any.begin() + block * kKvBlock, any.begin() + end,
                          [](std::uint8_t v) { return v != 0; })) {
            lists[index].push_back(static_cast<std::int32_t>(block));
          }
        }
      });
  TaskList tasks;
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    for (std::int64_t head = 0; head < p.heads; head += per_head ? 1 : group) {
      for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
        const std::int64_t slice = (per_batch ? seq : 0) * slices_h + (per_head ? head : 0);
        tasks.add(task_of(seq, head, group, !per_head, chunk * kTaskRows,
                          std::min(p.q_len, (chunk + 1) * kTaskRows), p.kv_len),
                  lists[slice * chunks + chunk]);
      }
    }
  }
  tasks.run(p, threads);
}

}  // namespace sparse

using attention::FlashProblem;
using attention::kKvBlock;
using sparse::kTaskRows;

void block_sparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& block_mask, int block_size, const TensorView& out,
                            const AttentionOptions& options) {
  constexpr const char* name = "block_sparse_attention";
  const core::CallScope scope(name);
  const attention::Call call = attention::validate_dense(name, q, k, v, &out, options);
  if (block_size != 64 && block_size != 128) {
    core::fail(name, "block_size (" + std::to_string(block_size) + ") must be 64 or 128");
  }
  const FlashProblem& p = call.problem;
  const std::int64_t q_blocks = (p.q_len + block_size - 1) / block_size;
  const std::int64_t k_blocks = (p.kv_len + block_size - 1) / block_size;
  const core::Arg mask_arg{name, "block_mask", block_mask};
  core::check_view(mask_arg, 3, 4);
  core::check_dtype(mask_arg, {DType::boolean});
  const int first = block_mask.rank - 3;  // 1 with a batch dimension
  const std::int64_t batch_extent = first ? block_mask.shape[0] : 1;
  const std::int64_t head_extent = block_mask.shape[first];
  if ((batch_extent != 1 && batch_extent != p.batch) ||
      (head_extent != 1 && head_extent != p.heads) || block_mask.shape[first + 1] != q_blocks ||
      block_mask.shape[first + 2] != k_blocks) {
    core::fail(name, "block_mask " + core::shape_string(block_mask) + " must be " +
                         (first ? "[B|1, " : "[") + "N|1, ceil(Sq / block_size), ceil(Sk / " +
                         "block_size)] = [" + (first ? std::to_string(p.batch) + "|1, " : "") +
                         std::to_string(p.heads) + "|1, " + std::to_string(q_blocks) + ", " +
                         std::to_string(k_blocks) + "] for block_size " +
                         std::to_string(block_size));
  }
  if (core::numel(block_mask) > 0) {
    core::check_no_overlap(core::Arg{name, "out", out}, mask_arg, false);
    if (core::numel(options.lse) > 0) {
      core::check_no_overlap(core::Arg{name, "lse", options.lse}, mask_arg, false);
    }
  }
  if (p.batch == 0 || p.heads == 0 || p.q_len == 0) return;

  const std::int64_t group = p.heads / p.kv_heads;
  const bool per_head = head_extent != 1;
  const std::int64_t kernel_blocks = sparse::blocks_of(p.kv_len);
  const std::int64_t per_block = block_size / kKvBlock;
  const auto* mask = static_cast<const std::uint8_t*>(block_mask.data);
  const std::int64_t stride_b = first && batch_extent != 1 ? block_mask.strides[0] : 0;
  const std::int64_t stride_h = per_head ? block_mask.strides[first] : 0;
  const std::int64_t stride_i = block_mask.strides[first + 1],
                     stride_j = block_mask.strides[first + 2];
  sparse::TaskList tasks;
  std::vector<std::int32_t> list;
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    for (std::int64_t head = 0; head < p.heads; head += per_head ? 1 : group) {
      for (std::int64_t i = 0; i < q_blocks; ++i) {
        list.clear();
        const std::uint8_t* row = mask + seq * stride_b + head * stride_h + i * stride_i;
        for (std::int64_t j = 0; j < k_blocks; ++j) {
          if (!row[j * stride_j]) continue;
          for (std::int64_t b = j * per_block; b < std::min(kernel_blocks, (j + 1) * per_block);
               ++b) {
            list.push_back(static_cast<std::int32_t>(b));
          }
        }
        tasks.add(sparse::task_of(seq, head, group, !per_head, i * block_size,
                                  std::min(p.q_len, (i + 1) * block_size), p.kv_len),
                  list);
      }
    }
  }
  tasks.run(p, core::thread_count());
}

void rainfusion_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          std::span<const HeadPattern> patterns, const TensorView& out,
                          const RainFusionOptions& rf, const AttentionOptions& options) {
  constexpr const char* name = "rainfusion_attention";
  const core::CallScope scope(name);
  const attention::Call call = attention::validate_dense(name, q, k, v, &out, options);
  const sparse::Layout layout = sparse::checked_layout(name, rf);
  const FlashProblem& base = call.problem;
  sparse::check_self_attention(name, base.q_len, base.kv_len, layout, options);
  const std::int64_t heads_total = base.batch * base.heads;
  if (!patterns.empty() && static_cast<std::int64_t>(patterns.size()) != heads_total) {
    core::fail(name,
               "patterns has " + std::to_string(patterns.size()) +
                   " entries; expected 0 (classify) or B * N = " + std::to_string(heads_total));
  }
  for (HeadPattern pattern : patterns) sparse::checked_pattern(name, pattern);
  if (heads_total == 0 || layout.tokens == 0) return;
  std::vector<HeadPattern> classified;
  if (patterns.empty()) {
    classified = rainfusion_classify(q, k, rf, options);
    patterns = classified;
  }

  const int threads = core::thread_count();
  const std::int64_t group = base.heads / base.kv_heads;
  for (HeadPattern pattern :
       {HeadPattern::dense, HeadPattern::spatial, HeadPattern::temporal, HeadPattern::textural}) {
    if (std::find(patterns.begin(), patterns.end(), pattern) == patterns.end()) continue;
    const auto plan = sparse::cached_plan(pattern, layout);
    // The pattern's problem: the call's, in the pattern's token order and row windows.
    FlashProblem p = base;
    if (pattern != HeadPattern::dense) {
      p.q_order = plan->order.data();
      p.k_order = plan->order.data();
      p.row_window = plan->window.data();
      p.sink_end = plan->sink_end;
    }
    // Per chunk of kTaskRows positions: the sink's blocks, then the blocks the chunk's windows
    // span (windows move monotonically with the position, so the union is one run).
    const std::int64_t S = layout.tokens, chunks = (S + kTaskRows - 1) / kTaskRows;
    const std::int64_t sink_blocks = sparse::blocks_of(plan->sink_end);
    std::vector<std::vector<std::int32_t>> lists(chunks);
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      std::int64_t lo = S, hi = 0;
      for (std::int64_t pos = chunk * kTaskRows; pos < std::min(S, (chunk + 1) * kTaskRows);
           ++pos) {
        lo = std::min<std::int64_t>(lo, plan->window[2 * pos]);
        hi = std::max<std::int64_t>(hi, plan->window[2 * pos + 1]);
      }
      std::vector<std::int32_t>& list = lists[chunk];
      for (std::int64_t b = 0; b < sink_blocks; ++b) list.push_back(static_cast<std::int32_t>(b));
      for (std::int64_t b = std::max(sink_blocks, lo / kKvBlock); b < sparse::blocks_of(hi); ++b) {
        list.push_back(static_cast<std::int32_t>(b));
      }
    }
    sparse::TaskList tasks;
    for (std::int64_t seq = 0; seq < base.batch; ++seq) {
      for (std::int64_t head = 0; head < base.heads; ++head) {
        if (patterns[seq * base.heads + head] != pattern) continue;
        for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
          tasks.add(sparse::task_of(seq, head, group, false, chunk * kTaskRows,
                                    std::min(S, (chunk + 1) * kTaskRows), S),
                    lists[chunk]);
        }
      }
    }
    tasks.run(p, threads);
  }
}

}  // namespace ditops
