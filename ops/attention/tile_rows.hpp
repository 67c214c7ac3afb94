#pragma once
// What the flash and int8 attention kernels share about query rows: where a row of a task
// lives (RowRef), which keys it may attend (causal end, boolean or additive mask), the base-2
// exponential of shifted scores, and how a finished row is written (normalized output and LSE,
// or the split-KV partial). Kernel sources only (compiled per ISA level); everything here has
// internal linkage so each ISA's copy stays its own.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/attention/attention_kernel.hpp"
#include "ops/core/log2_domain.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/partial.hpp"
#include "ops/core/simd/row_chunks.hpp"

namespace ditops::attention {
namespace {

using core::kLn2;
using core::kLog2e;
using core::kMinusInf;

template <class Arch>
using B = simd::F32<Arch>;

/// Query heads a task covers: its head range, or the KV head's whole group.
inline std::int64_t task_heads(const FlashProblem& p, const FlashTask& task) noexcept {
  return task.head_count > 0 ? task.head_count : p.heads / p.kv_heads;
}

/// One query row of a task.
struct RowRef {
  std::int64_t visible_end = 0;  ///< keys [kv_begin, visible_end) may be attended
  /// Row windows (FlashProblem::row_window): keys [sink_end, window_begin) are not attended.
  /// 0 when the row has no window or its window starts inside the sink.
  std::int64_t window_begin = 0, sink_end = 0;
  const void* q = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  const void* mask = nullptr;  ///< mask row (element 0 = key 0), or null
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
};

/// Row `index` of a task (index = head within the task's heads * rows_per_head + position).
template <class T>
RowRef make_row(const FlashProblem& p, const FlashTask& task, const Sequence& seq,
                std::int64_t index) noexcept {
  const std::int64_t group = p.heads / p.kv_heads;
  const std::int64_t rows_per_head = task.q_end - task.q_begin;
  const std::int64_t head = task.kv_head * group + task.head_begin + index / rows_per_head;
  const std::int64_t task_pos = task.q_begin + index % rows_per_head;
  const std::int64_t pos = p.q_order ? p.q_order[task_pos] : task_pos;
  RowRef row;
  std::int64_t visible = seq.kv_len;
  if (p.causal) visible = std::clamp<std::int64_t>(pos + seq.kv_len - seq.q_len + 1, 0, seq.kv_len);
  if (p.row_window) {
    visible = std::min<std::int64_t>(visible, p.row_window[2 * task_pos + 1]);
    const std::int64_t begin = p.row_window[2 * task_pos];
    if (begin > p.sink_end) {
      row.window_begin = begin;
      row.sink_end = p.sink_end;
    }
  }
  // Two std::min, not std::min({...}): the initializer-list form calls std::__min_element,
  // which a compiler may leave out of line (clang under ASan does) in every ISA object.
  row.visible_end = std::min(std::min(visible, task.kv_end), seq.kv_len);
  row.q = static_cast<const T*>(p.q) + task.seq * p.q_strides.batch +
          (seq.q_row0 + pos) * p.q_strides.seq + head * p.q_strides.head;
  row.out = static_cast<T*>(p.out) + task.seq * p.out_strides.batch +
            (seq.q_row0 + pos) * p.out_strides.seq + head * p.out_strides.head;
  row.lse = p.lse ? p.lse + task.seq * p.lse_strides.batch +
                        (seq.q_row0 + pos) * p.lse_strides.seq + head * p.lse_strides.head
                  : nullptr;
  if (p.mask_kind != MaskKind::none) {
    const std::int64_t offset =
        task.seq * p.mask_strides[0] + head * p.mask_strides[1] + pos * p.mask_strides[2];
    row.mask = p.mask_kind == MaskKind::boolean
                   ? static_cast<const void*>(static_cast<const std::uint8_t*>(p.mask) + offset)
                   : static_cast<const void*>(static_cast<const float*>(p.mask) + offset);
  }
  if (task.partial_out) {
    row.partial_out = task.partial_out + index * p.dv_padded;
    row.partial_lse = task.partial_lse + index;
  }
  return row;
}

/// 2^x for scores shifted by the running max (x <= 0, -inf for masked keys), 0 below 2^-126
/// like simd::exp2_nonpositive. AVX-512 rounds with vrndscaleps and scales with vscalefps
/// (zero-masked below -126, which also drops the NaN -inf gives): 10 instructions where the
/// generic bit-twiddling takes 15, in a loop that runs once per score. kDegree 6 is a minimax
/// fit (relative error ~2e-7); 4 (AVX-512 only) the Taylor series, 4.2e-5, for 8-bit weights,
/// where x may also be positive.
template <class Arch, int kDegree = 6>
inline B<Arch> exp2_scores(B<Arch> x) noexcept {
  static_assert(kDegree == 6 || (kDegree == 4 && simd::kIsAvx512<Arch>));
  if constexpr (simd::kIsAvx512<Arch>) {
    const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.f), _CMP_GE_OQ);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const B<Arch> f = x - B<Arch>(n);
    B<Arch> p;
    if constexpr (kDegree == 6) {
      p = B<Arch>(1.535336188319500e-4f);
      p = simd::fmadd<Arch>(p, f, B<Arch>(1.339887440266574e-3f));
      p = simd::fmadd<Arch>(p, f, B<Arch>(9.618437357674640e-3f));
      p = simd::fmadd<Arch>(p, f, B<Arch>(5.550332471162809e-2f));
      p = simd::fmadd<Arch>(p, f, B<Arch>(2.402264791363012e-1f));
      p = simd::fmadd<Arch>(p, f, B<Arch>(6.931472028550421e-1f));
    } else {
      p = B<Arch>(9.618129107628477e-3f);
      p = simd::fmadd<Arch>(p, f, B<Arch>(5.550410866482158e-2f));
      p = simd::fmadd<Arch>(p, f, B<Arch>(2.402265069591007e-1f));
      p = simd::fmadd<Arch>(p, f, B<Arch>(6.931471805599453e-1f));
    }
    p = simd::fmadd<Arch>(p, f, B<Arch>(1.f));
    return _mm512_maskz_scalef_ps(in_range, p, n);
  } else {
    return simd::exp2_nonpositive<Arch>(x);
  }
}

