// Public attention entries: validate, describe the problem once (FlashProblem), choose a
// backend and tiles (forced, cached or tuned), pack K and V once per call, then run
// a cost-ordered task list on the thread team; short-Sq calls split the KV range across
// threads and merge the partial results by their log-sum-exp.

#define EIGEN_DONT_PARALLELIZE  // the reference runs inside our own threads
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "ops/attention/attention_kernel.hpp"
#include "ops/attention/backends.hpp"
#include "ops/attention/call.hpp"
#include "ops/attention/int8.hpp"
#include "ops/attention/tuner.hpp"
#include "ops/core/check.hpp"
#include "ops/core/isa.hpp"
#include "ops/core/log2_domain.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"
#include "ops/schedule/split_plan.hpp"
#include "ops/sparse/block_sparse.hpp"

namespace ditops {

const char* backend_name(AttentionBackend backend) noexcept {
  if (backend == AttentionBackend::automatic) return "automatic";
  const attention::Backend* entry = attention::find_backend(backend);
  return entry ? entry->name : "unknown";
}

namespace attention {

bool bf16_dot_available() noexcept { return core::kernel_variant() == core::kAvx512Bf16Variant; }

namespace {

using core::Arg;
using core::kLog2e;
using core::kMinusInf;
using core::numel;

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

/// `backend` if it is one of the enum's values: a value cast from an integer would otherwise
/// run as whatever the switches fall through to.
AttentionBackend checked_backend(const char* call, AttentionBackend backend) {
  if (backend == AttentionBackend::automatic || find_backend(backend)) return backend;
  core::fail(call, "options.backend (" + std::to_string(static_cast<int>(backend)) +
                       ") is not an AttentionBackend");
}

float checked_scale(const char* call, const std::optional<float>& scale, std::int64_t dk) {
  return core::check_softmax_scale(call, "scale", scale, 1.f / std::sqrt(static_cast<float>(dk)));
}

void check_heads(const Arg& q, int q_dim, const Arg& k, int k_dim) {
  const std::int64_t heads = q.view.shape[q_dim], kv_heads = k.view.shape[k_dim];
  if (kv_heads == 0 || heads % kv_heads != 0) {
    core::fail(q.call, std::string(q.name) + ".shape[" + std::to_string(q_dim) + "] (" +
                           std::to_string(heads) + " heads) must be a multiple of " + k.name +
                           ".shape[" + std::to_string(k_dim) + "] (" + std::to_string(kv_heads) +
                           " KV heads)");
  }
}

void check_head_dim(const Arg& arg, int dim) {
  if (arg.view.shape[dim] < 1) {
    core::fail(arg.call, std::string(arg.name) + ".shape[" + std::to_string(dim) + "] (" +
                             std::to_string(arg.view.shape[dim]) + ") must be >= 1");
  }
}

/// Bounds every size pack_operands, Int8Backend and run_flash compute (packed K and V, per-row
/// outputs, LSE and split partials, per-thread scratch) with overflow checks, before any of them
/// is computed: where the bound fits int64 they do too, and aligned_array turns a size the
/// machine cannot hold into an Error. `kv_rows` and `q_rows` count rows over the whole batch.
/// (Split partials: fewer tasks than 2 x threads, so rows x splits < 4 x threads x task rows.)
void check_workspace(const char* name, const FlashProblem& p, core::CheckedSize kv_rows,
                     core::CheckedSize q_rows) {
  using core::CheckedSize;
  const std::int64_t task_rows = kMaxRowGroup * kMaxTileRows;
  const CheckedSize width = (CheckedSize(p.dk) + 31) * 2 + CheckedSize(p.dv_padded) * 4 +
                            kKvBlock * 16 + 64;  // per row, in floats, with the int8 layouts
  const CheckedSize kv_padded = kv_rows + CheckedSize(p.batch) * kKvBlock;
  const CheckedSize rows = kv_padded * p.kv_heads + q_rows * p.heads * 2 +
                           CheckedSize(task_rows) * 4 * core::kMaxThreads;
  if ((rows * width * 8).overflow) {
    core::fail(name, "q, k and v (Dk " + std::to_string(p.dk) + ", Dv " + std::to_string(p.dv) +
                         ", " + std::to_string(p.heads) +
                         " heads) need more than 2^63 bytes of workspace");
  }
}

/// Refuses an additive mask element above kAdditiveMaskLimit (+inf included): the one value
/// range whose softmax the backends would compute differently. One pass over the mask, next to
/// attention's Dk multiply-adds per mask element.
void check_additive_mask_range(const char* name, const TensorView& mask) {
  const float* data = static_cast<const float*>(mask.data);
  std::int64_t index[4] = {0, 0, 0, 0};
  const std::int64_t rows = numel(mask) / mask.shape[mask.rank - 1];
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t offset = 0, rest = row;
    for (int d = mask.rank - 2; d >= 0; --d) {
      index[d] = rest % mask.shape[d];
      rest /= mask.shape[d];
      offset += index[d] * mask.strides[d];
    }
    const std::int64_t last = mask.shape[mask.rank - 1];
    for (std::int64_t j = 0; j < last; ++j) {
      if (!(data[offset + j] > kAdditiveMaskLimit)) continue;
      index[mask.rank - 1] = j;
      std::string where;
      for (int d = 0; d < mask.rank; ++d) where += (d ? ", " : "") + std::to_string(index[d]);
      char text[160];
      std::snprintf(text, sizeof text,
                    "] (%g) is above 2^126: an additive mask element must be at most 2^126 "
                    "(-inf or below -2^126 excludes a key)",
                    static_cast<double>(data[offset + j]));
      core::fail(name, "attn_mask[" + where + text);
    }
  }
}

}  // namespace

/// Validates the four tensors of a dense call (layout dims: batch, seq, head).
Call validate_dense(const char* name, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView* out, const AttentionOptions& options) {
  const Arg q_arg{name, "q", q}, k_arg{name, "k", k}, v_arg{name, "v", v};
  const int seq_dim = options.head_first ? 2 : 1, head_dim = options.head_first ? 1 : 2;
  core::check_view(q_arg, 4, 4);
  core::check_dtype(q_arg, {DType::f32, DType::bf16, DType::f16});
  for (const Arg* arg : {&k_arg, &v_arg}) {
    core::check_view(*arg, 4, 4);
    core::check_same_dtype(*arg, q_arg);
  }
  core::check_dim(k_arg, 0, q_arg, 0);
  core::check_dim(v_arg, 0, q_arg, 0);
  core::check_dim(k_arg, 3, q_arg, 3);
  core::check_dim(v_arg, seq_dim, k_arg, seq_dim);
  core::check_dim(v_arg, head_dim, k_arg, head_dim);
  check_head_dim(q_arg, 3);
  check_head_dim(v_arg, 3);
  check_heads(q_arg, head_dim, k_arg, head_dim);
  const std::int64_t batch = q.shape[0], q_len = q.shape[seq_dim], kv_len = k.shape[seq_dim];
  const std::int64_t heads = q.shape[head_dim];

  Call call;
  FlashProblem& p = call.problem;
  call.scale = checked_scale(name, options.scale, q.shape[3]);
  p.dtype = q.dtype;
  p.dk = q.shape[3];
  p.dv = v.shape[3];
  p.dv_padded = round_up(p.dv, 16);
  p.heads = heads;
  p.kv_heads = k.shape[head_dim];
  p.batch = batch;
  p.q_len = q_len;
  p.kv_len = kv_len;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  auto strides_of = [&](const TensorView& t) {
    return Strides{t.strides[0], t.strides[seq_dim], t.strides[head_dim]};
  };
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.scale_log2 = call.scale * kLog2e;
  p.causal = options.causal;

  std::string mask_key = "none";
  const TensorView& mask = options.attn_mask;
  if (!mask.empty() || mask.rank != 0) {
    const Arg mask_arg{name, "attn_mask", mask};
    core::check_view(mask_arg, 2, 4);
    core::check_dtype(mask_arg, {DType::boolean, DType::f32});
    if (mask.rank == 3) {
      core::fail(name,
                 "attn_mask has rank 3; expected rank 2 [Sq, Sk] or rank 4 "
                 "[B|1, N|1, Sq|1, Sk]");
    }
    const std::int64_t want[4] = {batch, heads, q_len, kv_len};
    const int first = 4 - mask.rank;
    for (int d = 0; d < mask.rank; ++d) {
      const std::int64_t extent = mask.shape[d], expected = want[first + d];
      const bool last = d == mask.rank - 1;
      if (extent != expected && (last || extent != 1)) {
        core::fail(name, "attn_mask " + core::shape_string(mask) +
                             " is not broadcastable to [B|1, N|1, Sq|1, Sk] = [" +
                             std::to_string(batch) + "|1, " + std::to_string(heads) + "|1, " +
                             std::to_string(q_len) + "|1, " + std::to_string(kv_len) + "]");
      }
      p.mask_strides[first + d] = extent == 1 && !last ? 0 : mask.strides[d];
    }
    p.mask_strides[3] = 1;
    p.mask_kind = mask.dtype == DType::boolean ? MaskKind::boolean : MaskKind::additive;
    p.mask = mask.data;
    mask_key =
        std::string(mask.dtype == DType::boolean ? "bool" : "f32") + core::shape_string(mask);
    if (numel(mask) == 0) p.mask_kind = MaskKind::none;
    if (p.mask_kind == MaskKind::additive) check_additive_mask_range(name, mask);
  }

  std::vector<const Arg*> inputs = {&q_arg, &k_arg, &v_arg};
  const Arg mask_arg{name, "attn_mask", mask};
  if (!mask.empty()) inputs.push_back(&mask_arg);
  if (out) {
    const Arg out_arg{name, "out", *out};
    core::check_view(out_arg, 4, 4);
    core::check_same_dtype(out_arg, q_arg);
    core::check_dim(out_arg, 0, q_arg, 0);
    core::check_dim(out_arg, seq_dim, q_arg, seq_dim);
    core::check_dim(out_arg, head_dim, q_arg, head_dim);
    core::check_dim(out_arg, 3, v_arg, 3);
    for (const Arg* in : inputs) {
      if (numel(in->view) > 0) core::check_no_overlap(out_arg, *in, false);
    }
    core::check_writable(out_arg);
    p.out = out->data;
    p.out_strides = strides_of(*out);
  }
  const TensorView& lse = options.lse;
  if (!lse.empty() || lse.rank != 0) {
    const Arg lse_arg{name, "lse", lse};
    core::check_view(lse_arg, 3, 3);
    core::check_dtype(lse_arg, {DType::f32});
    if (lse.shape[0] != batch || lse.shape[1] != heads || lse.shape[2] != q_len) {
      core::fail(name, "lse " + core::shape_string(lse) + " must be [B, N, Sq] = [" +
                           std::to_string(batch) + ", " + std::to_string(heads) + ", " +
                           std::to_string(q_len) + "]");
    }
    core::check_writable(lse_arg);
    for (const Arg* in : inputs) {
      if (numel(in->view) > 0) core::check_no_overlap(lse_arg, *in, false);
    }
    if (out) core::check_no_overlap(lse_arg, Arg{name, "out", *out}, false);
    p.lse = static_cast<float*>(lse.data);
    p.lse_strides = Strides{lse.strides[0], lse.strides[2], lse.strides[1]};
    if (numel(lse) == 0) p.lse = nullptr;
  }
  call.requested = checked_backend(name, options.backend);
  if (!schedule::valid_chunk(options.int8_chunk)) {
    core::fail(name,
               "options.int8_chunk (" + std::to_string(options.int8_chunk) + ") must be 1, 2 or 4");
  }
  call.int8_chunk = options.int8_chunk;
  check_workspace(name, p, core::CheckedSize(batch) * kv_len, core::CheckedSize(batch) * q_len);
  call.layout = options.head_first ? "bnsd" : "bsnd";
  call.mask = mask_key;
  call.key = describe(call);
  return call;
}

namespace {

void check_cu_seqlens(const char* name, const char* arg, std::span<const std::int32_t> cu,
                      std::int64_t total, const char* tensor) {
  if (cu.empty()) core::fail(name, std::string(arg) + " is empty; it needs batch + 1 entries");
  if (cu[0] != 0) {
    core::fail(name, std::string(arg) + "[0] (" + std::to_string(cu[0]) + ") must be 0");
  }
  for (std::size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) {
      core::fail(name, std::string(arg) + "[" + std::to_string(i) + "] (" + std::to_string(cu[i]) +
                           ") is less than " + arg + "[" + std::to_string(i - 1) + "] (" +
                           std::to_string(cu[i - 1]) + "): offsets must be non-decreasing");
    }
  }
  if (cu.back() != total) {
    core::fail(name, std::string(arg) + " ends at " + std::to_string(cu.back()) + " but " + tensor +
                         ".shape[0] is " + std::to_string(total));
  }
}

// ---- execution --------------------------------------------------------------------------------

template <class T>
float element(const void* base, std::int64_t offset) {
  return to_float(static_cast<const T*>(base)[offset]);
}
float load_element(DType dtype, const void* base, std::int64_t offset) {
  switch (dtype) {
    case DType::bf16:
      return element<bf16>(base, offset);
    case DType::f16:
      return element<f16>(base, offset);
    default:
      return element<float>(base, offset);
  }
}
void store_element(DType dtype, void* base, std::int64_t offset, float value) {
  switch (dtype) {
    case DType::bf16:
      static_cast<bf16*>(base)[offset] = bf16::from_float(value);
      break;
    case DType::f16:
      static_cast<f16*>(base)[offset] = f16::from_float(value);
      break;
    default:
      static_cast<float*>(base)[offset] = value;
  }
}

using core::aligned_array;  // checked: a size the machine cannot hold is an Error

/// K^T blocks and contiguous fp32 V rows (bf16 key pairs for bf16 dot products), once per call,
/// shared by every task. The data lives in the calling thread's scratch (core::thread_scratch),
/// which later calls reuse.
struct Packed {
  float *k = nullptr, *v = nullptr;
  std::uint16_t *k_bf16 = nullptr, *v_bf16 = nullptr;
  std::vector<std::int64_t> k_offset, v_offset;
};

/// Packs the K and V heads `tasks` read (all of them for dense calls; a sparse pass may use a
/// few).
void pack_operands(FlashProblem& p, Packed& packed, const std::vector<FlashTask>& tasks,
                   int threads) {
  const bool pack_k = p.k_layout == KLayout::packed;
  // V is copied to contiguous fp32 rows once per call for prefill (every row group re-reads
  // it): rows read in place are a [B, S, N, D] stride apart, N·D·4 bytes (12 KiB at N=24,
  // D=128), which maps every row of a KV block to the same L1 sets and thrashes it. Decode-like
  // calls (K read in place) stream V rows once, which costs less than a copy.
  const bool pack_v = pack_k;
  if (!pack_k && !pack_v) return;
  const std::int64_t dk_padded = round_up(p.dk, 32);
  const std::int64_t heads_total = p.batch * p.kv_heads;
  packed.k_offset.resize(heads_total);
  packed.v_offset.resize(heads_total);
  std::int64_t k_total = 0, v_total = 0;
  struct Job {
    std::int64_t seq, head, block;
  };
  std::vector<Job> jobs;
  const std::int64_t k_block_elements = (p.bf16_dot ? dk_padded : p.dk) * kKvBlock;
  std::vector<char> used(heads_total, 0);
  for (const FlashTask& task : tasks) used[task.seq * p.kv_heads + task.kv_head] = 1;
  // One job per packed block: as many as a broadcast K's length allows, so sized (and checked)
  // before the list grows.
  core::CheckedSize job_count = 0;
  for (std::int64_t slot = 0; slot < heads_total; ++slot) {
    if (used[slot]) job_count = job_count + blocks_of(sequence_of(p, slot / p.kv_heads).kv_len);
  }
  core::checked_reserve(jobs, job_count);
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    const std::int64_t blocks = blocks_of(sequence_of(p, seq).kv_len);
    for (std::int64_t head = 0; head < p.kv_heads; ++head) {
      if (!used[seq * p.kv_heads + head]) continue;
      packed.k_offset[seq * p.kv_heads + head] = k_total;
      packed.v_offset[seq * p.kv_heads + head] = v_total;
      k_total += blocks * k_block_elements;
      v_total += blocks * kKvBlock * p.dv_padded;
      for (std::int64_t block = 0; block < blocks; ++block) jobs.push_back({seq, head, block});
    }
  }
  if (pack_k && p.bf16_dot) {
    packed.k_bf16 = core::thread_scratch<std::uint16_t>(core::ScratchUse::attention_k, k_total);
  } else if (pack_k) {
    packed.k = core::thread_scratch<float>(core::ScratchUse::attention_k, k_total);
  }
  if (pack_v && p.bf16_dot) {
    packed.v_bf16 = core::thread_scratch<std::uint16_t>(core::ScratchUse::attention_v, v_total);
  } else if (pack_v) {
    packed.v = core::thread_scratch<float>(core::ScratchUse::attention_v, v_total);
  }
  using WidenKernel = decltype(&widen_row<xsimd::sse2>);
  static const core::IsaTable<WidenKernel> widen_kernels = DITOPS_ISA_TABLE(widen_row);
  const WidenKernel widen = widen_kernels.get();
  const std::int64_t element_bytes = dtype_size(p.dtype);
  core::parallel_ranges(
      static_cast<std::int64_t>(jobs.size()), threads,
      [&](std::int64_t begin, std::int64_t end, int) {
        // fp32 rows are read in place; bf16 and f16 rows are widened into this thread's buffer.
        core::AlignedBuffer<float> widened(
            p.dtype == DType::f32 ? 0 : static_cast<std::size_t>(std::max(p.dk, p.dv)));
        const auto row_as_f32 = [&](const void* base, std::int64_t offset, std::int64_t count) {
          if (p.dtype == DType::f32) return static_cast<const float*>(base) + offset;
          widen(p.dtype, static_cast<const char*>(base) + offset * element_bytes, count,
                widened.data());
          return static_cast<const float*>(widened.data());
        };
        // bf16 words of a row: bf16 rows in place, others widened and rounded into slot 0 or
        // 1 of `words` (V's key pairs need two rows at once).
        const std::int64_t word_slot = std::max(p.dk, p.dv);
        core::AlignedBuffer<std::uint16_t> words(
            p.bf16_dot && p.dtype != DType::bf16 ? static_cast<std::size_t>(2 * word_slot) : 0);
        const auto row_as_bf16 = [&](const void* base, std::int64_t offset, std::int64_t count,
                                     int slot) {
          if (p.dtype == DType::bf16) return static_cast<const std::uint16_t*>(base) + offset;
          const float* row = row_as_f32(base, offset, count);
          std::uint16_t* dst = words.data() + slot * word_slot;
          for (std::int64_t i = 0; i < count; ++i) dst[i] = bf16::from_float(row[i]).bits;
          return static_cast<const std::uint16_t*>(dst);
        };
        const auto prefetch_row = [&](const void* base, std::int64_t offset, std::int64_t count) {
          const char* row = static_cast<const char*>(base) + offset * element_bytes;
          for (std::int64_t byte = 0; byte < count * element_bytes; byte += 64) {
            __builtin_prefetch(row + byte);
          }
        };
        for (std::int64_t j = begin; j < end; ++j) {
          const Job job = jobs[j];
          const Sequence s = sequence_of(p, job.seq);
          const std::int64_t first_key = job.block * kKvBlock;
          const std::int64_t keys = std::min(kKvBlock, s.kv_len - first_key);
          const std::int64_t slot = job.seq * p.kv_heads + job.head;
          // Offsets of the rows of the block's keys (in p.k_order when set).
          auto source_key = [&](std::int64_t key) {
            return s.k_row0 + (p.k_order ? p.k_order[first_key + key] : first_key + key);
          };
          auto k_row = [&](std::int64_t key) {
            return job.seq * p.k_strides.batch + job.head * p.k_strides.head +
                   source_key(key) * p.k_strides.seq;
          };
          if (pack_k && p.bf16_dot) {
            std::uint16_t* kt =
                packed.k_bf16 + packed.k_offset[slot] + job.block * k_block_elements;
            // Zeros only where no key row lands: past the sequence end and past dk.
            if (keys < kKvBlock || p.dk < dk_padded) {
              std::fill(kt, kt + k_block_elements, std::uint16_t{0});
            }
            // A pair of d (one 32-bit word) per store: kt[(d / 2) * 2 kKvBlock + 2 key + d % 2].
            for (std::int64_t key = 0; key < keys; ++key) {
              if (key + kPanel < keys) prefetch_row(p.k, k_row(key + kPanel), p.dk);
              const std::uint16_t* row = row_as_bf16(p.k, k_row(key), p.dk, 0);
              std::uint16_t* column = kt + 2 * key;
              for (std::int64_t d = 0; d + 1 < p.dk; d += 2) {
                std::memcpy(column + d * kKvBlock, row + d, 2 * sizeof(std::uint16_t));
              }
              if (p.dk % 2) column[(p.dk - 1) * kKvBlock] = row[p.dk - 1];
            }
          } else if (pack_k) {
            float* kt = packed.k + packed.k_offset[slot] + job.block * k_block_elements;
            if (keys < kKvBlock) std::fill(kt, kt + k_block_elements, 0.f);
            // A panel (kPanel keys x dk, 8 KiB at dk = 128) at a time, key by key: each K row is
            // read in order while its values scatter into the panel, which stays in L1. (Reading
            // the panel's keys d by d instead touches kPanel rows at once; rows N·D·4 bytes apart
            // share L1 sets, so those reads missed L1.) Rows a panel ahead are prefetched: each
            // row is a fresh page, and the misses overlap.
            for (std::int64_t key0 = 0; key0 < keys; key0 += kPanel) {
              const std::int64_t panel_end = std::min(keys, key0 + kPanel);
              for (std::int64_t key = panel_end; key < std::min(keys, panel_end + kPanel); ++key) {
                prefetch_row(p.k, k_row(key), p.dk);
              }
              float* panel = kt + packed_k_offset(key0, 0, p.dk);
              for (std::int64_t key = key0; key < panel_end; ++key) {
                const float* row = row_as_f32(p.k, k_row(key), p.dk);
                for (std::int64_t d = 0; d < p.dk; ++d) panel[d * kPanel + key - key0] = row[d];
              }
            }
          }
          auto v_row = [&](std::int64_t key) {
            return job.seq * p.v_strides.batch + job.head * p.v_strides.head +
                   source_key(key) * p.v_strides.seq;
          };
          if (pack_v && p.bf16_dot) {
            // Key pairs interleaved per column (packed_v_pair_offset); keys past the sequence
            // end and columns past dv are zero (P is 0 there, and 0 x garbage could be NaN).
            std::uint16_t* vp = packed.v_bf16 + packed.v_offset[slot] + first_key * p.dv_padded;
            if (keys < kKvBlock || p.dv < p.dv_padded) {
              std::fill(vp, vp + kKvBlock * p.dv_padded, std::uint16_t{0});
            }
            // A key pair per pass: its two words of a column in one 32-bit store.
            for (std::int64_t key = 0; key < keys; key += 2) {
              if (key + kPanel < keys) {
                prefetch_row(p.v, v_row(key + kPanel), p.dv);
                if (key + kPanel + 1 < keys) prefetch_row(p.v, v_row(key + kPanel + 1), p.dv);
              }
              const std::uint16_t* even = row_as_bf16(p.v, v_row(key), p.dv, 0);
              const std::uint16_t* odd =
                  key + 1 < keys ? row_as_bf16(p.v, v_row(key + 1), p.dv, 1) : nullptr;
              for (std::int64_t first = 0; first < p.dv; first += kPanel) {
                auto* dst = reinterpret_cast<std::uint32_t*>(vp + packed_v_pair_offset(key, first));
                const std::int64_t count = std::min(kPanel, p.dv - first);
                for (std::int64_t i = 0; i < count; ++i) {
                  const std::uint32_t high = odd ? odd[first + i] : 0;
                  dst[i] = even[first + i] | high << 16;
                }
              }
            }
          } else if (pack_v) {
            float* vp = packed.v + packed.v_offset[slot] + first_key * p.dv_padded;
            // Panels of kPanel columns, each [key][kPanel] (see FlashProblem::v_packed), filled
            // key by key so each V row is read in order; rows kVAhead keys ahead are prefetched
            // (as for K, every row is a fresh page).
            constexpr std::int64_t kVAhead = 16;
            for (std::int64_t key = 0; key < keys; ++key) {
              if (key + kVAhead < keys) prefetch_row(p.v, v_row(key + kVAhead), p.dv);
              const float* row = row_as_f32(p.v, v_row(key), p.dv);
              for (std::int64_t first = 0; first < p.dv_padded; first += kPanel) {
                const std::int64_t valid = std::clamp<std::int64_t>(p.dv - first, 0, kPanel);
                float* dst = vp + packed_v_offset(key, first);
                if (valid == kPanel) {  // a fixed size: copied inline, not a memmove call
                  std::memcpy(dst, row + first, kPanel * sizeof(float));
                  continue;
                }
                std::copy(row + first, row + first + valid, dst);
                std::fill(dst + valid, dst + kPanel, 0.f);
              }
            }
          }
        }
      });
  p.k_packed = packed.k;
  p.k_packed_bf16 = packed.k_bf16;
  p.k_packed_offset = packed.k_offset.data();
  p.v_packed = packed.v;
  p.v_packed_bf16 = packed.v_bf16;
  p.v_packed_offset = packed.v_offset.data();
}

