#pragma once
// The int8 attention task (int8_kernel.cpp describes the pipeline): the register-tile Q·K^T and
// P·V, and Int8Runner, which walks a task's row groups through the QK, SM, PV and UP stages.
// Included by kernel sources only (compiled per ISA level, and by the AMX kernel,
// amx_int8_attention.cpp, whose tile products replace the register tiles' in the QK and PV
// stages); everything has internal linkage, so each compilation's copy stays its own.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/attention/int8_kernel.hpp"
#include "ops/attention/tile_rows.hpp"
#include "ops/core/arch.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/int8_dot.hpp"
#include "ops/core/simd/row_chunks.hpp"

namespace ditops::attention {
namespace {

using simd::I32;

/// The register tiles of a variant, or (kTileDots) the operands of the AMX tile products, which
/// multiply u8 by s8 as vpdpbusd does on every level they are compiled for.
template <class Arch, bool kTileDots = false>
struct Int8Tiles {
  static constexpr int kLanes = static_cast<int>(B<Arch>::size);
  /// Rows x accumulator vectors of one register tile. VNNI: 6 x 4 int32 tiles fill 24 of 32
  /// zmm; AVX-VNNI: 6 x 2 beside the 2 K or V vectors and the row word (15 of 16 ymm).
  /// pmaddubsw (16 ymm / xmm): 4 x 2 accumulators, the 2 K or V vectors, the row word and its
  /// |row|, the signed operand and the ones vector (15). The pmaddwd emulation needs two
  /// widened copies of every K/V vector and row word: 2 x 2 on SSE2, 6 x 2 on AVX-512.
  static constexpr int kRows = simd::kIsAvx512<Arch> || simd::kHasAvxVnni<Arch> ? 6
                               : simd::kHasMaddubs<Arch>                        ? 4
                                                                                : 2;
  static constexpr int kBlockVecs = static_cast<int>(kKvBlock) / kLanes;
  static constexpr int kPassVecs = simd::kHasBf16Vnni<Arch> ? 4 : 2;
  static_assert(kRows <= kMaxTileRows && kBlockVecs % kPassVecs == 0);
  /// Q as the dot product takes it: u8 (q + 128) for vpdpbusd, whose offset each key's
  /// 128 * sum(k) takes back; s8 for dot_s8s8 elsewhere (no offset, no key sums).
  static constexpr simd::RowBytes kQBytes =
      simd::kHasVpdpbusd<Arch> || kTileDots ? simd::RowBytes::u8 : simd::RowBytes::s8;
  static constexpr int kQOffset = kQBytes == simd::RowBytes::u8 ? 128 : 0;
  /// Largest u8 level of P: 255, or 63 where pmaddubsw multiplies them (simd::RowBytes::u6).
  static constexpr int kPLevels = kTileDots ? 255 : simd::kDotU6Max<Arch>;
};

/// round(x) as int32 lanes (ties to even, the current rounding mode).
template <class Arch>
inline I32<Arch> round_to_int(B<Arch> x) noexcept {
  return xsimd::nearbyint_as_int(x);
}

/// Quantized Q and K clamped to [-127, 127], where dot_s8s8 is exact. Values scaled by
/// 127 / max |x| round to at most 127 already; the clamp makes that a guarantee rather than a
/// property of the float rounding.
template <class Arch>
inline I32<Arch> clamp_int8(I32<Arch> q) noexcept {
  return xsimd::max(xsimd::min(q, I32<Arch>(127)), I32<Arch>(-127));
}

/// log2 of the largest P level (Int8Tiles::kPLevels).
template <int kLevels>
constexpr float kLog2OfPLevels = kLevels == 255 ? 7.9943534368588578f : 5.9772799234999167f;
static_assert(Int8Tiles<KernelArch>::kPLevels == 255 || Int8Tiles<KernelArch>::kPLevels == 63);

/// 2^y for y <= log2(levels) (-inf gives 0): with y = s - (block max - log2 levels), the u8
/// level of a softmax weight relative to the block's largest one. The level keeps at most 8
/// bits, so AVX-512 (255 levels) uses the degree-4 polynomial (0.01 of a level).
template <class Arch, int kLevels>
inline B<Arch> exp2_level(B<Arch> y) noexcept {
  static_assert(kLevels == 255 || kLevels == 63);
  if constexpr (simd::kIsAvx512<Arch> && kLevels == 255) {
    return exp2_scores<Arch, 4>(y);
  } else {
    return exp2_scores<Arch>(y - B<Arch>(kLog2OfPLevels<kLevels>)) * B<Arch>(kLevels);
  }
}

/// Rows read whole, key by key, with the row 8 ahead prefetched: rows are N·D elements apart
/// (a fresh page each), so reading one column chunk of every row in turn waited on a miss per
/// load.
template <class T>
inline void prefetch_row(const T* row, std::int64_t count) noexcept {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (std::int64_t i = 0; i < count * static_cast<std::int64_t>(sizeof(T)); i += 64) {
    simd::prefetch(bytes + i);
  }
}

/// S[kRows][V * lanes] (rows 64 apart) = Q rows (q_stride apart, Int8Tiles::kQBytes) · s8 K
/// words at `k` (keys in lanes, [word][64 keys][4]) minus k_sum (u8 Q only), exact int32.
template <class Arch, int V>
inline void qk_tile_int8(const std::uint8_t* q, std::int64_t q_stride, const std::int8_t* k,
                         std::int64_t words, const std::int32_t* k_sum, std::int32_t* s) noexcept {
  using Tl = Int8Tiles<Arch>;
  constexpr int R = Tl::kRows, L = Tl::kLanes;
  typename I32<Arch>::register_type acc[R][V];
  simd::dot_tile<Arch, R, V, Tl::kQBytes>(q, q_stride, 4, k, kKvBlock * 4, words, acc);
#pragma GCC unroll 4
  for (int c = 0; c < V; ++c) {
    const I32<Arch> offset = Tl::kQOffset ? I32<Arch>::load_aligned(k_sum + c * L) : I32<Arch>(0);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      (I32<Arch>(acc[r][c]) - offset).store_aligned(s + r * kKvBlock + c * L);
  }
}

/// UP of one row over V vectors of columns: o = alpha * o + p_factor * v_scale * pv, pv the
/// row's int32 P·V sums (without kRescale alpha is 1: the running max of the row did not rise,
/// the common case once a row has seen its largest scores; o * 1 would be o exactly).
template <class Arch, int V, bool kRescale>
inline void up_row(const typename I32<Arch>::register_type* pv, const float* v_scale, float alpha,
                   float p_factor, float* o_row) noexcept {
  constexpr int L = Int8Tiles<Arch>::kLanes;
  const B<Arch> keep(alpha), factor(p_factor);
#pragma GCC unroll 4
  for (int c = 0; c < V; ++c) {
    const B<Arch> scale = B<Arch>::load_aligned(v_scale + c * L) * factor;
    B<Arch> kept = B<Arch>::load_aligned(o_row + c * L);
    if constexpr (kRescale) kept *= keep;
    simd::fmadd<Arch>(xsimd::to_float(I32<Arch>(pv[c])), scale, kept).store_aligned(o_row + c * L);
  }
}

/// acc[kRows][V] = u8 P rows (64 apart, levels <= Int8Tiles::kPLevels) · s8 V words at `v`
/// ([word][dv_padded][4], starting at the pass's first column), exact int32; then up_row.
template <class Arch, int V, bool kRescale>
inline void pv_tile_u8s8(const std::uint8_t* p, const std::int8_t* v, std::int64_t v_stride,
                         std::int64_t words, const float* v_scale, const float* alpha,
                         const float* p_factor, float* o, std::int64_t o_stride) noexcept {
  constexpr int R = Int8Tiles<Arch>::kRows;
  typename I32<Arch>::register_type acc[R][V];
  simd::dot_tile<Arch, R, V, simd::RowBytes::u6>(p, kKvBlock, 4, v, v_stride * 4, words, acc);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    up_row<Arch, V, kRescale>(acc[r], v_scale, alpha[r], p_factor[r], o + r * o_stride);
  }
}

/// TileDots: void, or the AMX tile products (amx_int8_attention.cpp): a class with
///   qk(q8, q_stride, tile_keys, tiles, k, dk_words, k_sum, s)  S of every 16 rows a tile with
///       tile_keys > 0 covers, as qk_tile_int8 computes it
///   pv_up(p, tile_keys, tiles, v, dv_padded, v_scale, alpha, p_factor, o)  P·V, then up_row for
///       the rows of the tiles with tile_keys > 0
/// (tiles: micro-tiles of kRows rows).
template <class Arch, class T, class TileDots = void>
class Int8Runner {
  static constexpr bool kTiles = !std::is_void_v<TileDots>;
  using Tl = Int8Tiles<Arch, kTiles>;
  static constexpr int R = Tl::kRows, L = Tl::kLanes, BV = Tl::kBlockVecs, PV = Tl::kPassVecs;
  static constexpr int kBuffers = 2 * 4;
  static constexpr std::int64_t kRowsMax = kMaxRowGroup * kMaxTileRows;

