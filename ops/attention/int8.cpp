#include "ops/attention/int8.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ops/attention/amx_int8_attention.hpp"
#include "ops/attention/kernels.hpp"
#include "ops/core/threads.hpp"

namespace ditops::attention {
bool smooth_keys() {
  const char* env = std::getenv("DITOPS_INT8_SMOOTH_K");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

namespace {
std::atomic<Int8TaskKernel> task_kernel_override{nullptr};
}  // namespace

Int8TaskKernel int8_task_kernel() noexcept {
#if defined(DITOPS_AMX_COMPILED) && DITOPS_AMX_COMPILED
  if (core::amx_usable(core::AmxUnit::int8)) return &amx::int8_attention_task_amx<avx512_bf16>;
#endif
  return attention_kernels().int8_attention_task;
}

Int8TaskKernel override_int8_task_kernel(Int8TaskKernel kernel) noexcept {
  return task_kernel_override.exchange(kernel);
}

Int8Backend::Int8Backend(const FlashProblem& p, int chunk, int threads) : problem_(p) {
  const AttentionKernels& kernels = attention_kernels();
  const Int8TaskKernel chosen = task_kernel_override.load();
  task_kernel_ = chosen != nullptr ? chosen : int8_task_kernel();
  Int8Operands& op = operands_;
  op.chunk = chunk;
  op.row_group = int8_row_group(chunk);
  op.dk_words = (p.dk + 3) / 4;
  const std::int64_t heads_total = p.batch * p.kv_heads;
  first_block_.resize(heads_total);
  std::int64_t blocks_total = 0, max_blocks = 0;
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    const std::int64_t kv_len = p.cu_k ? p.cu_k[seq + 1] - p.cu_k[seq] : p.kv_len;
    const std::int64_t blocks = (kv_len + kKvBlock - 1) / kKvBlock;
    max_blocks = std::max(max_blocks, blocks);
    for (std::int64_t head = 0; head < p.kv_heads; ++head) {
      first_block_[seq * p.kv_heads + head] = blocks_total;
      blocks_total += blocks;
    }
  }
  // K and V in the calling thread's scratch, as flash's packed K and V (never both in one call).
  op.k = core::thread_scratch<std::int8_t>(
      core::ScratchUse::attention_k, core::CheckedSize(blocks_total) * op.dk_words * kKvBlock * 4);
  k_sum_ = core::aligned_array<std::int32_t>(blocks_total * kKvBlock);
  k_scale_ = core::aligned_array<float>(blocks_total);
  op.v = core::thread_scratch<std::int8_t>(
      core::ScratchUse::attention_v, core::CheckedSize(blocks_total) * kKvBlock * p.dv_padded);
  v_scale_ = core::aligned_array<float>(blocks_total * p.dv_padded);
  op.k_sum = k_sum_.get();
  op.k_scale = k_scale_.get();
  op.v_scale = v_scale_.get();
  op.first_block = first_block_.data();
  if (smooth_keys()) {
    k_mean_ = core::aligned_array<float>(heads_total * p.dk);
    op.k_mean = k_mean_.get();
  }
  // Per (sequence, KV head): its mean, then its blocks, while the keys are still in L2.
  const auto quantize = kernels.int8_quantize_kv_head;
  core::parallel_ranges(heads_total, threads, [&](std::int64_t begin, std::int64_t end, int) {
    for (std::int64_t h = begin; h < end; ++h) {
      quantize(p, op, h / p.kv_heads, h % p.kv_heads, op.k_mean ? op.k_mean + h * p.dk : nullptr);
    }
  });
  // The shared schedule's cube order for the longest sequence (shorter ones skip blocks).
  order_ = schedule::make_schedule(static_cast<int>(max_blocks), chunk).cube;
  op.order = order_.data();
  op.order_size = static_cast<std::int64_t>(order_.size());
}

std::int64_t Int8Backend::scratch_floats() const noexcept {
  return (int8_scratch_bytes(problem_, operands_) + 3) / 4;
}

void Int8Backend::run(const FlashTask& task, float* scratch) const noexcept {
  task_kernel_(problem_, operands_, task, scratch);
}

}  // namespace ditops::attention