/// Element offsets of one query row's output and LSE.
struct RowOffsets {
  std::int64_t out, lse;
};
RowOffsets row_offsets(const FlashProblem& p, std::int64_t seq, std::int64_t head,
                       std::int64_t pos) {
  const Sequence s = sequence_of(p, seq);
  return {
      seq * p.out_strides.batch + (s.q_row0 + pos) * p.out_strides.seq + head * p.out_strides.head,
      seq * p.lse_strides.batch + (s.q_row0 + pos) * p.lse_strides.seq + head * p.lse_strides.head};
}

}  // namespace

Call validate_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                     std::span<const std::int32_t> cu_q, std::span<const std::int32_t> cu_k,
                     const TensorView& out, const VarlenOptions& options) {
  constexpr const char* name = "attention_forward_varlen";
  const Arg q_arg{name, "q", q}, k_arg{name, "k", k}, v_arg{name, "v", v},
      out_arg{name, "out", out};
  core::check_view(q_arg, 3, 3);
  core::check_dtype(q_arg, {DType::f32, DType::bf16, DType::f16});
  for (const Arg* arg : {&k_arg, &v_arg, &out_arg}) {
    core::check_view(*arg, 3, 3);
    core::check_same_dtype(*arg, q_arg);
  }
  core::check_dim(k_arg, 2, q_arg, 2);
  core::check_dim(v_arg, 0, k_arg, 0);
  core::check_dim(v_arg, 1, k_arg, 1);
  core::check_dim(out_arg, 0, q_arg, 0);
  core::check_dim(out_arg, 1, q_arg, 1);
  core::check_dim(out_arg, 2, v_arg, 2);
  check_head_dim(q_arg, 2);
  check_head_dim(v_arg, 2);
  check_heads(q_arg, 1, k_arg, 1);
  if (cu_q.size() != cu_k.size()) {
    core::fail(name, "cu_seqlens_q has " + std::to_string(cu_q.size()) +
                         " entries but cu_seqlens_k has " + std::to_string(cu_k.size()));
  }
  check_cu_seqlens(name, "cu_seqlens_q", cu_q, q.shape[0], "q");
  check_cu_seqlens(name, "cu_seqlens_k", cu_k, k.shape[0], "k");
  Call call;
  FlashProblem& p = call.problem;
  call.scale = checked_scale(name, options.scale, q.shape[2]);
  p.dtype = q.dtype;
  p.dk = q.shape[2];
  p.dv = v.shape[2];
  p.dv_padded = round_up(p.dv, 16);
  p.heads = q.shape[1];
  p.kv_heads = k.shape[1];
  p.batch = static_cast<std::int64_t>(cu_q.size()) - 1;
  p.cu_q = cu_q.data();
  p.cu_k = cu_k.data();
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  auto strides_of = [](const TensorView& t) { return Strides{0, t.strides[0], t.strides[1]}; };
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.out_strides = strides_of(out);
  p.scale_log2 = call.scale * kLog2e;
  p.causal = options.causal;
  for (const Arg* in : {&q_arg, &k_arg, &v_arg}) {
    if (numel(in->view) > 0) core::check_no_overlap(out_arg, *in, false);
  }
  core::check_writable(out_arg);
  const TensorView& lse = options.lse;
  if (!lse.empty() || lse.rank != 0) {
    const Arg lse_arg{name, "lse", lse};
    core::check_view(lse_arg, 2, 2);
    core::check_dtype(lse_arg, {DType::f32});
    if (lse.shape[0] != p.heads || lse.shape[1] != q.shape[0]) {
      core::fail(name, "lse " + core::shape_string(lse) + " must be [N, Tq] = [" +
                           std::to_string(p.heads) + ", " + std::to_string(q.shape[0]) + "]");
    }
    core::check_writable(lse_arg);
    for (const Arg* in : {&q_arg, &k_arg, &v_arg, &out_arg}) {
      if (numel(in->view) > 0) core::check_no_overlap(lse_arg, *in, false);
    }
    p.lse = static_cast<float*>(lse.data);
    p.lse_strides = Strides{0, lse.strides[1], lse.strides[0]};
    if (numel(lse) == 0) p.lse = nullptr;
  }
  call.requested = checked_backend(name, options.backend);
  check_workspace(name, p, k.shape[0], q.shape[0]);
  call.layout = "varlen";
  call.key = describe(call);
  return call;
}