 public:
  Int8Runner(const FlashProblem& p, const Int8Operands& op, const FlashTask& task,
             float* scratch) noexcept
      : p_(p), op_(op), task_(task), seq_(sequence_of(p, task.seq)) {
    const std::int64_t head_slot = task.seq * p.kv_heads + task.kv_head;
    first_block_ = op_.first_block[head_slot];
    k_mean_ = op_.k_mean ? op_.k_mean + head_slot * p.dk : nullptr;
    kv_end_ = std::min(task.kv_end, seq_.kv_len);
    q_stride_ = (op_.dk_words * 4 + 63) / 64 * 64;
    auto* bytes = reinterpret_cast<std::uint8_t*>(scratch);
    auto carve = [&bytes](std::int64_t count) {
      std::uint8_t* at = bytes;
      bytes += (count + 63) / 64 * 64;
      return at;
    };
    q8_ = carve(kRowsMax * q_stride_);
    q_factor_ = reinterpret_cast<float*>(carve(kRowsMax * 4));
    lse_shift_ = reinterpret_cast<float*>(carve(kRowsMax * 4));
    row_max_ = reinterpret_cast<float*>(carve((kRowsMax + kMaxLanes) * 4));  // SM reads a vector
    row_sum_ = reinterpret_cast<float*>(carve(kRowsMax * kMaxLanes * 4));
    row_sum_unrounded_ = reinterpret_cast<float*>(carve(kRowsMax * kMaxLanes * 4));
    o_ = reinterpret_cast<float*>(carve(kRowsMax * p.dv_padded * 4));
    s_ = reinterpret_cast<std::int32_t*>(carve(kBuffers * kRowsMax * kKvBlock * 4));
    pq_ = carve(kBuffers * kRowsMax * kKvBlock);
    p_factor_ = reinterpret_cast<float*>(carve(kBuffers * kRowsMax * 4));
    alpha_ = reinterpret_cast<float*>(carve(kBuffers * kRowsMax * 4));
    tile_keys_ = reinterpret_cast<std::int64_t*>(carve(kBuffers * kMaxRowGroup * 8));
  }

