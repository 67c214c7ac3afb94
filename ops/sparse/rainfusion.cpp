// RainFusion entries that read the pattern plans (ops/sparse/layout.hpp) without running
// attention: the token mask a pattern stands for, its density, the online head classifier
// (ARM) and the adaptive block selection of RainFusion 2.

#define EIGEN_DONT_PARALLELIZE  // the classifier's GEMMs run inside our own threads
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ditops/sparse.hpp>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ops/attention/call.hpp"
#include "ops/core/check.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"
#include "ops/sparse/layout.hpp"

namespace ditops {
namespace {

using core::Arg;
using core::CheckedSize;

/// Row `count` elements of q or k, starting at element `offset`, as fp32.
void load_row(DType dtype, const void* base, std::int64_t offset, std::int64_t count, float* out) {
  switch (dtype) {
    case DType::bf16: {
      const bf16* in = static_cast<const bf16*>(base) + offset;
      for (std::int64_t d = 0; d < count; ++d) out[d] = in[d].to_float();
      break;
    }
    case DType::f16: {
      const f16* in = static_cast<const f16*>(base) + offset;
      for (std::int64_t d = 0; d < count; ++d) out[d] = in[d].to_float();
      break;
    }
    default:
      std::memcpy(out, static_cast<const float*>(base) + offset,
                  static_cast<std::size_t>(count) * sizeof(float));
  }
}

std::int64_t element_offset(const attention::Strides& s, std::int64_t batch, std::int64_t token,
                            std::int64_t head) {
  return batch * s.batch + token * s.seq + head * s.head;
}

/// Per-thread slices of one scratch array, each on its own cache lines; allocated before the
/// thread team starts so that a size the machine cannot hold is an Error, not a throw inside
/// the parallel region.
template <class T>
struct ThreadSlices {
  ThreadSlices(int threads, CheckedSize count)
      : stride(static_cast<std::int64_t>(core::per_thread_stride<T>(
            static_cast<std::size_t>(count.overflow ? 0 : count.value)))),
        data(core::aligned_array<T>(count.overflow ? count : CheckedSize(stride) * threads)) {}
  T* slice(int thread) noexcept { return data.get() + thread * stride; }
  std::int64_t stride;
  core::AlignedArray<T> data;
};

}  // namespace

// ---- masks and densities ------------------------------------------------------------------------

void rainfusion_mask(HeadPattern pattern, const RainFusionOptions& rf, const TensorView& mask) {
  constexpr const char* name = "rainfusion_mask";
  const core::CallScope scope(name);
  pattern = sparse::checked_pattern(name, pattern);
  const sparse::Layout layout = sparse::checked_layout(name, rf);
  const Arg mask_arg{name, "mask", mask};
  core::check_view(mask_arg, 2, 2);
  core::check_dtype(mask_arg, {DType::boolean});
  const std::int64_t S = layout.tokens;
  if (mask.shape[0] != S || mask.shape[1] != S) {
    core::fail(name, "mask " + core::shape_string(mask) + " must be [S, S] = [" +
                         std::to_string(S) + ", " + std::to_string(S) + "] (" +
                         sparse::describe(layout) + ")");
  }
  core::check_writable(mask_arg);

  const auto plan = sparse::cached_plan(pattern, layout);
  const std::int32_t* order = plan->order.data();
  const std::int32_t* window = plan->window.data();
  const std::int64_t sink_end = plan->sink_end, row_stride = mask.strides[0];
  auto* base = static_cast<std::uint8_t*>(mask.data);
  // Each row: cleared, then the kept key positions (the sink and the row's window) mapped back
  // to tokens. Work proportional to the kept pairs plus one pass over the row.
  core::parallel_ranges(S, core::threads_for_bytes(CheckedSize(S).value * S),
                        [&](std::int64_t begin, std::int64_t end, int) {
                          for (std::int64_t token = begin; token < end; ++token) {
                            std::uint8_t* row = base + token * row_stride;
                            const std::int64_t position = plan->position[token];
                            const std::int64_t first = window[2 * position],
                                               last = window[2 * position + 1];
                            if (first == 0 && last == S) {
                              std::memset(row, 1, static_cast<std::size_t>(S));
                              continue;
                            }
                            std::memset(row, 0, static_cast<std::size_t>(S));
                            for (std::int64_t key = 0; key < sink_end; ++key) row[order[key]] = 1;
                            for (std::int64_t key = std::max(first, sink_end); key < last; ++key) {
                              row[order[key]] = 1;
                            }
                          }
                        });
}

double rainfusion_density(HeadPattern pattern, const RainFusionOptions& rf) {
  constexpr const char* name = "rainfusion_density";
  const core::CallScope scope(name);
  pattern = sparse::checked_pattern(name, pattern);
  const sparse::Layout layout = sparse::checked_layout(name, rf);
  return sparse::cached_plan(pattern, layout)->density;
}

// ---- online head classification ----------------------------------------------------------------

namespace {

/// Sampled query rows per head: max(16, S / 200), at most the sparse video tokens.
std::int64_t sample_count(const sparse::Layout& layout) {
  const std::int64_t sparse_tokens =
      (layout.frames - layout.first_sparse_frame()) * layout.frame_size;
  return std::min(std::max<std::int64_t>(16, layout.tokens / 200), sparse_tokens);
}

/// `count` sparse video tokens equally spaced in (t, h, w) order: the middle of each of `count`
/// equal shares (distinct, since each share holds at least one token).
std::vector<std::int32_t> sample_tokens(const sparse::Layout& layout, std::int64_t count) {
  const std::int64_t sparse_tokens =
      (layout.frames - layout.first_sparse_frame()) * layout.frame_size;
  const std::int64_t first = layout.video_token(layout.first_sparse_frame(), 0, 0);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    // (2i + 1) * sparse_tokens < 2 * count * 2^31: no overflow.
    tokens[i] = static_cast<std::int32_t>(first + (2 * i + 1) * sparse_tokens / (2 * count));
  }
  return tokens;
}

/// Probability mass of one softmax row (`weights`, indexed by key token) on the keys `plan`
/// keeps for query `token`.
double kept_mass(const sparse::PatternPlan& plan, std::int64_t token, const float* weights) {
  const std::int64_t position = plan.position[token];
  const std::int64_t first = plan.window[2 * position], last = plan.window[2 * position + 1];
  double mass = 0;
  for (std::int64_t key = 0; key < plan.sink_end; ++key) mass += weights[plan.order[key]];
  for (std::int64_t key = std::max(first, plan.sink_end); key < last; ++key) {
    mass += weights[plan.order[key]];
  }
  return mass;
}

}  // namespace

