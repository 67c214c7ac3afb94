#pragma once
// Flash attention kernels: the problem the public entries validated (dense or varlen), the unit
// of work one thread runs, and the per-ISA kernel that runs it.

#include <cstdint>
#include <ditops/tensor.hpp>

namespace ditops::attention {

/// Keys per KV block: the unit of the online-softmax update. 64 keys give a 6 x 64 fp32 score
/// tile (24 zmm: the register file holds it) and a packed K^T block of 64 x Dk floats (32 KiB at
/// Dk = 128) that stays in a 48 KiB L1d next to the P tile while a row group reuses it.
inline constexpr std::int64_t kKvBlock = 64;
/// KV blocks per online-softmax step of flash_bf16 (fp32 steps are one block): the scores of a
/// step's blocks share one running-max update and one softmax pass, and P·V accumulates the
/// step's keys into the O registers before storing them, so O is loaded and stored once per 128
/// keys (at 64 keys, with a 96-row O tile of 48 KiB that does not stay in a 32 KiB L1d, those
/// loads and stores were 6 % of the kernel's time on Zen 4). The blocks stay packed (and
/// prefetched) one by one.
inline constexpr int kStepBlocks = 2;
inline constexpr std::int64_t kStepKeys = kStepBlocks * kKvBlock;
/// Query rows per micro-tile, at most (AVX-512 uses 6; narrower ISAs fewer).
inline constexpr std::int64_t kMaxTileRows = 6;
/// Micro-tiles a row group may hold (they share each K/V block while it is in L1). A KV head's
/// K^T and V (2 MiB at S = 2048, D = 128) do not fit next to the rest in a 2 MiB L2, so each row
/// group streams them from L3: 16 tiles (96 rows, a whole prefill task) read them once per 96
/// rows, where 4 tiles measured 8% slower.
inline constexpr int kMaxRowGroup = 16;
/// Width in floats of the panels packed K^T and V are stored in: one 64-byte cache line. A
/// register-tile pass reads whole, consecutive lines of each panel it touches (AVX2: one panel,
/// AVX-512: four). Read 16 or 64 columns at a time from rows 64 or Dv floats wide instead, a
/// pass's lines fell 256 or 512 bytes apart, into a quarter or an eighth of the L1 sets, where
/// on a 32 KiB L1d they evicted each other and the P and O rows (AVX2 P·V at 64 % of the FMA
/// peak with 64-float V rows).
inline constexpr std::int64_t kPanel = 16;

/// `value` rounded up to a multiple of `multiple`.
inline constexpr std::int64_t round_up(std::int64_t value, std::int64_t multiple) noexcept {
  return (value + multiple - 1) / multiple * multiple;
}

/// KV blocks covering `keys` keys.
inline constexpr std::int64_t blocks_of(std::int64_t keys) noexcept {
  return (keys + kKvBlock - 1) / kKvBlock;
}

/// Offset of K[key][d] in a packed K^T block ([kKvBlock / kPanel][dk][kPanel]).
inline constexpr std::int64_t packed_k_offset(std::int64_t key, std::int64_t d,
                                              std::int64_t dk) noexcept {
  return key / kPanel * dk * kPanel + d * kPanel + key % kPanel;
}
/// Offset of V[key][column] in a packed V block ([dv_padded / kPanel][kKvBlock][kPanel]).
inline constexpr std::int64_t packed_v_offset(std::int64_t key, std::int64_t column) noexcept {
  return column / kPanel * kKvBlock * kPanel + key * kPanel + column % kPanel;
}
/// Offset of V[key][column] in a bf16 V block for bf16 dot products
/// ([dv_padded / kPanel][kKvBlock / 2][kPanel][2]): the two keys of a pair side by side per
/// column, so one 64-byte line holds a key pair of a panel's 16 columns, the operand
/// vdpbf16ps multiplies by a broadcast pair of P.
inline constexpr std::int64_t packed_v_pair_offset(std::int64_t key, std::int64_t column) noexcept {
  return column / kPanel * kKvBlock * kPanel + key / 2 * 2 * kPanel + column % kPanel * 2 + key % 2;
}
/// Lanes of the widest fp32 vector (AVX-512): per-row softmax sums are kept as vectors.
inline constexpr std::int64_t kMaxLanes = 16;

enum class MaskKind : std::uint8_t { none, boolean, additive };

/// Additive mask range: elements below -kAdditiveMaskLimit (-FLT_MAX, torch.finfo.min) exclude
/// their key exactly as -inf does, and elements above it (+inf included) are refused by
/// validation. Within the range a bias times log2(e) (the kernels' base-2 softmax) plus any score
/// stays finite, so every backend computes the same softmax; beyond it the base-2 kernels
/// overflowed where the natural-log reference did not (a row masked with -FLT_MAX was zeros on
/// one backend and the mean of V on another; +inf gave NaN, v[key] or 0 by backend).
inline constexpr float kAdditiveMaskLimit = 0x1p126f;

/// Element strides of a [sequence-or-batch, position, head] addressed tensor.
struct Strides {
  std::int64_t batch = 0, seq = 0, head = 0;
};

/// How the kernel reads K: transposed into blocks of kKvBlock keys once per call ("packed",
/// for prefill, where many query rows reuse each block) or row by row from the tensor
/// ("direct", for decode-like calls where packing would cost as much as the attention).
enum class KLayout : std::uint8_t { packed, direct };

struct FlashProblem {
  DType dtype = DType::f32;  ///< of q, k, v and out
  std::int64_t dk = 0, dv = 0;
  std::int64_t heads = 0, kv_heads = 0;
  std::int64_t batch = 0;              ///< batch size, or number of sequences (varlen)
  std::int64_t q_len = 0, kv_len = 0;  ///< dense only; varlen lengths come from cu_seqlens
  const std::int32_t* cu_q = nullptr;  ///< varlen: batch + 1 offsets (null for dense)
  const std::int32_t* cu_k = nullptr;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  Strides q_strides, k_strides, v_strides, out_strides;
  MaskKind mask_kind = MaskKind::none;
  const void* mask = nullptr;
  std::int64_t mask_strides[4] = {0, 0, 0, 0};  ///< [b, h, q, k]; 0 broadcasts
  float* lse = nullptr;
  Strides lse_strides;   ///< batch, seq (= query position), head
  float scale_log2 = 0;  ///< softmax scale times log2(e): scores live in the log2 domain
  bool causal = false;
  std::int64_t dv_padded = 0;  ///< dv rounded up to 16
  // Token orders and row windows (block-sparse attention; null/0 for dense calls). A task's
  // query position pos is the sequence's query q_order[pos]; packed key position j holds key
  // k_order[j] (packing only: the kernel then reads K and V in that order, which requires
  // KLayout::packed). With row_window, query position pos attends the keys [0, sink_end) and
  // [row_window[2 pos], row_window[2 pos + 1]) (key positions), besides causal and mask.
  const std::int32_t* q_order = nullptr;
  const std::int32_t* k_order = nullptr;
  const std::int32_t* row_window = nullptr;
  std::int64_t sink_end = 0;
};

/// How a run walks a problem: chosen per call by its backend (forced, cached or tuned), never
/// part of the validated problem.
struct FlashTiles {
  KLayout k_layout = KLayout::packed;
  int row_group = kMaxRowGroup;  ///< micro-tiles per row group (1..kMaxRowGroup)
  bool bf16_dot = false;         ///< flash_bf16: Q·K^T and P·V with bf16 dot products
};

/// K and V packed once per call (KLayout::packed; packing.hpp makes them), per block of kKvBlock
/// keys: K^T as [kKvBlock / kPanel][dk][kPanel] floats (zero padded past the sequence end)
/// starting at k + k_offset[seq * kv_heads + h]; V as fp32 when v is set (prefill):
/// [dv_padded / kPanel][kKvBlock][kPanel] floats; with bf16_dot, V as bf16 key pairs
/// (packed_v_pair_offset) in v_bf16 instead, at the same element offsets. All null when K is
/// read in place.
struct PackedView {
  const float* k = nullptr;
  /// bf16_dot: K^T as [dk_padded / 2][kKvBlock][2] bf16 words per block (pairs of d per key).
  const std::uint16_t* k_bf16 = nullptr;
  const std::int64_t* k_offset = nullptr;
  const float* v = nullptr;
  const std::uint16_t* v_bf16 = nullptr;
  const std::int64_t* v_offset = nullptr;
};

/// What a kernel task reads: the validated problem, the run's tiles and the packed operands.
struct FlashRun {
  const FlashProblem& problem;
  FlashTiles tiles;
  PackedView packed;
};

/// Query rows [q_begin, q_end) of sequence `seq` for every query head of KV head `kv_head`,
/// against keys [kv_begin, kv_end). partial: fp32 [group * (q_end - q_begin)][dv_padded]
/// normalized outputs and their log2-domain LSE (split-KV, merged by the caller), or null to
/// write out/lse directly.
/// head_count > 0 restricts the task to query heads [head_begin, head_begin + head_count) of
/// the KV head's group (heads with different block lists). blocks: the KV blocks to visit, as
/// ascending block numbers (keys [64 b, 64 b + 64)), instead of every block of
/// [kv_begin, kv_end); the caller keeps the list alive while the task runs.
struct FlashTask {
  std::int64_t seq = 0, kv_head = 0;
  std::int64_t q_begin = 0, q_end = 0;
  std::int64_t kv_begin = 0, kv_end = 0;
  std::int64_t head_begin = 0, head_count = 0;
  const std::int32_t* blocks = nullptr;
  std::int64_t block_count = 0;
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
};

/// Sequence geometry: lengths and the row offsets of its first position (varlen sequences
/// start inside the packed tensors).
struct Sequence {
  std::int64_t q_len, kv_len, q_row0, k_row0;
};

namespace {  // internal linkage: every ISA object keeps its own copy (ODR guard)
inline Sequence sequence_of(const FlashProblem& p, std::int64_t seq) noexcept {
  if (p.cu_q) {
    return {p.cu_q[seq + 1] - p.cu_q[seq], p.cu_k[seq + 1] - p.cu_k[seq], p.cu_q[seq], p.cu_k[seq]};
  }
  return {p.q_len, p.kv_len, 0, 0};
}
}  // namespace

/// Floats of per-thread scratch a task needs (for any ISA).
inline std::int64_t flash_scratch_floats(const FlashProblem& p) noexcept {
  const std::int64_t rows = kMaxRowGroup * kMaxTileRows;
  const std::int64_t dk_padded = (p.dk + 31) / 32 * 32;
  // Q (fp32 and its bf16 copy), O, the P tiles of a row group (fp32: one block; flash_bf16: a
  // step of bf16 words, as many bytes), running max and (vector) sum.
  static_assert(kStepKeys * 2 == kKvBlock * 4, "a step of bf16 P fills an fp32 P block");
  return rows * dk_padded * 3 / 2 + rows * p.dv_padded + rows * kKvBlock + rows * (1 + kMaxLanes) +
         64;
}

/// Runs one task; scratch: flash_scratch_floats() floats, 64-byte aligned, private to the
/// calling thread. Defined per ISA in flash_kernel.cpp.
template <class Arch>
void flash_task(const FlashRun& run, const FlashTask& task, float* scratch) noexcept;

/// Writes the rows of `task` (a task without partials) from its `splits` split-KV partials:
/// partial_out [splits][rows][dv_padded] and partial_lse [splits][rows] (rows = the task's heads
/// x positions, in make_row order), merged by their LSE. merged: dv_padded floats of scratch,
/// 64-byte aligned. Defined per ISA in flash_kernel.cpp.
template <class Arch>
void flash_merge_splits(const FlashProblem& problem, const FlashTask& task, std::int64_t splits,
                        const float* partial_out, const float* partial_lse, float* merged) noexcept;

/// Widens `count` elements of `dtype` (f32, bf16 or f16) at `src` to floats at `dst`: packing
/// converts each K and V row with it, vectorized (a call per element cost bf16 inputs about a
/// tenth of the kernel's time at 1 thread). Defined per ISA in flash_kernel.cpp.
template <class Arch>
void widen_row(DType dtype, const void* src, std::int64_t count, float* dst) noexcept;

/// Packs one full panel of fp32 K^T: panel[d][key] = rows[key][d] for kPanel keys and d < dk
/// (packed_k_offset's layout within a panel). With AVX-512 and AVX2 by 16 x 16 and 8 x 8
/// transposes in registers: whole-line stores, where scattering a row's elements stored one
/// float at a time and made packing a third of the memory bandwidth's speed or less. Defined
/// per ISA in flash_kernel.cpp.
template <class Arch>
void transpose_k_panel(const float* const* rows, std::int64_t dk, float* panel) noexcept;

/// The flash_bf16 bf16 dot products (vdpbf16ps) run: the avx512 kernel variant with AVX512-BF16.
bool bf16_dot_available() noexcept;

}  // namespace ditops::attention