  void run() noexcept {
    const std::int64_t total = task_heads(p_, task_) * (task_.q_end - task_.q_begin);
    const std::int64_t rows_per_group = static_cast<std::int64_t>(op_.row_group) * R;
    for (std::int64_t first = 0; first < total; first += rows_per_group) {
      run_group(first, std::min(total, first + rows_per_group));
    }
  }

 private:
  void run_group(std::int64_t first, std::int64_t end) noexcept {
    row_count_ = static_cast<int>(end - first);
    tiles_ = (row_count_ + R - 1) / R;
    // Rows first, with their Q lines prefetched: each Q row is a fresh page (rows of one head
    // are N·D elements apart), and quantizing them one by one waited on every miss.
    for (int index = 0; index < row_count_; ++index) {
      rows_[index] = make_row<T>(p_, task_, seq_, first + index);
      prefetch_row(static_cast<const T*>(rows_[index].q), p_.dk);
    }
    std::int64_t group_end = task_.kv_begin;
    for (int t = 0; t < tiles_; ++t) {
      tile_min_[t] = std::numeric_limits<std::int64_t>::max();
      tile_max_[t] = task_.kv_begin;
      for (int i = 0; i < R; ++i) {
        const int index = t * R + i;
        std::fill(o_ + index * p_.dv_padded, o_ + (index + 1) * p_.dv_padded, 0.f);
        row_max_[index] = kMinusInf;
        B<Arch>(0.f).store_aligned(row_sum_ + index * L);
        B<Arch>(0.f).store_aligned(row_sum_unrounded_ + index * L);
        if (index >= row_count_) {  // padding row of the last tile: attends nothing
          rows_[index] = RowRef{};
          rows_[index].visible_end = task_.kv_begin;
          std::memset(q8_ + index * q_stride_, Tl::kQOffset, static_cast<std::size_t>(q_stride_));
          q_factor_[index] = 0.f;
          tile_min_[t] = task_.kv_begin;
          continue;
        }
        quantize_query(index);
        tile_min_[t] = std::min(tile_min_[t], rows_[index].visible_end);
        tile_max_[t] = std::max(tile_max_[t], rows_[index].visible_end);
      }
      group_end = std::max(group_end, tile_max_[t]);
    }
    const std::int64_t blocks = (group_end - task_.kv_begin + kKvBlock - 1) / kKvBlock;
    // The shared schedule's stage order for this group's blocks; UP is PV's register-tile
    // epilogue (pv_up_stage), so the UP mirrors have nothing left to do.
    schedule::walk_stages(op_.order, op_.order_size, blocks,
                          [this](const schedule::StageInstance& stage) {
                            const int buffer = schedule::buffer_index(stage, op_.chunk);
                            if (stage.stage == schedule::Stage::qk) qk_stage(stage.block, buffer);
                            if (stage.stage == schedule::Stage::sm) sm_stage(stage.block, buffer);
                            if (stage.stage == schedule::Stage::pv) {
                              pv_up_stage(stage.block, buffer);
                            }
                          });
    // The output is normalized by the sum of the weights as PV used them (a convex
    // combination of the values); the LSE takes the sum of the unrounded weights, which
    // rounding to P levels would otherwise bias (weights below half a level vanish).
    for (int index = 0; index < row_count_; ++index) {
      const float l = simd::reduce_add<Arch>(B<Arch>::load_aligned(row_sum_ + index * L));
      const float l_unrounded =
          simd::reduce_add<Arch>(B<Arch>::load_aligned(row_sum_unrounded_ + index * L));
      const float rounding_shift = l > 0.f ? std::log2(l_unrounded / l) : 0.f;
      finish_row<Arch, T>(p_, rows_[index], o_ + index * p_.dv_padded, l, row_max_[index],
                          lse_shift_[index] + rounding_shift);
    }
  }

