#pragma once
// MLA paged decode kernels: the problem mla_decode_paged validated, one (sequence, KV split)
// task, and the per-thread workspace the task runs in. Defined per ISA in mla_kernel.cpp.

#include <cstdint>
#include <ditops/mla.hpp>
#include <ditops/tensor.hpp>
#include <xsimd/xsimd.hpp>

#include "ops/schedule/schedule.hpp"

namespace ditops::mla {

inline constexpr int kNopeDim = kMlaNopeDim;
inline constexpr int kRopeDim = kMlaRopeDim;
/// The kernel always works in 4 groups of 128 nope values (a G = 1 cache repeats its one scale),
/// so S_nope is 4 exact int32 partial dot products, each dequantized with its key scale.
inline constexpr int kScaleGroups = 4;
inline constexpr int kGroupDim = kNopeDim / kScaleGroups;
/// Largest paged block (tokens); mla.cpp accepts 64 and 128.
inline constexpr int kMaxBlockSize = 128;
/// Heads are padded to whole vectors of the widest ISA (16 fp32 lanes).
inline constexpr int kHeadPadding = 16;

/// Queries prepared once per call (mla.cpp), heads in lanes: every array is [B][...][Hp] with
/// the heads padded to Hp (a multiple of 16) with zeros. q_nope is quantized per (sequence,
/// head) in the two integer forms the kernel variants consume, and the scales carry softmax
/// scale * log2(e) (the softmax runs in base 2).
struct PreparedQueries {
  const std::uint32_t* nope_words =
      nullptr;  ///< [B][128][Hp]: 4 int8 of q per word (VNNI, pmaddubsw)
  const std::uint32_t* nope_pairs = nullptr;  ///< [B][256][Hp]: 2 int16 of q per word (pmaddwd)
  const std::int32_t* offset_sums = nullptr;  ///< [B][4][Hp]: 128 * sum of each group's int8 q
  const float* nope_factor = nullptr;         ///< [B][Hp]: q scale * scale * log2(e)
  const float* rope = nullptr;                ///< [B][64][Hp]: q_rope * scale * log2(e)
};

/// The raw queries prepare reads (validated by mla.cpp); element strides, last dim contiguous.
struct QueryInputs {
  const void* nope = nullptr;  ///< [B, H, 512] f32 or bf16
  bool nope_bf16 = false;
  std::int64_t nope_strides[2] = {0, 0};  ///< sequence, head
  const void* rope = nullptr;             ///< [B, H, 64] f32 or bf16
  bool rope_bf16 = false;
  std::int64_t rope_strides[2] = {0, 0};
  float log2_scale = 0;  ///< softmax scale * log2(e)
  int heads = 0, padded_heads = 0;
};

/// Fills `out` (whose arrays are written through) for the units [first_unit, end_unit) of 16
/// heads of one sequence each (unit = sequence * Hp / 16 + head / 16): q_nope quantized
/// symmetrically per (sequence, head) exactly as the cache format (mla.hpp), in the integer
/// form this ISA's task kernel reads (VNNI words and offset sums, or int16 pairs); q_rope
/// scaled. Padding heads must already be zero.
template <class Arch>
void mla_prepare_queries(const QueryInputs& in, const PreparedQueries& out, std::int64_t first_unit,
                         std::int64_t end_unit) noexcept;

struct MlaProblem {
  int heads = 0;
  int padded_heads = 0;  ///< heads rounded up to a multiple of kHeadPadding
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
  float* scores = nullptr;            ///< [2 * chunk][block_size][Hp] S, then P in place
  float* alpha = nullptr;             ///< [2 * chunk][Hp] exp2(m_old - m_new) per SM, for UP
  float* row_max = nullptr;           ///< [Hp] running max (base-2 logits)
  float* row_sum = nullptr;           ///< [Hp] running sum of exp2
  std::uint32_t* key_pack = nullptr;  ///< [block_size][256] words: the block's keys for QK
  float* rope_pack = nullptr;         ///< [block_size][64] the block's rope in f32
  std::int8_t* value_pack = nullptr;  ///< [block_size / 4][512][4] the block's rows for PV
  std::uint32_t* levels = nullptr;    ///< [4 groups][block_size / 4][Hp] u8 weights, 4 per word
  float* level_factor = nullptr;      ///< [4 groups][Hp] weight = factor * level
  float* level_sum = nullptr;         ///< [4 groups][Hp] running sum of the quantized weights
};

/// Runs one task: the schedule's stage order over its blocks, then writes out (or the partial).
template <class Arch>
void mla_decode_task(const MlaProblem& problem, const MlaTask& task,
                     const MlaWorkspace& workspace) noexcept;

/// Merges the `splits` partials of one sequence by log-sum-exp into its output rows, for heads
/// [head_begin, head_end).
template <class Arch>
void mla_merge_splits(const MlaProblem& problem, int sequence, int splits, const float* partial_out,
                      const float* partial_lse, int head_begin, int head_end) noexcept;

/// The MLA decode kernels of one variant, in the order a call runs them (the member types: any
/// instantiation's).
struct MlaKernels {
  decltype(&mla::mla_prepare_queries<xsimd::sse2>) mla_prepare_queries;
  decltype(&mla::mla_decode_task<xsimd::sse2>) mla_decode_task;
  decltype(&mla::mla_merge_splits<xsimd::sse2>) mla_merge_splits;
};

template <class Arch>
constexpr MlaKernels mla_kernels_of() {
  return {&mla_prepare_queries<Arch>, &mla_decode_task<Arch>, &mla_merge_splits<Arch>};
}

/// Tests: mla_decode_paged runs `kernels` (another architecture's, such as the AVX-VNNI model's)
/// instead of its variant's while set; null restores them. Returns the previous override.
const MlaKernels* override_mla_kernels(const MlaKernels* kernels) noexcept;

}  // namespace ditops::mla
