#pragma once
// MLA paged decode kernels: the problem mla_decode_paged validated, one (sequence, KV split)
// task, and the per-thread workspace the task runs in. Defined per ISA in mla_kernel.cpp.

#include <cstdint>
#include <ditops/tensor.hpp>

#include "ops/schedule/schedule.hpp"

namespace ditops::mla {

inline constexpr int kNopeDim = 512;
inline constexpr int kRopeDim = 64;
/// The kernel always works in 4 groups of 128 nope values (a G = 1 cache repeats its one scale),
/// so S_nope is 4 exact int32 partial dot products, each dequantized with its key scale.
inline constexpr int kScaleGroups = 4;
inline constexpr int kGroupDim = kNopeDim / kScaleGroups;

/// Queries prepared once per call (mla.cpp): q_nope quantized per (sequence, head), in the two
/// integer forms the kernel variants consume, and the scales with softmax scale * log2(e)
/// folded in (the softmax runs in base 2).
struct PreparedQueries {
  const std::int8_t* nope_int8 = nullptr;     ///< [B][H][512]
  const std::int16_t* nope_int16 = nullptr;   ///< [B][H][512], same values
  const std::int32_t* offset_sums = nullptr;  ///< [B][H][4]: 128 * sum of each group's int8 q
  const float* nope_factor = nullptr;         ///< [B][H]: q scale * scale * log2(e)
  const float* rope = nullptr;                ///< [B][H][64]: q_rope * scale * log2(e)
};

struct MlaProblem {
  int heads = 0;
  int block_size = 0;    ///< 64 or 128 tokens per paged block
  int scale_groups = 1;  ///< G of the cache (1 or 4)
  int chunk = 2;         ///< QK blocks ahead of their PV (schedule)
  // Cache (strides in elements; the last dimension is contiguous).
  const std::int8_t* nope = nullptr;
  std::int64_t nope_strides[2] = {0, 0};  ///< block, token
  const float* nope_scale = nullptr;
  std::int64_t scale_strides[2] = {0, 0};
  const void* rope = nullptr;
  bool rope_bf16 = false;
  std::int64_t rope_strides[2] = {0, 0};
  PreparedQueries queries;
  // Output [B, H, 512].
  void* out = nullptr;
  bool out_bf16 = false;
  std::int64_t out_strides[2] = {0, 0};  ///< sequence, head
};

/// A contiguous range of whole paged blocks of one sequence.
struct MlaTask {
  int sequence = 0;
  int split = 0;                            ///< index among the sequence's splits
  int splits = 1;                           ///< splits of this sequence; 1 writes out directly
  std::int64_t first_token = 0;             ///< a multiple of block_size
  std::int64_t end_token = 0;               ///< > first_token
  const std::int32_t* block_ids = nullptr;  ///< block_table row, from block first_token / bs
  /// The schedule's cube order (QK/PV) for this task's blocks; a plain array so kernel objects
  /// instantiate no std::vector code (ODR guard).
  const schedule::StageInstance* order = nullptr;
  int order_size = 0;
  float* partial_out = nullptr;  ///< splits > 1: [H][512] normalized partial output
  float* partial_lse = nullptr;  ///< splits > 1: [H] log2-sum-exp2 of the split's scores
};

/// Per-thread scratch, carved from one 64-byte aligned allocation (mla.cpp sizes it).
struct MlaWorkspace {
  float* out_acc = nullptr;           ///< [H][512] running unnormalized output (UP target)
  float* scores = nullptr;            ///< [2 * chunk][H][block_size] S, then P in place (slots)
  float* alpha = nullptr;             ///< [2 * chunk][H] exp2(m_old - m_new) per SM, used by UP
  float* row_max = nullptr;           ///< [H] running max (base-2 logits)
  float* row_sum = nullptr;           ///< [H] running sum of exp2
  std::uint32_t* key_pack = nullptr;  ///< [256][block_size] words: keys lane-per-token
  float* scale_pack = nullptr;        ///< [4][block_size] key scale per 128-value group
  float* rope_pack = nullptr;         ///< [64][block_size] key rope lane-per-token
  float* value_tile = nullptr;        ///< [block_size][64] dequantized value columns
};

/// Runs one task: the schedule's stage order over its blocks, then writes out (or the partial).
template <class Arch>
void mla_decode_task(const MlaProblem& problem, const MlaTask& task,
                     const MlaWorkspace& workspace) noexcept;

/// Merges the `splits` partials of one sequence by log-sum-exp into its output rows.
template <class Arch>
void mla_merge_splits(const MlaProblem& problem, int sequence, int splits, const float* partial_out,
                      const float* partial_lse) noexcept;

}  // namespace ditops::mla