std::string describe(const Call& call) {
  const FlashProblem& p = call.problem;
  std::string text = call.layout == "varlen"
                         ? "varlen b" + std::to_string(p.batch) + " tq" +
                               std::to_string(p.cu_q[p.batch]) + " tk" +
                               std::to_string(p.cu_k[p.batch])
                         : "b" + std::to_string(p.batch) + " sq" + std::to_string(p.q_len) + " sk" +
                               std::to_string(p.kv_len);
  text += " n" + std::to_string(p.heads) + "/" + std::to_string(p.kv_heads) + " d" +
          std::to_string(p.dk) + "/" + std::to_string(p.dv) + " " + dtype_name(p.dtype);
  if (call.layout != "varlen") text += " " + call.layout + " mask:" + call.mask;
  return text + (p.causal ? " causal" : "") + (p.lse ? " lse" : "");
}

void run_flash_tasks(FlashProblem p, const std::vector<FlashTask>& tasks,
                     const std::vector<double>& cost, int threads, int int8_chunk) {
  if (tasks.empty()) return;
  using Kernel = decltype(&flash_task<xsimd::sse2>);
  static const core::IsaTable<Kernel> flash_kernels = DITOPS_ISA_TABLE(flash_task);
  const Kernel kernel = flash_kernels.get();
  // Handed out dynamically, the tasks of one (sequence, KV head) together, most expensive first,
  // and those heads by their most expensive task: consecutive tasks re-read the head's packed
  // K/V from L2/L3 (a plain cost order, under causal masking, cycles through every head's K/V
  // between two uses and measured 1.2x slower), and the tail of the schedule is short tasks.
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

  Packed packed;
  std::optional<Int8Backend> int8;
  if (int8_chunk > 0) {
    int8.emplace(p, int8_chunk, threads);
  } else {
    pack_operands(p, packed, tasks, threads);
  }
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
                           kernel(p, tasks[order[index]], task_scratch);
                         }
                       });
}

