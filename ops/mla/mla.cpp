// Public entries mla_decode_paged and mla_fill_cache: validate everything, prepare the queries,
// build the (sequence, KV split) task list, run it, merge the splits.

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <ditops/mla.hpp>
#include <functional>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "ops/core/check.hpp"
#include "ops/core/isa.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"
#include "ops/mla/mla_kernel.hpp"
#include "ops/schedule/split_plan.hpp"

namespace ditops {
namespace {

using core::Arg;
using mla::kNopeDim;
using mla::kRopeDim;
using mla::kScaleGroups;

constexpr int kLatentDim = kNopeDim + kRopeDim;
/// Automatic split-KV over-decomposes into about this many tasks per thread: enough that
/// ragged seq_lens still balance under dynamic hand-out, few enough that the partial outputs
/// (H x 512 floats written and merged per split) stay a small fraction of the work.
constexpr std::int64_t kTasksPerThread = 2;
/// Whole sequences are not split when the busiest thread gets at most this much more than a
/// perfect share: splitting costs a partial output and a merge per split.
constexpr double kImbalanceTolerance = 1.1;

/// Symmetric int8 of n values: scale = max|x| / 127, q = clamp(rne(x / scale), -127, 127).
/// The cache format (mla.hpp), used by mla_fill_cache; mla_prepare_queries applies the same
/// rule to q_nope with vector instructions (tests/mla checks both against the reference).
float quantize_symmetric(const float* x, int n, std::int8_t* q) noexcept {
  float max_abs = 0.f;
  for (int i = 0; i < n; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
  const float scale = max_abs / 127.f;
  if (!(scale > 0.f)) {  // all zero (or subnormal enough that the scale underflows)
    std::fill(q, q + n, std::int8_t{0});
    return 0.f;
  }
  // Round to nearest even by adding and subtracting 1.5 * 2^23 (exact for |v| <= 2^22; here
  // |v| <= 127 + rounding): the same result as std::nearbyint in the default mode, without a
  // libm call per element on the SSE2 baseline (which has no roundss).
  constexpr float kRoundingShifter = 12582912.f;
  for (int i = 0; i < n; ++i) {
    const float rounded = (x[i] / scale + kRoundingShifter) - kRoundingShifter;
    q[i] = static_cast<std::int8_t>(std::clamp(rounded, -127.f, 127.f));
  }
  return scale;
}

float element(const TensorView& v, std::int64_t offset) {
  return v.dtype == DType::bf16 ? static_cast<const bf16*>(v.data)[offset].to_float()
                                : static_cast<const float*>(v.data)[offset];
}

void check_extent(const Arg& arg, int dim, std::int64_t expected) {
  if (arg.view.shape[dim] != expected) {
    core::fail(arg.call, std::string(arg.name) + ".shape[" + std::to_string(dim) + "] (" +
                             std::to_string(arg.view.shape[dim]) + ") must be " +
                             std::to_string(expected));
  }
}

/// The cache's three views against each other; returns {num_blocks, block_size, G}.
struct CacheGeometry {
  std::int64_t num_blocks, block_size, groups;
};
CacheGeometry check_cache(const char* call, const MlaPagedCache& cache) {
  const Arg nope{call, "cache.nope", cache.nope}, scale{call, "cache.nope_scale", cache.nope_scale},
      rope{call, "cache.rope", cache.rope};
  core::check_view(nope, 3, 3);
  core::check_dtype(nope, {DType::i8});
  check_extent(nope, 2, kNopeDim);
  const std::int64_t block_size = cache.nope.shape[1];
  if (block_size != 64 && block_size != 128) {
    core::fail(call, "cache.nope.shape[1] (block_size " + std::to_string(block_size) +
                         ") must be 64 or 128");
  }
  core::check_view(scale, 3, 3);
  core::check_dtype(scale, {DType::f32});
  core::check_dim(scale, 0, nope, 0);
  core::check_dim(scale, 1, nope, 1);
  const std::int64_t groups = cache.nope_scale.shape[2];
  if (groups != 1 && groups != 4) {
    core::fail(call, "cache.nope_scale.shape[2] (G " + std::to_string(groups) + ") must be 1 or 4");
  }
  core::check_view(rope, 3, 3);
  core::check_dtype(rope, {DType::f32, DType::bf16});
  core::check_dim(rope, 0, nope, 0);
  core::check_dim(rope, 1, nope, 1);
  check_extent(rope, 2, kRopeDim);
  return {cache.nope.shape[0], block_size, groups};
}

using mla::mla_kernels_of;
using mla::MlaKernels;

std::atomic<const MlaKernels*> kernels_override{nullptr};

/// The kernels of the variant this process runs (or the tests' override). The table is
/// constexpr: built at compile time, read without an initialization guard.
const MlaKernels& mla_kernels() {
  static constexpr core::IsaTable<MlaKernels> table = DITOPS_KERNEL_TABLE(mla_kernels_of);
  const MlaKernels* chosen = kernels_override.load();
  return chosen != nullptr ? *chosen : table.get();
}

/// Floats of one thread's workspace and where each part starts (64-byte aligned parts).
struct WorkspaceLayout {
  std::size_t out_acc, scores, alpha, row_max, row_sum, key_pack, rope_pack, value_pack, levels,
      level_factor, level_sum, total;
  WorkspaceLayout(std::size_t heads, std::size_t padded_heads, std::size_t block_size,
                  std::size_t chunk) {
    std::size_t next = 0;
    auto part = [&](std::size_t floats) {
      const std::size_t start = next;
      next += core::per_thread_stride<float>(floats);
      return start;
    };
    out_acc = part(heads * kNopeDim);
    scores = part(2 * chunk * padded_heads * block_size);
    alpha = part(2 * chunk * padded_heads);
    row_max = part(padded_heads);
    row_sum = part(padded_heads);
    key_pack = part(kNopeDim / 2 * block_size);  // int16 pairs: the larger of the two forms
    rope_pack = part(kRopeDim * block_size);
    value_pack = part(block_size * kNopeDim / 4);  // int8: a quarter float per byte
    levels = part(kScaleGroups * block_size / 4 * padded_heads);
    level_factor = part(kScaleGroups * padded_heads);
    level_sum = part(kScaleGroups * padded_heads);
    total = next;
  }
  mla::MlaWorkspace at(float* base) const {
    return {base + out_acc,
            base + scores,
            base + alpha,
            base + row_max,
            base + row_sum,
            reinterpret_cast<std::uint32_t*>(base + key_pack),
            base + rope_pack,
            reinterpret_cast<std::int8_t*>(base + value_pack),
            reinterpret_cast<std::uint32_t*>(base + levels),
            base + level_factor,
            base + level_sum};
  }
};

constexpr const char* kDecodeCall = "mla_decode_paged";

/// What the shape checks of one decode call establish.
struct DecodeShape {
  std::int64_t batch, heads;
  CacheGeometry geometry;
};

DecodeShape check_decode_shapes(const Arg& q_nope, const Arg& q_rope, const MlaPagedCache& cache,
                                const Arg& table, std::span<const std::int32_t> seq_lens,
                                const Arg& out) {
  core::check_view(q_nope, 3, 3);
  core::check_dtype(q_nope, {DType::f32, DType::bf16});
  check_extent(q_nope, 2, kNopeDim);
  const std::int64_t batch = q_nope.view.shape[0], heads = q_nope.view.shape[1];
  core::check_view(q_rope, 3, 3);
  core::check_dtype(q_rope, {DType::f32, DType::bf16});
  core::check_dim(q_rope, 0, q_nope, 0);
  core::check_dim(q_rope, 1, q_nope, 1);
  check_extent(q_rope, 2, kRopeDim);
  const CacheGeometry geometry = check_cache(kDecodeCall, cache);
  core::check_view(table, 2, 2);
  core::check_dtype(table, {DType::i32});
  core::check_dim(table, 0, q_nope, 0);
  if (static_cast<std::int64_t>(seq_lens.size()) != batch) {
    core::fail(kDecodeCall, "seq_lens has " + std::to_string(seq_lens.size()) +
                                " entries, expected batch " + std::to_string(batch));
  }
  if (!seq_lens.empty() && seq_lens.data() == nullptr) {
    core::fail(kDecodeCall, "seq_lens.data is null");
  }
  core::check_view(out, 3, 3);
  core::check_dtype(out, {DType::f32, DType::bf16});
  core::check_same_shape(out, q_nope);
  return {batch, heads, geometry};
}

/// Returns the softmax scale the call runs with (options.scale, else 1 / sqrt(576)).
float check_decode_options(const MlaDecodeOptions& options) {
  const float scale = core::check_softmax_scale(kDecodeCall, "options.scale", options.scale,
                                                1.f / std::sqrt(static_cast<float>(kLatentDim)));
  if (!schedule::valid_chunk(options.chunk)) {
    core::fail(kDecodeCall,
               "options.chunk (" + std::to_string(options.chunk) + ") must be 1, 2 or 4");
  }
  if (options.num_splits < 0) {
    core::fail(kDecodeCall, "options.num_splits (" + std::to_string(options.num_splits) +
                                ") must be >= 0 (0 = automatic)");
  }
  return scale;
}

/// Only the block ids a sequence reads are checked: the rest of its row may hold anything.
void check_block_ids(const TensorView& block_table, std::span<const std::int32_t> seq_lens,
                     const CacheGeometry& geometry) {
  const std::int64_t block_size = geometry.block_size;
  const std::int64_t max_blocks = block_table.shape[1];
  const auto* table = static_cast<const std::int32_t*>(block_table.data);
  for (std::int64_t b = 0; b < static_cast<std::int64_t>(seq_lens.size()); ++b) {
    const std::int64_t length = seq_lens[b];
    if (length < 0) {
      core::fail(kDecodeCall, "seq_lens[" + std::to_string(b) + "] (" + std::to_string(length) +
                                  ") is negative");
    }
    if (length > max_blocks * block_size) {
      core::fail(kDecodeCall, "seq_lens[" + std::to_string(b) + "] (" + std::to_string(length) +
                                  ") exceeds its block_table row (" + std::to_string(max_blocks) +
                                  " blocks of " + std::to_string(block_size) + ")");
    }
    const std::int64_t used = (length + block_size - 1) / block_size;
    for (std::int64_t i = 0; i < used; ++i) {
      const std::int64_t id = table[b * block_table.strides[0] + i];
      if (id < 0 || id >= geometry.num_blocks) {
        core::fail(kDecodeCall, "block_table[" + std::to_string(b) + "][" + std::to_string(i) +
                                    "] (" + std::to_string(id) + ") is out of range [0, " +
                                    std::to_string(geometry.num_blocks) + ")");
      }
    }
  }
}

void check_decode_aliasing(const Arg& out, const Arg& q_nope, const Arg& q_rope,
                           const MlaPagedCache& cache, const Arg& table,
                           std::span<const std::int32_t> seq_lens) {
  core::check_writable(out);
  const TensorView lengths_view =
      view(seq_lens.data(), {static_cast<std::int64_t>(seq_lens.size())});
  const Arg inputs[] = {q_nope,
                        q_rope,
                        {kDecodeCall, "cache.nope", cache.nope},
                        {kDecodeCall, "cache.nope_scale", cache.nope_scale},
                        {kDecodeCall, "cache.rope", cache.rope},
                        table,
                        {kDecodeCall, "seq_lens", lengths_view}};
  for (const Arg& input : inputs) core::check_no_overlap(out, input, false);
}

/// q_nope as int8 per (sequence, head) and q_rope, heads in lanes (padded with zeros to
/// padded_heads), scales with scale * log2(e) folded in; in the calling thread's scratch.
mla::PreparedQueries prepare_queries(const TensorView& q_nope, const TensorView& q_rope,
                                     float scale, std::int64_t padded_heads, int threads) {
  const std::int64_t batch = q_nope.shape[0], heads = q_nope.shape[1];
  const auto padded_rows = static_cast<std::size_t>(batch * padded_heads);
  const std::size_t query_floats =
      padded_rows * (kNopeDim / 4 + kNopeDim / 2 + kScaleGroups + 1 + kRopeDim);
  float* query_scratch = core::thread_scratch<float>(core::ScratchUse::mla_queries,
                                                     static_cast<std::int64_t>(query_floats));
  if (padded_heads != heads) std::memset(query_scratch, 0, query_floats * sizeof(float));
  auto* q_words = reinterpret_cast<std::uint32_t*>(query_scratch);
  auto* q_pairs = q_words + padded_rows * (kNopeDim / 4);
  auto* offset_sums = reinterpret_cast<std::int32_t*>(q_pairs + padded_rows * (kNopeDim / 2));
  float* nope_factor = reinterpret_cast<float*>(offset_sums + padded_rows * kScaleGroups);
  float* rope_scaled = nope_factor + padded_rows;
  mla::QueryInputs query_inputs;
  query_inputs.nope = q_nope.data;
  query_inputs.nope_bf16 = q_nope.dtype == DType::bf16;
  query_inputs.nope_strides[0] = q_nope.strides[0];
  query_inputs.nope_strides[1] = q_nope.strides[1];
  query_inputs.rope = q_rope.data;
  query_inputs.rope_bf16 = q_rope.dtype == DType::bf16;
  query_inputs.rope_strides[0] = q_rope.strides[0];
  query_inputs.rope_strides[1] = q_rope.strides[1];
  query_inputs.log2_scale = scale * std::numbers::log2e_v<float>;
  query_inputs.heads = static_cast<int>(heads);
  query_inputs.padded_heads = static_cast<int>(padded_heads);
  const mla::PreparedQueries prepared{q_words, q_pairs, offset_sums, nope_factor, rope_scaled};
  const auto prepare = mla_kernels().mla_prepare_queries;
  // Work in units of 16 heads of one sequence: a unit writes whole cache lines of the packed
  // arrays, so two threads never share one; one unit runs inline (no team for ~1 us of work).
  const std::int64_t units = batch * (padded_heads / mla::kHeadPadding);
  if (units == 1) {
    prepare(query_inputs, prepared, 0, 1);
  } else {
    core::parallel_ranges(units, threads, [&](std::int64_t first, std::int64_t end, int) {
      prepare(query_inputs, prepared, first, end);
    });
  }
  return prepared;
}

mla::MlaProblem make_problem(const MlaPagedCache& cache, const TensorView& out, std::int64_t heads,
                             std::int64_t padded_heads, const CacheGeometry& geometry, int chunk,
                             const mla::PreparedQueries& queries) {
  mla::MlaProblem problem;
  problem.heads = static_cast<int>(heads);
  problem.padded_heads = static_cast<int>(padded_heads);
  problem.block_size = static_cast<int>(geometry.block_size);
  problem.scale_groups = static_cast<int>(geometry.groups);
  problem.chunk = chunk;
  problem.nope = static_cast<const std::int8_t*>(cache.nope.data);
  problem.nope_strides[0] = cache.nope.strides[0];
  problem.nope_strides[1] = cache.nope.strides[1];
  problem.nope_scale = static_cast<const float*>(cache.nope_scale.data);
  problem.scale_strides[0] = cache.nope_scale.strides[0];
  problem.scale_strides[1] = cache.nope_scale.strides[1];
  problem.rope = cache.rope.data;
  problem.rope_bf16 = cache.rope.dtype == DType::bf16;
  problem.rope_strides[0] = cache.rope.strides[0];
  problem.rope_strides[1] = cache.rope.strides[1];
  problem.queries = queries;
  problem.out = out.data;
  problem.out_bf16 = out.dtype == DType::bf16;
  problem.out_strides[0] = out.strides[0];
  problem.out_strides[1] = out.strides[1];
  return problem;
}

/// Whether whole sequences would leave threads idle: the longest-first assignment of unsplit
/// sequences (LPT) misses a perfect share by more than kImbalanceTolerance.
bool split_needed(std::span<const std::int32_t> seq_lens, std::int64_t total_tokens, int threads) {
  std::vector<std::int64_t> lengths(seq_lens.begin(), seq_lens.end());
  std::sort(lengths.begin(), lengths.end(), std::greater<>());
  std::vector<std::int64_t> loads(static_cast<std::size_t>(threads), 0);
  for (std::int64_t length : lengths) *std::min_element(loads.begin(), loads.end()) += length;
  const double perfect = static_cast<double>(total_tokens) / threads;
  return static_cast<double>(*std::max_element(loads.begin(), loads.end())) >
         perfect * kImbalanceTolerance;
}

/// KV splits of each sequence, whole blocks each (0 for an empty sequence). Automatic splits
/// are sized by cost, and only where split_needed; one sequence splits into equal pieces that
/// balance exactly: one per thread.
std::vector<int> splits_per_sequence(std::span<const std::int32_t> seq_lens,
                                     const MlaDecodeOptions& options, std::int64_t block_size,
                                     int threads) {
  const auto batch = static_cast<std::int64_t>(seq_lens.size());
  std::int64_t total_tokens = 0;
  for (std::int64_t b = 0; b < batch; ++b) total_tokens += seq_lens[b];
  const bool split =
      options.num_splits == 0 && threads > 1 && split_needed(seq_lens, total_tokens, threads);
  const std::int64_t target_tasks = threads * (batch == 1 ? 1 : kTasksPerThread);
  const std::int64_t split_tokens =
      std::max<std::int64_t>(block_size, (total_tokens + target_tasks - 1) / target_tasks);
  std::vector<int> splits_of(batch, 0);
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t blocks = (seq_lens[b] + block_size - 1) / block_size;
    if (blocks == 0) continue;
    std::int64_t splits = 1;
    if (options.num_splits > 0) {
      splits = std::min<std::int64_t>(options.num_splits, blocks);
    } else if (split) {
      splits = std::clamp<std::int64_t>((seq_lens[b] + split_tokens - 1) / split_tokens, 1, blocks);
    }
    splits_of[b] = static_cast<int>(splits);
  }
  return splits_of;
}

/// The tasks of one call and the partial results of its split sequences, which the merge
/// reads. Tasks point into `schedules` and the partial buffers.
struct DecodeTasks {
  std::vector<int> splits_of;                   ///< per sequence; 1 writes out directly
  float* partial_out = nullptr;                 ///< [partial splits][H][512]
  float* partial_lse = nullptr;                 ///< [partial splits][H]
  std::vector<mla::MlaTask> tasks;              ///< longest first, for the dynamic hand-out
  std::vector<std::int64_t> partial_base;       ///< first partial split of each sequence
  std::map<int, schedule::Schedule> schedules;  ///< by block count
};

void allocate_partials(DecodeTasks& plan, std::int64_t heads) {
  std::int64_t partial_splits = 0;
  for (const int splits : plan.splits_of) {
    if (splits > 1) partial_splits += splits;
  }
  plan.partial_out = core::thread_scratch<float>(core::ScratchUse::mla_partials,
                                                 partial_splits * heads * (kNopeDim + 1));
  plan.partial_lse = plan.partial_out + partial_splits * heads * kNopeDim;
}

/// An empty sequence gets no task, so its zeros are written here.
void zero_output(const TensorView& out, std::int64_t b, std::int64_t heads) {
  for (std::int64_t h = 0; h < heads; ++h) {
    char* row = static_cast<char*>(out.data) +
                (b * out.strides[0] + h * out.strides[1]) * dtype_size(out.dtype);
    std::memset(row, 0, kNopeDim * dtype_size(out.dtype));  // 0.0f and bf16 0 are all-zero bits
  }
}

/// One task per split of each sequence, whole blocks each.
void add_tasks(DecodeTasks& plan, std::span<const std::int32_t> seq_lens,
               const TensorView& block_table, std::int64_t block_size, std::int64_t heads,
               int chunk, const TensorView& out) {
  const auto* table = static_cast<const std::int32_t*>(block_table.data);
  const auto batch = static_cast<std::int64_t>(seq_lens.size());
  plan.partial_base.assign(static_cast<std::size_t>(batch), 0);
  std::int64_t next_partial = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    const int splits = plan.splits_of[b];
    if (splits == 0) {
      zero_output(out, b, heads);
      continue;
    }
    plan.partial_base[b] = next_partial;
    const std::int64_t blocks = (seq_lens[b] + block_size - 1) / block_size;
    for (int s = 0; s < splits; ++s) {
      const auto [first_block, end_block] = schedule::split_blocks(blocks, splits, s);
      const int count = static_cast<int>(end_block - first_block);
      auto found = plan.schedules.find(count);
      if (found == plan.schedules.end()) {
        found = plan.schedules.emplace(count, schedule::make_schedule(count, chunk)).first;
      }
      mla::MlaTask task;
      task.sequence = static_cast<int>(b);
      task.split = s;
      task.splits = splits;
      task.first_token = first_block * block_size;
      task.end_token = std::min<std::int64_t>(end_block * block_size, seq_lens[b]);
      task.block_ids = table + b * block_table.strides[0] + first_block;
      task.order = found->second.cube.data();
      task.order_size = static_cast<int>(found->second.cube.size());
      if (splits > 1) {
        task.partial_out = plan.partial_out + (next_partial + s) * heads * kNopeDim;
        task.partial_lse = plan.partial_lse + (next_partial + s) * heads;
      }
      plan.tasks.push_back(task);
    }
    if (splits > 1) next_partial += splits;
  }
}

/// For the dynamic hand-out: the short tasks left for the tail balance the threads.
void order_longest_first(std::vector<mla::MlaTask>& tasks) {
  std::vector<double> task_tokens;
  for (const mla::MlaTask& task : tasks) task_tokens.push_back(task.end_token - task.first_token);
  std::vector<mla::MlaTask> ordered;
  for (std::int64_t index : schedule::longest_first(task_tokens)) ordered.push_back(tasks[index]);
  tasks = std::move(ordered);
}

void run_tasks(const mla::MlaProblem& problem, std::span<const mla::MlaTask> tasks, int threads) {
  const auto task_kernel = mla_kernels().mla_decode_task;
  const int workers = static_cast<int>(std::min<std::int64_t>(threads, tasks.size()));
  const WorkspaceLayout layout(
      static_cast<std::size_t>(problem.heads), static_cast<std::size_t>(problem.padded_heads),
      static_cast<std::size_t>(problem.block_size), static_cast<std::size_t>(problem.chunk));
  float* workspace = core::thread_scratch<float>(
      core::ScratchUse::mla_workspace,
      core::CheckedSize(static_cast<std::int64_t>(layout.total)) * std::max(workers, 1));
  core::parallel_tasks(
      static_cast<std::int64_t>(tasks.size()), workers, [&](std::int64_t index, int thread) {
        task_kernel(problem, tasks[index], layout.at(workspace + thread * layout.total));
      });
}

/// Merges in units of (sequence, 16 heads), so one long sequence merges on every thread.
void merge_partials(const mla::MlaProblem& problem, const DecodeTasks& plan, int threads) {
  const auto merge_kernel = mla_kernels().mla_merge_splits;
  const std::int64_t heads = problem.heads;
  std::vector<int> merged;
  for (std::size_t b = 0; b < plan.splits_of.size(); ++b) {
    if (plan.splits_of[b] > 1) merged.push_back(static_cast<int>(b));
  }
  const std::int64_t head_units = (heads + mla::kHeadPadding - 1) / mla::kHeadPadding;
  core::parallel_ranges(
      static_cast<std::int64_t>(merged.size()) * head_units, threads,
      [&](std::int64_t begin, std::int64_t end, int) {
        for (std::int64_t unit = begin; unit < end; ++unit) {
          const int b = merged[unit / head_units];
          const std::int64_t base = plan.partial_base[b];
          const int first_head = static_cast<int>(unit % head_units) * mla::kHeadPadding;
          merge_kernel(problem, b, plan.splits_of[b], plan.partial_out + base * heads * kNopeDim,
                       plan.partial_lse + base * heads, first_head,
                       std::min<int>(first_head + mla::kHeadPadding, static_cast<int>(heads)));
        }
      });
}

}  // namespace