std::vector<HeadPattern> rainfusion_classify(const TensorView& q, const TensorView& k,
                                             const RainFusionOptions& rf,
                                             const AttentionOptions& options) {
  constexpr const char* name = "rainfusion_classify";
  const core::CallScope scope(name);
  const sparse::Layout layout = sparse::checked_layout(name, rf);
  const attention::Call call = attention::validate_dense(name, q, k, k, nullptr, options);
  const attention::FlashProblem& p = call.problem;
  sparse::check_self_attention(name, p.q_len, p.kv_len, layout, options);

  // One pattern per (batch, head): q and k may be broadcast views of any batch size.
  core::check_allocation(core::CheckedSize(p.batch) * p.heads, sizeof(HeadPattern));
  std::vector<HeadPattern> result(static_cast<std::size_t>(p.batch * p.heads),
                                  HeadPattern::spatial);
  const std::int64_t samples = sample_count(layout);
  if (samples == 0 || result.empty()) return result;  // no sparse video query to judge
  const std::vector<std::int32_t> tokens = sample_tokens(layout, samples);
  const auto temporal = sparse::cached_plan(HeadPattern::temporal, layout);
  const auto spatial = sparse::cached_plan(HeadPattern::spatial, layout);

  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using MatrixMap = Eigen::Map<Matrix, Eigen::Aligned64>;
  constexpr std::int64_t kRows = 32;  // sampled rows per GEMM: 32 x S fp32 scores
  const std::int64_t S = layout.tokens, dk = p.dk, group = p.heads / p.kv_heads;
  const std::int64_t rows_per_head = std::min(kRows, samples);
  const std::int64_t tasks = p.batch * p.kv_heads;
  const int threads = static_cast<int>(std::min<std::int64_t>(core::thread_count(), tasks));
  ThreadSlices<float> keys(threads, CheckedSize(S) * dk);
  ThreadSlices<float> queries(threads, CheckedSize(rows_per_head) * dk);
  ThreadSlices<float> scores(threads, CheckedSize(rows_per_head) * S);
  const float scale = call.scale;
  const double threshold = layout.recall_threshold;

  // One task per (batch, KV head): its keys gathered once as fp32 [S, Dk], reused by the group's
  // query heads; each head scores its sampled rows against all keys, rows_per_head at a time.
  core::parallel_tasks(tasks, threads, [&](std::int64_t task, int thread) {
    const std::int64_t batch = task / p.kv_heads, kv_head = task % p.kv_heads;
    float* key_rows = keys.slice(thread);
    for (std::int64_t token = 0; token < S; ++token) {
      load_row(p.dtype, p.k, element_offset(p.k_strides, batch, token, kv_head), dk,
               key_rows + token * dk);
    }
    const MatrixMap key_matrix(key_rows, S, dk);
    for (std::int64_t head = kv_head * group; head < (kv_head + 1) * group; ++head) {
      double recall_temporal = 0, recall_spatial = 0;
      for (std::int64_t row0 = 0; row0 < samples; row0 += rows_per_head) {
        const std::int64_t rows = std::min(rows_per_head, samples - row0);
        float* query_rows = queries.slice(thread);
        for (std::int64_t r = 0; r < rows; ++r) {
          load_row(p.dtype, p.q, element_offset(p.q_strides, batch, tokens[row0 + r], head), dk,
                   query_rows + r * dk);
        }
        MatrixMap score_rows(scores.slice(thread), rows, S);
        score_rows.noalias() = MatrixMap(query_rows, rows, dk) * key_matrix.transpose();
        for (std::int64_t r = 0; r < rows; ++r) {
          // Exact softmax of the scaled row, max-subtracted; the weights replace the scores.
          float* weights = score_rows.data() + r * S;
          float top = -std::numeric_limits<float>::infinity();
          for (std::int64_t key = 0; key < S; ++key) top = std::max(top, weights[key] * scale);
          double total = 0;
          for (std::int64_t key = 0; key < S; ++key) {
            weights[key] = std::exp(weights[key] * scale - top);
            total += weights[key];
          }
          const std::int64_t token = tokens[row0 + r];
          recall_temporal += kept_mass(*temporal, token, weights) / total;
          recall_spatial += kept_mass(*spatial, token, weights) / total;
        }
      }
      recall_temporal /= static_cast<double>(samples);
      recall_spatial /= static_cast<double>(samples);
      // NaN recalls (non-finite q or k) fail both comparisons: textural.
      result[batch * p.heads + head] = recall_temporal >= threshold  ? HeadPattern::temporal
                                       : recall_spatial >= threshold ? HeadPattern::spatial
                                                                     : HeadPattern::textural;
    }
  });
  return result;
}