  /// Q row * softmax scale * log2(e), as u8 (q + 128) with one scale; the LSE shift is the
  /// part of the scores smoothing removed, (scaled q) · mean.
  void quantize_query(int index) noexcept {
    const T* q = static_cast<const T*>(rows_[index].q);
    const B<Arch> scale(p_.scale_log2);
    B<Arch> top(0.f), shift(0.f);
    for (std::int64_t d = 0; d < p_.dk; d += L) {
      const std::int64_t width = std::min<std::int64_t>(L, p_.dk - d);
      const B<Arch> x = simd::load_chunk<Arch>(q, d, width) * scale;
      top = xsimd::max(top, xsimd::abs(x));
      if (k_mean_) shift = simd::fmadd<Arch>(x, simd::load_chunk<Arch>(k_mean_, d, width), shift);
    }
    const float q_max = simd::reduce_max<Arch>(top);
    const float factor = simd::int8_scale(q_max);
    q_factor_[index] = factor;
    lse_shift_[index] = simd::reduce_add<Arch>(shift);
    std::uint8_t* dst = q8_ + index * q_stride_;
    const B<Arch> inverse(1.f / factor);
    for (std::int64_t d = 0; d < q_stride_; d += L) {
      const std::int64_t width = std::clamp<std::int64_t>(p_.dk - d, 0, L);
      const B<Arch> x = width > 0 ? simd::load_chunk<Arch>(q, d, width) * scale : B<Arch>(0.f);
      simd::store_low_bytes<Arch>(
          dst + d, clamp_int8(round_to_int<Arch>(x * inverse)) + I32<Arch>(Tl::kQOffset));
    }
  }