const mla::MlaKernels* mla::override_mla_kernels(const MlaKernels* kernels) noexcept {
  return kernels_override.exchange(kernels);
}

void mla_decode_paged(const TensorView& q_nope, const TensorView& q_rope,
                      const MlaPagedCache& cache, const TensorView& block_table,
                      std::span<const std::int32_t> seq_lens, const TensorView& out,
                      const MlaDecodeOptions& options) {
  constexpr const char* kCall = kDecodeCall;
  const core::CallScope scope(kCall);
  const Arg q_nope_arg{kCall, "q_nope", q_nope}, q_rope_arg{kCall, "q_rope", q_rope},
      table_arg{kCall, "block_table", block_table}, out_arg{kCall, "out", out};
  // Every check runs before any memory is touched (the promise of ditops::Error).
  const DecodeShape shape =
      check_decode_shapes(q_nope_arg, q_rope_arg, cache, table_arg, seq_lens, out_arg);
  const float scale = check_decode_options(options);
  check_block_ids(block_table, seq_lens, shape.geometry);
  check_decode_aliasing(out_arg, q_nope_arg, q_rope_arg, cache, table_arg, seq_lens);
  const std::int64_t batch = shape.batch, heads = shape.heads;
  if (batch == 0 || heads == 0) return;

  const std::int64_t padded_heads =
      (heads + mla::kHeadPadding - 1) / mla::kHeadPadding * mla::kHeadPadding;
  const int threads = core::thread_count();
  const mla::PreparedQueries queries =
      prepare_queries(q_nope, q_rope, scale, padded_heads, threads);
  const mla::MlaProblem problem =
      make_problem(cache, out, heads, padded_heads, shape.geometry, options.chunk, queries);
  const std::int64_t block_size = shape.geometry.block_size;
  DecodeTasks plan;
  plan.splits_of = splits_per_sequence(seq_lens, options, block_size, threads);
  allocate_partials(plan, heads);
  add_tasks(plan, seq_lens, block_table, block_size, heads, options.chunk, out);
  order_longest_first(plan.tasks);
  run_tasks(problem, plan.tasks, threads);
  merge_partials(problem, plan, threads);
}