/// `lanes` mask bytes (true = attend) as a lane mask; reads only `count` bytes.
template <class Arch>
inline xsimd::batch_bool<float, Arch> load_bool_mask(const std::uint8_t* src,
                                                     std::int64_t count) noexcept {
  constexpr int kLanes = static_cast<int>(B<Arch>::size);
  if constexpr (simd::kIsAvx512<Arch>) {
    const auto lanes = static_cast<__mmask16>(count >= 16 ? 0xffff : (1u << count) - 1);
    const __m128i bytes = _mm_maskz_loadu_epi8(lanes, src);
    return _mm512_cmpneq_epi32_mask(_mm512_cvtepu8_epi32(bytes), _mm512_setzero_si512());
  } else {
    alignas(64) float flags[kLanes];
    for (int i = 0; i < kLanes; ++i) flags[i] = i < count && src[i] ? 1.f : 0.f;
    return B<Arch>::load_aligned(flags) != B<Arch>(0.f);
  }
}

/// 0: every byte false (skip the block), 1: every byte true (no masking), 2: mixed.
inline int classify_bool_mask(const std::uint8_t* row, std::int64_t count) noexcept {
  bool any = false, all = true;
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, row + i, 8);
    any |= word != 0;
    // bool storage is 0 or 1 per byte: all true iff every byte is 1.
    all &= word == 0x0101010101010101ull;
  }
  for (; i < count; ++i) {
    any |= row[i] != 0;
    all &= row[i] != 0;
  }
  return !any ? 0 : all ? 1 : 2;
}

/// Whether a tile of `count` rows must mask the block of `keys` keys at `block`: false in
/// `attends` when an explicit boolean mask excludes every key for every row (skip the block);
/// the result is true when any score may need masking (causal diagonal, sequence end, mask).
inline bool tile_needs_mask(const FlashProblem& p, const RowRef* rows, int count,
                            std::int64_t block, std::int64_t keys, bool diagonal,
                            bool& attends) noexcept {
  attends = true;
  bool partial = diagonal || keys < kKvBlock;
  if (p.row_window) {  // a window cuts the block when it starts past the block's first key
    bool any_row = false;
    for (int i = 0; i < count; ++i) {
      const RowRef& row = rows[i];
      if (row.q == nullptr) continue;
      const bool in_sink = block + keys <= row.sink_end;
      const bool sees = block < row.sink_end || block + keys > row.window_begin;
      any_row |= sees && block < row.visible_end;
      partial |= !in_sink && block < row.window_begin;
    }
    if (!any_row) {
      attends = false;
      return partial;
    }
  }
  if (p.mask_kind == MaskKind::boolean) {
    int all_false = 1, all_true = 1;
    for (int i = 0; i < count; ++i) {
      if (rows[i].mask == nullptr) continue;
      const int kind =
          classify_bool_mask(static_cast<const std::uint8_t*>(rows[i].mask) + block, keys);
      all_false &= kind == 0;
      all_true &= kind == 1;
    }
    if (all_false) attends = false;
    partial |= !all_true;
  } else if (p.mask_kind == MaskKind::additive) {
    partial = true;
  }
  return partial;
}