// ---- RainFusion 2 adaptive blocks --------------------------------------------------------------

namespace {

/// Key blocks each query block keeps: ceil((1 - sparsity) x blocks), at least 1. The product is
/// lowered by a relative 1e-6 first, so that a float sparsity meant as a decimal (0.64f is
/// 0.63999998...) does not round an exact block count up by one.
std::int64_t kept_blocks(float sparsity, std::int64_t blocks) {
  const double wanted = (1.0 - static_cast<double>(sparsity)) * static_cast<double>(blocks);
  const auto kept = static_cast<std::int64_t>(std::ceil(wanted * (1.0 - 1e-6)));
  return std::clamp<std::int64_t>(kept, 1, blocks);
}

/// Blocks holding a text token or (dense_first_frame) a frame-0 token, in native token order.
std::vector<std::uint8_t> forced_blocks(const sparse::Layout& l, std::int64_t block_size,
                                        std::int64_t blocks) {
  std::vector<std::uint8_t> forced(static_cast<std::size_t>(blocks), 0);
  auto mark = [&](std::int64_t first, std::int64_t count) {
    if (count <= 0) return;
    for (std::int64_t b = first / block_size; b <= (first + count - 1) / block_size; ++b) {
      forced[b] = 1;
    }
  };
  mark(l.first_text, l.text);
  if (l.dense_first_frame) mark(l.first_video, l.frame_size);
  return forced;
}

/// Mean over the tokens of each block of one (batch, head) row set of q or k, in fp64:
/// pooled[block * dk + d]; `row` is scratch of dk floats.
void pool_blocks(DType dtype, const void* base, const attention::Strides& strides,
                 std::int64_t batch, std::int64_t head, std::int64_t tokens, std::int64_t dk,
                 std::int64_t block_size, float* row, double* pooled) {
  const std::int64_t blocks = (tokens + block_size - 1) / block_size;
  for (std::int64_t block = 0; block < blocks; ++block) {
    double* sum = pooled + block * dk;
    std::fill(sum, sum + dk, 0.0);
    const std::int64_t first = block * block_size, last = std::min(tokens, first + block_size);
    for (std::int64_t token = first; token < last; ++token) {
      load_row(dtype, base, element_offset(strides, batch, token, head), dk, row);
      for (std::int64_t d = 0; d < dk; ++d) sum[d] += row[d];
    }
    const double inverse = 1.0 / static_cast<double>(last - first);
    for (std::int64_t d = 0; d < dk; ++d) sum[d] *= inverse;
  }
}

}  // namespace