void mla_fill_cache(const TensorView& latent, const TensorView& slots, const MlaPagedCache& cache) {
  constexpr const char* kCall = "mla_fill_cache";
  const Arg latent_arg{kCall, "latent", latent}, slots_arg{kCall, "slots", slots};
  core::check_view(latent_arg, 2, 2);
  core::check_dtype(latent_arg, {DType::f32, DType::bf16});
  check_extent(latent_arg, 1, kLatentDim);
  core::check_view(slots_arg, 1, 1);
  core::check_dtype(slots_arg, {DType::i32});
  core::check_dim(slots_arg, 0, latent_arg, 0);
  const CacheGeometry geometry = check_cache(kCall, cache);
  const std::int64_t tokens = latent.shape[0];
  const std::int64_t capacity = geometry.num_blocks * geometry.block_size;
  const auto* slot = static_cast<const std::int32_t*>(slots.data);
  std::vector<std::pair<std::int32_t, std::int64_t>> seen;  // (slot, index), for duplicates
  seen.reserve(static_cast<std::size_t>(tokens));
  for (std::int64_t i = 0; i < tokens; ++i) {
    const std::int64_t s = slot[i * slots.strides[0]];
    if (s < 0 || s >= capacity) {
      core::fail(kCall, "slots[" + std::to_string(i) + "] (" + std::to_string(s) +
                            ") is out of range [0, " + std::to_string(capacity) + ")");
    }
    seen.emplace_back(static_cast<std::int32_t>(s), i);
  }
  std::sort(seen.begin(), seen.end());
  for (std::size_t i = 1; i < seen.size(); ++i) {
    if (seen[i].first == seen[i - 1].first) {
      core::fail(kCall, "slots[" + std::to_string(seen[i].second) + "] (" +
                            std::to_string(seen[i].first) + ") repeats slots[" +
                            std::to_string(seen[i - 1].second) + "]");
    }
  }
  for (std::int64_t i = 0; i < tokens; ++i) {
    for (int d = 0; d < kLatentDim; ++d) {
      const float value = element(latent, i * latent.strides[0] + d);
      if (!std::isfinite(value)) {
        core::fail(kCall, "latent[" + std::to_string(i) + "][" + std::to_string(d) + "] (" +
                              std::to_string(value) + ") is not finite");
      }
    }
  }
  const Arg outputs[] = {{kCall, "cache.nope", cache.nope},
                         {kCall, "cache.nope_scale", cache.nope_scale},
                         {kCall, "cache.rope", cache.rope}};
  for (const Arg& output : outputs) {
    core::check_writable(output);
    core::check_no_overlap(output, latent_arg, false);
    core::check_no_overlap(output, slots_arg, false);
  }
  core::check_no_overlap(outputs[0], outputs[1], false);
  core::check_no_overlap(outputs[0], outputs[2], false);
  core::check_no_overlap(outputs[1], outputs[2], false);

  const std::int64_t groups = geometry.groups, group_dim = kNopeDim / groups;
  core::parallel_ranges(
      tokens, core::threads_for_bytes(tokens * kLatentDim * 4),
      [&](std::int64_t begin, std::int64_t end, int) {
        float values[kLatentDim];
        for (std::int64_t i = begin; i < end; ++i) {
          for (int d = 0; d < kLatentDim; ++d)
            values[d] = element(latent, i * latent.strides[0] + d);
          const std::int64_t s = slot[i * slots.strides[0]];
          const std::int64_t block = s / geometry.block_size, position = s % geometry.block_size;
          auto* nope = static_cast<std::int8_t*>(cache.nope.data) + block * cache.nope.strides[0] +
                       position * cache.nope.strides[1];
          auto* scales = static_cast<float*>(cache.nope_scale.data) +
                         block * cache.nope_scale.strides[0] +
                         position * cache.nope_scale.strides[1];
          for (std::int64_t g = 0; g < groups; ++g) {
            scales[g] = quantize_symmetric(values + g * group_dim, static_cast<int>(group_dim),
                                           nope + g * group_dim);
          }
          const std::int64_t rope_at =
              block * cache.rope.strides[0] + position * cache.rope.strides[1];
          for (int d = 0; d < kRopeDim; ++d) {
            if (cache.rope.dtype == DType::bf16) {
              static_cast<bf16*>(cache.rope.data)[rope_at + d] =
                  bf16::from_float(values[kNopeDim + d]);
            } else {
              static_cast<float*>(cache.rope.data)[rope_at + d] = values[kNopeDim + d];
            }
          }
        }
      });
}

}  // namespace ditops