  std::int64_t block_start(int block) const noexcept {
    return task_.kv_begin + static_cast<std::int64_t>(block) * kKvBlock;
  }
  std::int64_t global_block(int block) const noexcept {
    return first_block_ + block_start(block) / kKvBlock;
  }

  /// QK(b): S[tile rows][64] = u8 Q · s8 K^T - 128 * sum(k), exact int32, for every micro-tile
  /// that attends the block (tile_keys_ > 0 marks them for SM; 0 skips SM and PV).
  void qk_stage(int block, int buffer) noexcept {
    const std::int64_t start = block_start(block);
    const std::int64_t keys = std::min(kKvBlock, kv_end_ - start);
    const std::int64_t global = global_block(block);
    const std::int8_t* k = op_.k + global * op_.dk_words * kKvBlock * 4;
    const std::int32_t* k_sum = op_.k_sum + global * kKvBlock;
    for (int t = 0; t < tiles_; ++t) {
      std::int64_t& tile_keys = tile_keys_[buffer * kMaxRowGroup + t];
      tile_keys = 0;
      if (start >= tile_max_[t]) continue;  // above the causal diagonal for every row
      bool attends = true;
      needs_mask_[buffer][t] = tile_needs_mask(p_, rows_ + t * R, R, start, keys,
                                               start + kKvBlock > tile_min_[t], attends);
      if (!attends) continue;
      tile_keys = std::min(keys, tile_max_[t] - start);
      if constexpr (!kTiles) {
        std::int32_t* s = s_ + (buffer * kRowsMax + t * R) * kKvBlock;
        for (int col = 0; col < BV; col += PV) {
          qk_tile_int8<Arch, PV>(q8_ + t * R * q_stride_, q_stride_, k + col * L * 4, op_.dk_words,
                                 k_sum + col * L, s + col * L);
        }
      }
    }
    if constexpr (kTiles) {
      TileDots::qk(q8_, q_stride_, tile_keys_ + buffer * kMaxRowGroup, tiles_, k, op_.dk_words,
                   k_sum, s_ + buffer * kRowsMax * kKvBlock);
    }
  }