/// Masks the row's base-2 scores s[0 .. kKvBlock / lanes) of the block at `block`: keys past
/// the row's visible end or excluded by a boolean mask become -inf; an additive mask (natural
/// log units) is added times log2(e), and its elements below -kAdditiveMaskLimit exclude.
template <class Arch>
inline void mask_scores(const FlashProblem& p, const RowRef& row, std::int64_t block,
                        std::int64_t kv_len, B<Arch>* s) noexcept {
  constexpr int kLanes = static_cast<int>(B<Arch>::size);
  alignas(64) float iota[kLanes];
  for (int i = 0; i < kLanes; ++i) iota[i] = static_cast<float>(i);
  const B<Arch> visible(static_cast<float>(row.visible_end - block));
  // Keys [sink_end, window_begin) are outside the row's window (both 0 without one).
  const B<Arch> gap_begin(static_cast<float>(row.sink_end - block)),
      gap_end(static_cast<float>(row.window_begin - block));
  for (int c = 0; c < kKvBlock / kLanes; ++c) {
    const B<Arch> index = B<Arch>::load_aligned(iota) + B<Arch>(static_cast<float>(c * kLanes));
    auto valid = index < visible;
    if (row.window_begin > 0) valid = valid & ((index < gap_begin) | (index >= gap_end));
    const std::int64_t key = block + c * kLanes;
    const std::int64_t count = std::min<std::int64_t>(kLanes, kv_len - key);
    if (row.mask != nullptr && count > 0) {
      if (p.mask_kind == MaskKind::boolean) {
        valid =
            valid & load_bool_mask<Arch>(static_cast<const std::uint8_t*>(row.mask) + key, count);
      } else {
        const float* m = static_cast<const float*>(row.mask) + key;
        const B<Arch> bias =
            count < kLanes ? simd::load_partial<Arch>(m, count, 0.f) : B<Arch>::load_unaligned(m);
        s[c] = simd::fmadd<Arch>(bias, B<Arch>(kLog2e), s[c]);
        valid = valid & !(bias < B<Arch>(-kAdditiveMaskLimit));  // like -inf (NaN propagates)
      }
    }
    s[c] = xsimd::select(valid, s[c], B<Arch>(kMinusInf));
  }
}

/// Writes a finished row: o (dv_padded floats, unnormalized) / l to out (or the partial), and
/// its LSE from the base-2 running max m, plus `lse_shift` (base 2) the scores left out.
template <class Arch, class T>
void finish_row(const FlashProblem& p, const RowRef& row, const float* o, float l, float m,
                float lse_shift) noexcept {
  constexpr int kLanes = static_cast<int>(B<Arch>::size);
  const bool empty = !(l > 0.f);
  const float inverse = empty ? 0.f : 1.f / l;
  const float lse_log2 = empty ? (m != m ? m : kMinusInf) : m + std::log2(l) + lse_shift;
  if (row.partial_out) {
    for (std::int64_t i = 0; i < p.dv_padded; i += kLanes) {
      (B<Arch>::load_aligned(o + i) * B<Arch>(inverse)).store_aligned(row.partial_out + i);
    }
    *row.partial_lse = lse_log2;
    return;
  }
  T* out = static_cast<T*>(row.out);
  for (std::int64_t i = 0; i < p.dv; i += kLanes) {
    const std::int64_t count = std::min<std::int64_t>(kLanes, p.dv - i);
    simd::store_chunk<Arch>(out, i, count, B<Arch>::load_aligned(o + i) * B<Arch>(inverse), false);
  }
  if (row.lse) *row.lse = lse_log2 * kLn2;
}

}  // namespace
}  // namespace ditops::attention
