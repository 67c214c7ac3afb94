#pragma once
// int8 attention kernels: the operands the int8 backend prepares once per call (K and V
// quantized per block of kKvBlock keys, the keys' smoothing means, the shared schedule's stage
// order), the per-thread scratch a task needs, and the per-ISA kernels that quantize the
// operands and run a task on them. The problem itself is the flash kernels' FlashProblem.

#include <cstdint>

#include "ops/attention/attention_kernel.hpp"
#include "ops/schedule/schedule.hpp"

namespace ditops::attention {

/// Micro-tiles per row group of the int8 kernel: fewer as the chunk grows, so the S and P of
/// one chunk (chunk x rows x 64 keys x 5 bytes, ~30 KiB) stay in L1 next to a K and a V block.
inline constexpr int int8_row_group(int chunk) noexcept { return kMaxRowGroup / chunk; }

/// Operands of the int8 backend, prepared once per call (int8.cpp, Int8Backend) and indexed by
/// a global KV block number g (first_block[seq * kv_heads + h] + block in sequence). K is
/// smoothed (its per-(sequence, KV head) mean subtracted, which leaves the softmax as it was)
/// and quantized per block to [-127, 127], V per block and channel; see int8_kernel.cpp.
struct Int8Operands {
  std::int64_t dk_words = 0;      ///< ceil(dk / 4): 4 int8 of one key per 32-bit word
  std::int8_t* k = nullptr;       ///< block g at g * dk_words * 256: [dk_words][64 keys][4]
  std::int32_t* k_sum = nullptr;  ///< block g at g * 64: 128 * sum_d k per key (any level)
  float* k_scale = nullptr;       ///< [g]: value = int8 * scale
  float* k_mean = nullptr;        ///< [seq * kv_heads + h][dk] subtracted before quantizing
  std::int8_t* v = nullptr;       ///< block g at g * 64 * dv_padded: [16 words][dv_padded][4]
  float* v_scale = nullptr;       ///< block g at g * dv_padded: per channel
  const std::int64_t* first_block = nullptr;
  /// The shared schedule's cube order (QK, PV) for the longest sequence's blocks; a row group
  /// with fewer blocks skips the later ones. A plain array: kernel objects instantiate no
  /// std::vector code (ODR guard).
  const schedule::StageInstance* order = nullptr;
  std::int64_t order_size = 0;
  int chunk = 2;                     ///< options.int8_chunk: QK blocks ahead of their PV
  int row_group = kMaxRowGroup / 2;  ///< int8_row_group(chunk)
};

/// Bytes of per-thread scratch an int8 task needs (any ISA, any chunk).
inline std::int64_t int8_scratch_bytes(const FlashProblem& p, const Int8Operands& op) noexcept {
  const std::int64_t rows = kMaxRowGroup * kMaxTileRows;
  const std::int64_t buffers = 2 * 4;  // ping-pong slots x the largest chunk
  const std::int64_t q_stride = (op.dk_words * 4 + 63) / 64 * 64;
  return rows * q_stride                      // Q as int8
         + rows * (4 + 2 * kMaxLanes) * 4     // q factor, LSE shift, max, two sums
         + rows * p.dv_padded * 4             // O
         + buffers * rows * kKvBlock * 5      // S (int32) and P (u8)
         + buffers * rows * 2 * 4             // P factor, alpha
         + buffers * kMaxRowGroup * 8 + 256;  // keys per tile; alignment
}

/// Quantizes the keys and values of one (sequence, KV head) into `op` (first_block must be
/// set). With `mean` set, first writes the head's key mean there (dk floats) and subtracts it
/// (smoothing).
template <class Arch>
void int8_quantize_kv_head(const FlashProblem& problem, const Int8Operands& op, std::int64_t seq,
                           std::int64_t kv_head, float* mean) noexcept;

/// Runs one task with the int8 pipeline; scratch: int8_scratch_bytes(), 64-byte aligned.
template <class Arch>
void int8_attention_task(const FlashProblem& problem, const Int8Operands& op, const FlashTask& task,
                         float* scratch) noexcept;

}  // namespace ditops::attention