  /// SM(b): per row, dequantize S (q factor * k scale) fused with the block max, mask, online
  /// max/sum, P = round(255 * 2^(s - block max)) as u8 with its factor 2^(block max - m) / 255.
  /// Unmasked tiles take the block max on the int32 scores (the factor is positive) and
  /// dequantize and shift in one FMA; masked tiles mask fp32 scores kept on the stack. The
  /// per-row scalars (new max, alpha, P factor) of a micro-tile are one vector (rows in lanes):
  /// two vector exp2 per tile instead of two libm calls per row.
  void sm_stage(int block, int buffer) noexcept {
    const std::int64_t start = block_start(block);
    const float k_scale = op_.k_scale[global_block(block)];
    for (int t = 0; t < tiles_; ++t) {
      if (tile_keys_[buffer * kMaxRowGroup + t] == 0) continue;
      const bool masked = needs_mask_[buffer][t];
      alignas(64) float block_max[L] = {}, factor[R];
      alignas(64) float scores[R][kKvBlock];  // masked tiles only
      alignas(64) std::int32_t level_sum[R][L];
      alignas(64) float unrounded_sum[R][L];
      const std::int32_t* s_tile = s_ + (buffer * kRowsMax + t * R) * kKvBlock;
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const std::int32_t* s_row = s_tile + i * kKvBlock;
        factor[i] = q_factor_[t * R + i] * k_scale;
        if (!masked) {
          I32<Arch> top = I32<Arch>::load_aligned(s_row);
#pragma GCC unroll 4
          for (int c = 1; c < BV; ++c)
            top = xsimd::max(top, I32<Arch>::load_aligned(s_row + c * L));
          block_max[i] = factor[i] * static_cast<float>(simd::reduce_max<Arch>(top));
          continue;
        }
        B<Arch> s[BV];
        for (int c = 0; c < BV; ++c) {
          s[c] = xsimd::to_float(I32<Arch>::load_aligned(s_row + c * L)) * B<Arch>(factor[i]);
        }
        mask_scores<Arch>(p_, rows_[t * R + i], start, seq_.kv_len, s);
        B<Arch> top = s[0];
        for (int c = 1; c < BV; ++c) top = xsimd::max(top, s[c]);
        for (int c = 0; c < BV; ++c) s[c].store_aligned(scores[i] + c * L);
        block_max[i] = simd::reduce_max<Arch>(top);
      }
      // Rows in lanes. A row with nothing attended here (block max -inf) keeps its max, and
      // UP leaves its O alone (alpha 1, P factor 0).
      const B<Arch> new_max = B<Arch>::load_aligned(block_max);
      float* m = row_max_ + t * R;  // kMaxTileRows-aligned lanes beyond R are scratch
      const B<Arch> old_max = B<Arch>::load_unaligned(m);
      const auto active = new_max > B<Arch>(kMinusInf);
      const B<Arch> m_new = xsimd::select(active, xsimd::max(old_max, new_max), old_max);
      const B<Arch> alpha =
          xsimd::select(active, simd::exp2_nonpositive<Arch>(old_max - m_new), B<Arch>(1.f));
      const B<Arch> p_factor = xsimd::select(
          active, simd::exp2_nonpositive<Arch>(new_max - m_new) * B<Arch>(1.f / Tl::kPLevels),
          B<Arch>(0.f));
      alignas(64) float alpha_lanes[L], p_factor_lanes[L], m_lanes[L];
      alpha.store_aligned(alpha_lanes);
      p_factor.store_aligned(p_factor_lanes);
      m_new.store_aligned(m_lanes);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const int index = t * R + i;
        const std::int64_t slot_row = buffer * kRowsMax + index;
        std::uint8_t* p_row = pq_ + slot_row * kKvBlock;
        m[i] = m_lanes[i];
        alpha_[slot_row] = alpha_lanes[i];
        p_factor_[slot_row] = p_factor_lanes[i];
        I32<Arch> sum(0);
        I32<Arch> levels[BV];
        B<Arch> unrounded(0.f);
        const bool active_row = block_max[i] > kMinusInf;
        const float shift = block_max[i] - kLog2OfPLevels<Tl::kPLevels>;
#pragma GCC unroll 4
        for (int c = 0; c < BV; ++c) {
          const B<Arch> y =
              masked ? B<Arch>::load_aligned(scores[i] + c * L) - B<Arch>(shift)
                     : simd::fmadd<Arch>(
                           xsimd::to_float(I32<Arch>::load_aligned(s_tile + i * kKvBlock + c * L)),
                           B<Arch>(factor[i]), B<Arch>(-shift));
          // An inactive row (block max -inf) gives NaN here: its levels are forced to 0.
          // At most kPLevels: y at the block max may round one ulp above log2(kPLevels).
          const B<Arch> weight = exp2_level<Arch, Tl::kPLevels>(y);
          const I32<Arch> level = xsimd::min(round_to_int<Arch>(weight), I32<Arch>(Tl::kPLevels));
          const I32<Arch> kept = active_row ? level : I32<Arch>(0);
          sum += kept;  // the weights PV will use, as their integers
          if (active_row) unrounded += weight;
          levels[c] = kept;
        }
        static_assert(BV % 4 == 0);
        for (int c = 0; c < BV; c += 4) {
          simd::store_bytes_x4<Arch>(p_row + c * L, levels[c], levels[c + 1], levels[c + 2],
                                     levels[c + 3]);
        }
        sum.store_aligned(level_sum[i]);
        unrounded.store_aligned(unrounded_sum[i]);
      }
      // l = alpha * l + P factor * sum of levels, and the same for the unrounded weights
      // (lane sums kept per lane).
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        float* l = row_sum_ + (t * R + i) * L;
        float* l_unrounded = row_sum_unrounded_ + (t * R + i) * L;
        const B<Arch> keep(alpha_lanes[i]), weight_factor(p_factor_lanes[i]);
        const B<Arch> levels = xsimd::to_float(I32<Arch>::load_aligned(level_sum[i]));
        simd::fmadd<Arch>(B<Arch>::load_aligned(l), keep, levels * weight_factor).store_aligned(l);
        simd::fmadd<Arch>(B<Arch>::load_aligned(l_unrounded), keep,
                          B<Arch>::load_aligned(unrounded_sum[i]) * weight_factor)
            .store_aligned(l_unrounded);
      }
    }
  }

  /// PV(b) and UP(b): per column pass and micro-tile, int32 P · V over the block's words, then
  /// O = alpha * O + p_factor * v_scale * PV.
  void pv_up_stage(int block, int buffer) noexcept {
    const std::int64_t global = global_block(block);
    const std::int8_t* v = op_.v + global * kKvBlock * p_.dv_padded;
    const float* v_scale = op_.v_scale + global * p_.dv_padded;
    if constexpr (kTiles) {
      const std::int64_t slot_row = buffer * kRowsMax;
      TileDots::pv_up(pq_ + slot_row * kKvBlock, tile_keys_ + buffer * kMaxRowGroup, tiles_, v,
                      p_.dv_padded, v_scale, alpha_ + slot_row, p_factor_ + slot_row, o_);
    } else {
      const std::int64_t vectors = p_.dv_padded / L;
      for (std::int64_t vec = 0; vec < vectors; vec += PV) {
        const std::int64_t count = std::min<std::int64_t>(PV, vectors - vec);
        for (int t = 0; t < tiles_; ++t) {
          const std::int64_t keys = tile_keys_[buffer * kMaxRowGroup + t];
          if (keys == 0) continue;
          const std::int64_t words = (keys + 3) / 4;
          if (count == PV) {
            pv_pass<PV>(t * R, buffer, v, v_scale, vec * L, words);
          } else {
            pv_rest(t * R, buffer, v, v_scale, vec * L, words, count);
          }
        }
      }
    }
  }

  void pv_rest(int first_row, int buffer, const std::int8_t* v, const float* v_scale,
               std::int64_t col, std::int64_t words, std::int64_t count) noexcept {
    if constexpr (PV > 1) {
      if (count == 1) return pv_pass<1>(first_row, buffer, v, v_scale, col, words);
    }
    if constexpr (PV > 2) {
      if (count == 2) return pv_pass<2>(first_row, buffer, v, v_scale, col, words);
      return pv_pass<3>(first_row, buffer, v, v_scale, col, words);
    }
  }

  template <int V>
  void pv_pass(int first_row, int buffer, const std::int8_t* v, const float* v_scale,
               std::int64_t col, std::int64_t words) noexcept {
    const std::int64_t slot_row = buffer * kRowsMax + first_row;
    bool rescale = false;
    for (int r = 0; r < R; ++r) rescale |= alpha_[slot_row + r] != 1.f;
    const auto tile = rescale ? &pv_tile_u8s8<Arch, V, true> : &pv_tile_u8s8<Arch, V, false>;
    tile(pq_ + slot_row * kKvBlock, v + col * 4, p_.dv_padded, words, v_scale + col,
         alpha_ + slot_row, p_factor_ + slot_row, o_ + first_row * p_.dv_padded + col,
         p_.dv_padded);
  }

  const FlashProblem& p_;
  const Int8Operands& op_;
  const FlashTask& task_;
  Sequence seq_;
  std::int64_t first_block_ = 0, kv_end_ = 0, q_stride_ = 0;
  const float* k_mean_ = nullptr;
  int row_count_ = 0, tiles_ = 0;
  RowRef rows_[kRowsMax];
  std::int64_t tile_min_[kMaxRowGroup], tile_max_[kMaxRowGroup];
  bool needs_mask_[kBuffers][kMaxRowGroup];
  std::uint8_t* q8_;
  float *q_factor_, *lse_shift_, *row_max_, *row_sum_, *row_sum_unrounded_, *o_;
  std::int32_t* s_;
  std::uint8_t* pq_;
  float *p_factor_, *alpha_;
  std::int64_t* tile_keys_;
};

}  // namespace
}  // namespace ditops::attention