void run_flash(const FlashProblem& p, int threads, int int8_chunk) {
  if (p.batch == 0 || p.heads == 0) return;
  const std::int64_t group = p.heads / p.kv_heads;

  // Tasks: (sequence, KV head, block of query positions). ~96 rows (16 micro-tiles of 6) per
  // task amortize the row-group set-up; GQA heads count as rows of the same task.
  std::vector<FlashTask> tasks;
  std::vector<double> cost;
  std::int64_t longest_kv = 0;
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    const Sequence s = sequence_of(p, seq);
    longest_kv = std::max(longest_kv, s.kv_len);
    if (s.q_len == 0) continue;
    const std::int64_t q_block = std::max<std::int64_t>(1, 96 / group);
    for (std::int64_t head = 0; head < p.kv_heads; ++head) {
      for (std::int64_t q0 = 0; q0 < s.q_len; q0 += q_block) {
        FlashTask task;
        task.seq = seq;
        task.kv_head = head;
        task.q_begin = q0;
        task.q_end = std::min(s.q_len, q0 + q_block);
        task.kv_begin = 0;
        task.kv_end = s.kv_len;
        // Keys the last row of the block sees: with causal masking the later blocks cost more.
        std::int64_t keys = s.kv_len;
        if (p.causal) keys = std::clamp<std::int64_t>(task.q_end + s.kv_len - s.q_len, 0, s.kv_len);
        tasks.push_back(task);
        cost.push_back(static_cast<double>(task.q_end - q0) * group * (keys + kKvBlock));
      }
    }
  }
  // Split-KV: too few tasks to occupy the threads (decode-like shapes) and long enough KV: aim
  // at 2 tasks per thread, at least 4 blocks per split.
  const std::int64_t kv_blocks = (longest_kv + kKvBlock - 1) / kKvBlock;
  const std::int64_t splits =
      threads > 1
          ? schedule::kv_splits(static_cast<std::int64_t>(tasks.size()), 2 * threads, kv_blocks, 4)
          : 1;
  if (splits == 1) return run_flash_tasks(p, tasks, cost, threads, int8_chunk);

  const std::vector<FlashTask> base_tasks = tasks;
  std::int64_t rows_total = 0;
  for (const FlashTask& t : tasks) rows_total += group * (t.q_end - t.q_begin);
  auto partial_out = aligned_array<float>(rows_total * splits * p.dv_padded);
  auto partial_lse = aligned_array<float>(rows_total * splits);
  std::vector<FlashTask> split_tasks;
  std::vector<double> split_cost;
  std::int64_t row_offset = 0;
  for (const FlashTask& t : tasks) {
    const std::int64_t rows = group * (t.q_end - t.q_begin);
    const std::int64_t blocks = (t.kv_end + kKvBlock - 1) / kKvBlock;
    for (std::int64_t s = 0; s < splits; ++s) {
      FlashTask part = t;
      const schedule::BlockRange range = schedule::split_blocks(blocks, splits, s);
      part.kv_begin = std::min(t.kv_end, range.begin * kKvBlock);
      part.kv_end = std::min(t.kv_end, range.end * kKvBlock);
      part.partial_out = partial_out.get() + (row_offset * splits + s * rows) * p.dv_padded;
      part.partial_lse = partial_lse.get() + row_offset * splits + s * rows;
      split_tasks.push_back(part);
      split_cost.push_back(static_cast<double>(rows) * (part.kv_end - part.kv_begin));
    }
    row_offset += rows;
  }
  run_flash_tasks(p, split_tasks, split_cost, threads, int8_chunk);

  // Merge the splits of each row by their LSE (log2 domain): out = sum 2^(lse_s - lse) O_s.
  using MergeKernel = decltype(&flash_merge_splits<xsimd::sse2>);
  static const core::IsaTable<MergeKernel> merge_kernels = DITOPS_ISA_TABLE(flash_merge_splits);
  const MergeKernel merge = merge_kernels.get();
  std::vector<std::int64_t> task_rows(base_tasks.size() + 1, 0);
  for (std::size_t t = 0; t < base_tasks.size(); ++t) {
    task_rows[t + 1] = task_rows[t] + group * (base_tasks[t].q_end - base_tasks[t].q_begin);
  }
  auto merged = aligned_array<float>(p.dv_padded * threads);
  core::parallel_ranges(
      static_cast<std::int64_t>(base_tasks.size()), threads,
      [&](std::int64_t begin, std::int64_t end, int thread) {
        for (std::int64_t t = begin; t < end; ++t) {
          merge(p, base_tasks[t], splits, partial_out.get() + task_rows[t] * splits * p.dv_padded,
                partial_lse.get() + task_rows[t] * splits, merged.get() + thread * p.dv_padded);
        }
      });
}