void rainfusion_adaptive_blocks(const TensorView& q, const TensorView& k,
                                const RainFusionOptions& rf, int block_size,
                                const TensorView& block_mask, const AttentionOptions& options) {
  constexpr const char* name = "rainfusion_adaptive_blocks";
  const core::CallScope scope(name);
  if (block_size != 64 && block_size != 128) {
    core::fail(name, "block_size (" + std::to_string(block_size) + ") must be 64 or 128");
  }
  const sparse::Layout layout = sparse::checked_layout(name, rf);
  const attention::Call call = attention::validate_dense(name, q, k, k, nullptr, options);
  const attention::FlashProblem& p = call.problem;
  sparse::check_self_attention(name, p.q_len, p.kv_len, layout, options);
  const std::int64_t S = layout.tokens, blocks = (S + block_size - 1) / block_size;
  const Arg mask_arg{name, "block_mask", block_mask}, q_arg{name, "q", q}, k_arg{name, "k", k};
  core::check_view(mask_arg, 4, 4);
  core::check_dtype(mask_arg, {DType::boolean});
  const std::int64_t want[4] = {p.batch, p.heads, blocks, blocks};
  for (int d = 0; d < 4; ++d) {
    if (block_mask.shape[d] != want[d]) {
      core::fail(name, "block_mask " + core::shape_string(block_mask) +
                           " must be [B, N, ceil(S / block_size), ceil(S / block_size)] = [" +
                           std::to_string(want[0]) + ", " + std::to_string(want[1]) + ", " +
                           std::to_string(blocks) + ", " + std::to_string(blocks) + "]");
    }
  }
  core::check_writable(mask_arg);
  for (const Arg* in : {&q_arg, &k_arg}) {
    if (core::numel(in->view) > 0) core::check_no_overlap(mask_arg, *in, false);
  }
  if (core::numel(block_mask) == 0) return;

  const std::vector<std::uint8_t> forced = forced_blocks(layout, block_size, blocks);
  std::vector<std::int32_t> free_blocks;  // the key blocks ranked per row
  for (std::int64_t j = 0; j < blocks; ++j) {
    if (!forced[j]) free_blocks.push_back(static_cast<std::int32_t>(j));
  }
  const std::int64_t forced_count = blocks - static_cast<std::int64_t>(free_blocks.size());
  // Forced key blocks count toward the budget: a free row keeps max(forced, kept) blocks.
  const std::int64_t ranked =
      std::max<std::int64_t>(0, kept_blocks(layout.sparsity, blocks) - forced_count);

  using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using MatrixMap = Eigen::Map<Matrix, Eigen::Aligned64>;
  const std::int64_t dk = p.dk, group = p.heads / p.kv_heads, tasks = p.batch * p.kv_heads;
  const int threads = static_cast<int>(std::min<std::int64_t>(core::thread_count(), tasks));
  ThreadSlices<double> pooled_keys(threads, CheckedSize(blocks) * dk);
  ThreadSlices<double> pooled_queries(threads, CheckedSize(blocks) * dk);
  ThreadSlices<double> scores(threads, CheckedSize(blocks) * blocks);
  ThreadSlices<float> rows(threads, CheckedSize(dk));
  ThreadSlices<std::int32_t> candidates(threads, CheckedSize(blocks));
  const double scale = call.scale;
  auto* base = static_cast<std::uint8_t*>(block_mask.data);
  const std::int64_t* strides = block_mask.strides.data();

  core::parallel_tasks(tasks, threads, [&](std::int64_t task, int thread) {
    const std::int64_t batch = task / p.kv_heads, kv_head = task % p.kv_heads;
    double* key_pool = pooled_keys.slice(thread);
    pool_blocks(p.dtype, p.k, p.k_strides, batch, kv_head, S, dk, block_size, rows.slice(thread),
                key_pool);
    for (std::int64_t head = kv_head * group; head < (kv_head + 1) * group; ++head) {
      double* query_pool = pooled_queries.slice(thread);
      pool_blocks(p.dtype, p.q, p.q_strides, batch, head, S, dk, block_size, rows.slice(thread),
                  query_pool);
      MatrixMap score(scores.slice(thread), blocks, blocks);
      score.noalias() =
          MatrixMap(query_pool, blocks, dk) * MatrixMap(key_pool, blocks, dk).transpose();
      score *= scale;
      std::int32_t* order = candidates.slice(thread);
      for (std::int64_t i = 0; i < blocks; ++i) {
        std::uint8_t* out = base + batch * strides[0] + head * strides[1] + i * strides[2];
        if (forced[i]) {
          std::memset(out, 1, static_cast<std::size_t>(blocks));
          continue;
        }
        for (std::int64_t j = 0; j < blocks; ++j) out[j] = forced[j];
        // The `ranked` free key blocks of highest pooled score, ties (and NaN, ranked lowest)
        // to the lower block index.
        const double* row = score.data() + i * blocks;
        auto rank_of = [&](std::int32_t j) {
          return std::isnan(row[j]) ? -std::numeric_limits<double>::infinity() : row[j];
        };
        std::copy(free_blocks.begin(), free_blocks.end(), order);
        std::partial_sort(order, order + ranked, order + free_blocks.size(),
                          [&](std::int32_t a, std::int32_t b) {
                            const double ra = rank_of(a), rb = rank_of(b);
                            return ra > rb || (ra == rb && a < b);
                          });
        for (std::int64_t r = 0; r < ranked; ++r) out[order[r]] = 1;
      }
    }
  });
}

}  // namespace ditops