void run_reference(const FlashProblem& p, float scale, int threads) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  constexpr std::int64_t kRows = 128;
  struct Job {
    std::int64_t seq, head, q0;
  };
  std::vector<Job> jobs;
  // Per thread, the materialized Q, K, V, scores and output (and Eigen's product temporaries)
  // of the longest sequence: checked here, since an allocation failing inside the thread team
  // would terminate the process. (Q rows are bounded by out; K rows may be a broadcast view.)
  std::int64_t longest_kv = 0;
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    longest_kv = std::max(longest_kv, sequence_of(p, seq).kv_len);
  }
  const core::CheckedSize per_thread =
      (core::CheckedSize(kRows) * (p.dk + p.dv) + core::CheckedSize(longest_kv) * (p.dk + p.dv) +
       core::CheckedSize(kRows) * longest_kv * 2) *
      2;
  core::check_allocation(per_thread * threads, sizeof(float));
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    const std::int64_t q_len = sequence_of(p, seq).q_len;
    for (std::int64_t head = 0; head < p.heads; ++head) {
      for (std::int64_t q0 = 0; q0 < q_len; q0 += kRows) jobs.push_back({seq, head, q0});
    }
  }
  const std::int64_t group = p.heads / p.kv_heads;
  core::parallel_tasks(static_cast<std::int64_t>(jobs.size()), threads, [&](std::int64_t j, int) {
    const Job job = jobs[j];
    const Sequence s = sequence_of(p, job.seq);
    const std::int64_t rows = std::min(kRows, s.q_len - job.q0);
    const std::int64_t kv_head = job.head / group;
    Matrix q(rows, p.dk), k(s.kv_len, p.dk), v(s.kv_len, p.dv);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t base = job.seq * p.q_strides.batch +
                                (s.q_row0 + job.q0 + r) * p.q_strides.seq +
                                job.head * p.q_strides.head;
      for (std::int64_t d = 0; d < p.dk; ++d) q(r, d) = load_element(p.dtype, p.q, base + d);
    }
    for (std::int64_t key = 0; key < s.kv_len; ++key) {
      const std::int64_t kb = job.seq * p.k_strides.batch + (s.k_row0 + key) * p.k_strides.seq +
                              kv_head * p.k_strides.head;
      const std::int64_t vb = job.seq * p.v_strides.batch + (s.k_row0 + key) * p.v_strides.seq +
                              kv_head * p.v_strides.head;
      for (std::int64_t d = 0; d < p.dk; ++d) k(key, d) = load_element(p.dtype, p.k, kb + d);
      for (std::int64_t d = 0; d < p.dv; ++d) v(key, d) = load_element(p.dtype, p.v, vb + d);
    }
    Matrix scores = (q * k.transpose()) * scale;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t pos = job.q0 + r;
      const std::int64_t visible =
          p.causal ? std::clamp<std::int64_t>(pos + s.kv_len - s.q_len + 1, 0, s.kv_len) : s.kv_len;
      const std::int64_t mask_row =
          job.seq * p.mask_strides[0] + job.head * p.mask_strides[1] + pos * p.mask_strides[2];
      float top = kMinusInf;
      for (std::int64_t key = 0; key < s.kv_len; ++key) {
        float& value = scores(r, key);
        if (key >= visible) value = kMinusInf;
        if (p.mask_kind == MaskKind::boolean &&
            !static_cast<const std::uint8_t*>(p.mask)[mask_row + key]) {
          value = kMinusInf;
        } else if (p.mask_kind == MaskKind::additive) {
          const float bias = static_cast<const float*>(p.mask)[mask_row + key];
          value = bias < -kAdditiveMaskLimit ? kMinusInf : value + bias;
        }
        top = std::max(top, value);
      }
      float sum = 0.f;
      for (std::int64_t key = 0; key < s.kv_len; ++key) {
        float& value = scores(r, key);
        value = top > kMinusInf ? std::exp(value - top) : 0.f;
        sum += value;
      }
      if (sum > 0.f) scores.row(r) /= sum;
      const RowOffsets offsets = row_offsets(p, job.seq, job.head, pos);
      if (p.lse) p.lse[offsets.lse] = sum > 0.f ? top + std::log(sum) : kMinusInf;
    }
    const Matrix out = scores * v;
    for (std::int64_t r = 0; r < rows; ++r) {
      const RowOffsets offsets = row_offsets(p, job.seq, job.head, job.q0 + r);
      for (std::int64_t d = 0; d < p.dv; ++d)
        store_element(p.dtype, p.out, offsets.out + d, out(r, d));
    }
  });
}

namespace {

/// What the caller sees of a choice: select_attention's answer, and AttentionOptions::ran.
AttentionChoice report(const Call& call, const Choice& choice) {
  std::string detail = find_backend(choice.config.backend)->describe(call, choice.config);
  detail += " kv_block=" + std::to_string(kKvBlock) + " isa=" + core::isa_name(core::active_isa());
  if (choice.forced) detail += " (forced)";
  if (!choice.refused.empty()) detail += " (" + choice.refused + ")";
  return AttentionChoice{choice.config.backend, detail, choice.from_cache};
}

void run_call(const Call& call, AttentionChoice* ran) {
  const Choice choice = choose(call, core::thread_count(), true);
  if (ran != nullptr) *ran = report(call, choice);
}

}  // namespace

}  // namespace attention

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const AttentionOptions& options) {
  const core::CallScope scope("attention_forward");
  const attention::Call call =
      attention::validate_dense("attention_forward", q, k, v, &out, options);
  attention::run_call(call, options.ran);
}

void attention_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              std::span<const std::int32_t> cu_seqlens_q,
                              std::span<const std::int32_t> cu_seqlens_k, const TensorView& out,
                              const VarlenOptions& options) {
  const core::CallScope scope("attention_forward_varlen");
  const attention::Call call =
      attention::validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out, options);
  attention::run_call(call, options.ran);
}

AttentionChoice select_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionOptions& options) {
  const core::CallScope scope("select_attention");
  attention::Call call = attention::validate_dense("select_attention", q, k, v, nullptr, options);
  // Tuning runs the call: give it an output (and LSE) of its own so no user memory is written.
  // Sizes fit int64: validate_dense bounded the workspace.
  attention::FlashProblem& p = call.problem;
  const std::int64_t rows = p.batch * p.q_len * p.heads;
  const auto out = core::aligned_array<float>(core::CheckedSize(rows) * p.dv * 2);
  const auto lse = core::aligned_array<float>(p.lse ? rows : 1);
  p.out = out.get();
  p.out_strides = attention::Strides{p.q_len * p.heads * p.dv, p.heads * p.dv, p.dv};
  if (p.lse) {
    p.lse = lse.get();
    p.lse_strides = attention::Strides{p.heads * p.q_len, 1, p.q_len};
  }
  return attention::report(call, attention::choose(call, core::thread_count(), false));
}

void forget_attention_tuning() { attention::forget_tuning(); }

}  // namespace ditops
