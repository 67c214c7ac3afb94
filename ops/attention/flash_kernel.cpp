// Flash attention task kernel, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// One task = query rows of one sequence for all query heads of one KV head (GQA heads share
// every K/V block they load). Its rows (head, position) are cut into micro-tiles of kRows rows;
// a row group of `row_group` micro-tiles walks the KV blocks together, a step of blocks at a
// time (kStepBlocks for flash_bf16, 1 for fp32): per step, Q·K^T and the softmax for every
// micro-tile, then P·V for every micro-tile, one pass of V columns at a time (the pass's V
// panels, 4 KiB each per block, stay in L1 across the micro-tiles), while the next step's
// blocks are prefetched into L2. K^T and V are packed in 16-float panels (attention_kernel.hpp,
// kPanel), so every register-tile pass streams whole consecutive cache lines.
// Per micro-tile and step: S = Q·K^T block by block (scale·log2 e folded into Q, so scores are
// in the log2 domain), mask only the partial blocks (causal diagonal, sequence end, explicit
// mask), running max with a lazy rescale of O (only when a score passes the max by more than
// kLazyMax), P = 2^(S-m) by a polynomial, per-lane row sums, then O += P·V over the step's keys
// with O in registers, loaded and stored once per step.
// flash_bf16 on AVX512-BF16 runs both products on vdpbf16ps (32 MACs per instruction, twice the
// fp32 FMA rate): K^T packed as pairs of d per key, V as pairs of keys per column, P rounded to
// bf16 once (the row sums add the rounded weights) and fed as broadcast key pairs.

#include <type_traits>

#include "ops/attention/attention_kernel.hpp"
#include "ops/attention/tile_rows.hpp"
#include "ops/core/arch.hpp"
#include "ops/core/lse_merge.hpp"
#include "ops/core/simd/bf16_dot.hpp"
#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/partial.hpp"
#include "ops/core/simd/row_chunks.hpp"

namespace ditops::attention {
namespace {

template <class Arch>
struct Tiles {
  using B = simd::F32<Arch>;
  static constexpr int kLanes = static_cast<int>(B::size);
  // AVX-512: 6 rows x 4 vectors = 24 of 32 zmm accumulate S (and O chunks); the rest hold the
  // K^T vectors and a broadcast. Narrower ISAs have 16 registers: 6 rows x 2 vectors = 12
  // accumulators, 2 K^T (or V) vectors and a broadcast, the SGEMM tile of 16-register ISAs
  // (8 loads per 12 FMAs, and 12 independent chains cover the FMA latency).
  static constexpr int kRows = 6;
  static constexpr int kBlockVecs = static_cast<int>(kKvBlock) / kLanes;
  /// Score vectors per row of a step (kStepBlocks blocks): the row stride of a score tile.
  static constexpr int kStepVecs = kStepBlocks * kBlockVecs;
  static constexpr int kColVecs = simd::kIsAvx512<Arch> ? 4 : 2;  ///< S vectors per K^T pass
  static constexpr int kDvVecs = simd::kIsAvx512<Arch> ? 4 : 2;   ///< O vectors per P·V pass
  static_assert(kRows <= kMaxTileRows && kBlockVecs % kColVecs == 0);
};

/// S tile [kRows][kBlockVecs] = Q tile · K^T block (rows kStepVecs apart), K^T packed in panels
/// [dk][kPanel]. Out of line: inlined into the step loop, GCC 12 ran out of registers in the
/// FMA loop (AVX2 kept an accumulator in memory and ran at two thirds of the speed; AVX-512
/// reloaded two Q row pointers per d, its loop taking 8-16 % longer than P·V's as many FMAs).
template <class Arch>
[[gnu::noinline]] void qk_packed(const float* q_tile, std::int64_t q_stride, const float* kt,
                                 std::int64_t dk, B<Arch>* scores) noexcept {
  using T = Tiles<Arch>;
  constexpr int R = T::kRows, C = T::kColVecs, L = T::kLanes;
  static_assert(kPanel % (C * L) == 0 || (C * L) % kPanel == 0, "a pass covers whole panels");
  for (int col = 0; col < T::kBlockVecs; col += C) {
    B<Arch> acc[R][C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = B<Arch>(0.f);
    }
    const float* k_vector[C];  // keys (col + c) * L.. of the block: panel, then lane offset
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const int key = (col + c) * L;
      k_vector[c] = kt + packed_k_offset(key, 0, dk);
    }
    for (std::int64_t d = 0; d < dk; ++d) {
      B<Arch> kv[C];
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) kv[c] = B<Arch>::load_aligned(k_vector[c] + d * kPanel);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const B<Arch> qb(q_tile[r * q_stride + d]);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) acc[r][c] = simd::fmadd<Arch>(qb, kv[c], acc[r][c]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) scores[r * T::kStepVecs + col + c] = acc[r][c];
    }
  }
}

using simd::dot_bf16;
using simd::pack_bf16;

/// flash_bf16: S tile [kRows][kBlockVecs] (rows kStepVecs apart) = bf16 Q tile · K^T, with K^T
/// packed as [ceil(dk / 2)][64 keys][2] bf16 words (pairs of consecutive d per key, zero padded).
/// Each vdpbf16ps multiplies 16 key pairs by one broadcast query pair: 32 MACs at fp32
/// accumulation.
template <class Arch>
inline void qk_bf16(const std::uint16_t* q, std::int64_t q_stride, const std::uint16_t* kt,
                    std::int64_t dk, B<Arch>* scores) noexcept {
  using T = Tiles<Arch>;
  constexpr int R = T::kRows, C = T::kBlockVecs;
  static_assert(C == 4, "one pass covers the 64-key block");
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const std::int64_t pairs = (dk + 1) / 2;
  for (std::int64_t pair = 0; pair < pairs; ++pair) {
    __m512i kv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) kv[c] = _mm512_load_si512(kt + pair * 2 * kKvBlock + c * 32);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      std::uint32_t both;
      std::memcpy(&both, q + r * q_stride + 2 * pair, sizeof both);
      const __m512i qb = _mm512_set1_epi32(static_cast<int>(both));
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        acc[r][c] = dot_bf16<Arch>(acc[r][c], qb, kv[c]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) scores[r * T::kStepVecs + c] = acc[r][c];
  }
}

/// S tile from K rows read in place (decode-like calls): per row and per group of `lanes`
/// keys, one accumulator per key along d, then a transposing horizontal sum.
template <class Arch, class KT>
inline void qk_direct(const float* q_tile, std::int64_t q_stride, int rows, const KT* k_base,
                      std::int64_t k_stride, std::int64_t key0, std::int64_t key_end,
                      std::int64_t dk, B<Arch>* scores) noexcept {
  using T = Tiles<Arch>;
  constexpr int L = T::kLanes;
  for (int r = 0; r < T::kRows; ++r) {
    for (int g = 0; g < T::kBlockVecs; ++g) {
      const std::int64_t first = key0 + g * L;
      const std::int64_t count = std::min<std::int64_t>(L, key_end - first);
      if (r >= rows || count <= 0) {
        scores[r * T::kStepVecs + g] = B<Arch>(0.f);
        continue;
      }
      B<Arch> acc[L];
#pragma GCC unroll 16
      for (int j = 0; j < L; ++j) acc[j] = B<Arch>(0.f);
      const KT* k_row = k_base + first * k_stride;
      for (std::int64_t d = 0; d < dk; d += L) {
        const std::int64_t width = std::min<std::int64_t>(L, dk - d);
        const B<Arch> qv = B<Arch>::load_aligned(q_tile + r * q_stride + d);
#pragma GCC unroll 16
        for (int j = 0; j < L; ++j) {
          if (j < count) {
            const B<Arch> kv = simd::load_chunk<Arch>(k_row + j * k_stride, d, width);
            acc[j] = simd::fmadd<Arch>(qv, kv, acc[j]);
          }
        }
      }
      scores[r * T::kStepVecs + g] = simd::transpose_sum<Arch>(acc);
    }
  }
}

template <class Arch, class T>
class TaskRunner {
  using Tl = Tiles<Arch>;
  static constexpr int R = Tl::kRows, L = Tl::kLanes, BV = Tl::kBlockVecs, SV = Tl::kStepVecs;

 public:
  TaskRunner(const FlashRun& run, const FlashTask& task, float* scratch) noexcept
      : p_(run.problem), tiles_(run.tiles), task_(task), seq_(sequence_of(p_, task.seq)) {
    const FlashProblem& p = p_;
    const PackedView& packed = run.packed;
    dk_padded_ = (p.dk + 31) / 32 * 32;
    const std::int64_t rows = kMaxRowGroup * kMaxTileRows;
    q_tile_ = scratch;
    o_tile_ = q_tile_ + rows * dk_padded_;
    p_tile_ = o_tile_ + rows * p.dv_padded;
    row_max_ = p_tile_ + rows * kKvBlock;
    row_sum_ = row_max_ + rows;
    q_bf16_ = reinterpret_cast<std::uint16_t*>(row_sum_ + rows * kMaxLanes);
    // flash_bf16's P (a step of kStepKeys bf16 words per row) in the fp32 P tile's place.
    p_bf16_ = reinterpret_cast<std::uint16_t*>(p_tile_);
    heads_ = task_heads(p, task);
    rows_per_head_ = task.q_end - task.q_begin;
    kv_end_ = std::min(task.kv_end, seq_.kv_len);
    const std::int64_t kh = task.kv_head;
    // K and V without keys may have no data at all (null): no offset is applied to null.
    if (p.k != nullptr) {
      k_base_ = static_cast<const T*>(p.k) + task.seq * p.k_strides.batch +
                seq_.k_row0 * p.k_strides.seq + kh * p.k_strides.head;
    }
    if (packed.v_bf16) {
      v_bf16_ = packed.v_bf16 + packed.v_offset[task.seq * p.kv_heads + kh];
    } else if (packed.v) {
      v_packed_ = packed.v + packed.v_offset[task.seq * p.kv_heads + kh];
    } else if (p.v != nullptr) {
      v_base_ = static_cast<const T*>(p.v) + task.seq * p.v_strides.batch +
                seq_.k_row0 * p.v_strides.seq + kh * p.v_strides.head;
    }
    if (tiles_.k_layout == KLayout::packed) {
      const std::int64_t offset = packed.k_offset[task.seq * p.kv_heads + kh];
      if (tiles_.bf16_dot) {
        kt_bf16_ = packed.k_bf16 + offset;
      } else {
        kt_ = packed.k + offset;
      }
    }
  }

  void run() noexcept {
    const std::int64_t total = heads_ * rows_per_head_;
    const std::int64_t rows_per_group = static_cast<std::int64_t>(tiles_.row_group) * R;
    for (std::int64_t first = 0; first < total; first += rows_per_group) {
      run_group(first, std::min(total, first + rows_per_group));
    }
  }

 private:
  /// The KV blocks of one online-softmax step (up to kStepBlocks of the walk) and their keys.
  struct Step {
    std::int64_t block[kStepBlocks], keys[kStepBlocks];
    int count = 0;
  };

  void run_group(std::int64_t first, std::int64_t end) noexcept {
    RowRef rows[kMaxRowGroup * kMaxTileRows];
    const int row_count = static_cast<int>(end - first);
    const int tiles = (row_count + R - 1) / R;
    std::int64_t tile_min[kMaxRowGroup], tile_max[kMaxRowGroup];
    std::int64_t group_end = task_.kv_begin;
    const B<Arch> scale(p_.scale_log2);
    for (int t = 0; t < tiles; ++t) {
      tile_min[t] = std::numeric_limits<std::int64_t>::max();
      tile_max[t] = task_.kv_begin;
      for (int i = 0; i < R; ++i) {
        const int index = t * R + i;
        float* q_row = q_tile_ + index * dk_padded_;
        std::fill(o_tile_ + index * p_.dv_padded, o_tile_ + (index + 1) * p_.dv_padded, 0.f);
        row_max_[index] = kMinusInf;
        B<Arch>(0.f).store_aligned(row_sum_ + index * L);
        if (index >= row_count) {  // padding row of the last tile: attends nothing
          rows[index] = RowRef{};
          rows[index].visible_end = task_.kv_begin;
          std::fill(q_row, q_row + dk_padded_, 0.f);
          tile_min[t] = task_.kv_begin;
          continue;
        }
        rows[index] = make_row<T>(p_, task_, seq_, first + index);
        const char* q = static_cast<const char*>(rows[index].q);
        const std::int64_t bytes = p_.dk * std::int64_t{sizeof(T)};
        for (std::int64_t byte = 0; byte < bytes; byte += 64) _mm_prefetch(q + byte, _MM_HINT_T0);
        _mm_prefetch(q + bytes - 1, _MM_HINT_T0);  // the row need not start on a line
        tile_min[t] = std::min(tile_min[t], rows[index].visible_end);
        tile_max[t] = std::max(tile_max[t], rows[index].visible_end);
      }
      group_end = std::max(group_end, tile_max[t]);
    }
    // Q rows once every row's lines were prefetched above: each row is a fresh page (rows of one
    // head are N·D elements apart), and loaded right after each make_row the out-of-order window
    // overlapped only a few rows' misses (5 % of the bf16 kernel's time at S = 2048).
    for (int index = 0; index < row_count; ++index) {
      const T* q = static_cast<const T*>(rows[index].q);
      float* q_row = q_tile_ + index * dk_padded_;
      for (std::int64_t d = 0; d < dk_padded_; d += L) {
        const std::int64_t width = std::min<std::int64_t>(L, p_.dk - d);
        const B<Arch> value =
            width > 0 ? simd::load_chunk<Arch>(q, d, width) * scale : B<Arch>(0.f);
        value.store_aligned(q_row + d);
      }
    }
    if (tiles_.bf16_dot) convert_q_to_bf16(tiles);
    // Per KV block, Q·K^T and the softmax for every micro-tile first, then P·V for every
    // micro-tile: the K^T block (32 KiB at Dk = 128) and then the V block stay in L1 (48 KiB)
    // or L2 across the micro-tiles, where interleaving them per tile re-read both from L2 (L3).
    // Running the Q·K^T passes panel by panel across the micro-tiles instead (each 8 KiB K^T
    // panel in L1 on a 32 KiB L1d) measured no faster on Zen 3.
    // The task's blocks: its list (block-sparse), else every block of [kv_begin, group_end).
    const std::int64_t walk =
        task_.blocks ? task_.block_count : (group_end - task_.kv_begin + kKvBlock - 1) / kKvBlock;
    auto block_at = [&](std::int64_t i) {
      return task_.blocks ? task_.blocks[i] * kKvBlock : task_.kv_begin + i * kKvBlock;
    };
    // Steps of kStepBlocks blocks for flash_bf16 only: fp32 V of 128 keys is 32 KiB per P·V
    // column pass, which did not stay in a 32 KiB L1d across the micro-tiles (its P·V loop ran
    // 9 % slower, eating what the step saved); bf16 V is 16 KiB.
    const int step_blocks = tiles_.bf16_dot ? kStepBlocks : 1;
    for (std::int64_t i = 0; i < walk; i += step_blocks) {
      Step step;
      for (; step.count < step_blocks && i + step.count < walk; ++step.count) {
        const std::int64_t block = block_at(i + step.count);
        if (block >= group_end) break;
        step.block[step.count] = block;
        step.keys[step.count] = std::min(kKvBlock, kv_end_ - block);
      }
      if (step.count == 0) break;
      // Keys of each block each micro-tile's P·V runs over: 0 when no row attends the block, and
      // on the causal diagonal only up to the tile's last visible key (P is 0 past it).
      std::int64_t tile_keys[kStepBlocks][kMaxRowGroup];
      const std::int64_t next_end = std::min(walk, i + 2 * step_blocks);
      for (int t = 0; t < tiles; ++t) {
        if (tiles_.k_layout == KLayout::packed) {
          for (std::int64_t n = i + step_blocks; n < next_end && block_at(n) < group_end; ++n) {
            prefetch_next_block(block_at(n), t, tiles);
          }
        }
        scores_tile(rows + t * R, t, step, tile_min[t], tile_max[t], tile_keys);
      }
      if (v_bf16_) {
        if constexpr (simd::kHasBf16Vnni<Arch>) {  // bf16_dot is set only for this variant
          const std::uint16_t* v[kStepBlocks];
          for (int j = 0; j < step.count; ++j) v[j] = v_bf16_ + step.block[j] * p_.dv_padded;
          pv_bf16(tile_keys, tiles, v, step.count);
        }
      } else if (v_packed_) {  // fp32 steps are one block
        pv(tile_keys[0], tiles, v_packed_ + step.block[0] * p_.dv_padded, p_.dv_padded);
      } else {
        pv(tile_keys[0], tiles, v_base_ + step.block[0] * p_.v_strides.seq, p_.v_strides.seq);
      }
    }
    for (int index = 0; index < row_count; ++index) {
      finish_row<Arch, T>(p_, rows[index], o_tile_ + index * p_.dv_padded,
                          simd::reduce_add<Arch>(B<Arch>::load_aligned(row_sum_ + index * L)),
                          row_max_[index], 0.f);
    }
  }

  /// Share `part` of `parts` of the K^T and V blocks at `next` into L2: the next block streams
  /// in from L3 while this one computes (a KV head's K^T and V do not stay in L2 between
  /// row groups), instead of stalling the first micro-tile that reads it.
  void prefetch_next_block(std::int64_t next, int part, int parts) noexcept {
    const bool bf16 = tiles_.bf16_dot;
    const std::int64_t k_bytes = bf16 ? dk_padded_ * kKvBlock * 2 : p_.dk * kKvBlock * 4;
    const std::int64_t v_bytes = p_.dv_padded * kKvBlock * (bf16 ? 2 : 4);
    const char* kt =
        bf16 ? reinterpret_cast<const char*>(kt_bf16_) : reinterpret_cast<const char*>(kt_);
    kt += next / kKvBlock * k_bytes;
    const char* v =
        bf16 ? reinterpret_cast<const char*>(v_bf16_) : reinterpret_cast<const char*>(v_packed_);
    v += next / kKvBlock * v_bytes;
    const std::int64_t k_lines = k_bytes / 64, v_lines = v_bytes / 64;
    for (std::int64_t i = k_lines * part / parts; i < k_lines * (part + 1) / parts; ++i) {
      _mm_prefetch(kt + i * 64, _MM_HINT_T1);
    }
    for (std::int64_t i = v_lines * part / parts; i < v_lines * (part + 1) / parts; ++i) {
      _mm_prefetch(v + i * 64, _MM_HINT_T1);
    }
  }

  /// bf16 copy of the scaled Q rows (pairs along d feed vdpbf16ps).
  void convert_q_to_bf16(int tiles) noexcept {
    for (std::int64_t i = 0; i < tiles * R * dk_padded_; i += L) {
      simd::store<Arch>(reinterpret_cast<bf16*>(q_bf16_ + i), B<Arch>::load_aligned(q_tile_ + i));
    }
  }

  /// P tile of micro-tile `tile` for the blocks of a step (and the running max/sum).
  /// tile_keys[j][tile]: the keys of block j the tile's P·V runs over (0 when no row of the tile
  /// attends it).
  void scores_tile(const RowRef* rows, int tile, const Step& step, std::int64_t tile_min,
                   std::int64_t tile_max, std::int64_t (*tile_keys)[kMaxRowGroup]) noexcept {
    const int first_index = tile * R;
    B<Arch> scores[R * SV];
    int width = 0;  // score vectors per row, up to the last block the tile attends
    for (int j = 0; j < step.count; ++j) {
      const std::int64_t block = step.block[j];
      B<Arch>* s = scores + j * BV;
      tile_keys[j][tile] = 0;
      bool attends = false;
      // Blocks above the causal diagonal for every row of the tile are skipped.
      const bool partial =
          block < tile_max &&
          tile_needs_mask(p_, rows, R, block, step.keys[j], block + kKvBlock > tile_min, attends);
      if (!attends) {
        for (int r = 0; r < R; ++r) std::fill(s + r * SV, s + r * SV + BV, B<Arch>(kMinusInf));
        continue;
      }
      block_scores(rows, first_index, block, s);
      if (partial) {
        for (int r = 0; r < R; ++r) mask_scores<Arch>(p_, rows[r], block, seq_.kv_len, s + r * SV);
      }
      tile_keys[j][tile] = std::min(step.keys[j], tile_max - block);
      width = (j + 1) * BV;
    }
    if (width > 0 && !softmax_update(first_index, width, scores)) {
      for (int j = 0; j < step.count; ++j) tile_keys[j][tile] = 0;
    }
  }

  /// S of one block for a micro-tile: scores [R][BV] at s, rows SV apart.
  void block_scores(const RowRef* rows, int first_index, std::int64_t block, B<Arch>* s) noexcept {
    const float* q_tile = q_tile_ + first_index * dk_padded_;
    if (tiles_.k_layout == KLayout::packed) {
      if (tiles_.bf16_dot) {
        if constexpr (simd::kHasBf16Vnni<Arch>) {  // bf16_dot is set only for this variant
          qk_bf16<Arch>(q_bf16_ + first_index * dk_padded_, dk_padded_,
                        kt_bf16_ + (block / kKvBlock) * dk_padded_ * kKvBlock, p_.dk, s);
        }
      } else {
        qk_packed<Arch>(q_tile, dk_padded_, kt_ + block / kKvBlock * p_.dk * kKvBlock, p_.dk, s);
      }
    } else {
      int valid_rows = 0;
      for (int i = 0; i < R; ++i) valid_rows += rows[i].q != nullptr;
      qk_direct<Arch>(q_tile, dk_padded_, valid_rows, k_base_, p_.k_strides.seq, block, kv_end_,
                      p_.dk, s);
    }
  }

  /// Updates the running max/sum from the first `width` (masked) score vectors of each row,
  /// rescales O when the max rises by more than kLazyMax and writes P. Returns false when no row
  /// attends any key of the step.
  bool softmax_update(int first_index, int width, B<Arch>* scores) noexcept {
    constexpr float kLazyMax = 8;  // log2 units: weights up to 256
    bool any = false;
    for (int r = 0; r < R; ++r) {
      B<Arch>* s = scores + r * SV;
      float* p_row = p_tile_ + (first_index + r) * kKvBlock;  // fp32: one block per step
      B<Arch> top = s[0];
      for (int c = 1; c < width; ++c) top = xsimd::max(top, s[c]);
      float& m = row_max_[first_index + r];
      // The running max moves lazily: while every score stays within kLazyMax of it (the
      // usual case after the first blocks), the weights are 2^(s - m) <= 2^kLazyMax, harmless
      // in fp32 sums and bf16 weights, and neither the horizontal max nor a rescale of O runs.
      // !(s <= bound) is also true for NaN scores, which take the exact path below.
      const bool within = m > kMinusInf && xsimd::all(top <= B<Arch>(m + kLazyMax));
      const float block_max = within ? m : simd::reduce_max<Arch>(top);
      if (!(block_max > kMinusInf)) {  // nothing attended in this row (or NaN scores)
        if (tiles_.bf16_dot) {
          std::fill(p_bf16_ + (first_index + r) * kStepKeys,
                    p_bf16_ + (first_index + r) * kStepKeys + width * L, std::uint16_t{0});
        } else {
          std::fill(p_row, p_row + width * L, 0.f);
        }
        if (block_max != block_max) row_max_[first_index + r] = block_max;  // propagate NaN
        continue;
      }
      any = true;
      float* l = row_sum_ + (first_index + r) * L;
      if (block_max > m) {
        if (m > kMinusInf) {  // O and l hold earlier blocks
          const float alpha = std::exp2(m - block_max);
          float* o = o_tile_ + (first_index + r) * p_.dv_padded;
          for (std::int64_t i = 0; i < p_.dv_padded; i += L) {
            (B<Arch>::load_aligned(o + i) * B<Arch>(alpha)).store_aligned(o + i);
          }
          (B<Arch>::load_aligned(l) * B<Arch>(alpha)).store_aligned(l);
        }
        m = block_max;
      }
      const B<Arch> shift(m);
      // The row sum stays a vector of per-lane sums: one horizontal add per row at the end.
      B<Arch> sum = B<Arch>::load_aligned(l);
      if (tiles_.bf16_dot) {
        if constexpr (simd::kHasBf16Vnni<Arch>) {
          // P rounded to bf16 once; the sum adds the rounded weights P·V multiplies, so the
          // output stays a weighted mean of V rows (rounding only perturbs the weights), by a
          // bf16 dot product with ones (pairs of weights per lane, exact products). The degree-4
          // exp2 (4.2e-5 relative) is exact enough for weights kept to 2^-9.
          std::uint16_t* p_words = p_bf16_ + (first_index + r) * kStepKeys;
          const __m512i ones = _mm512_set1_epi16(0x3f80);  // bf16 1.0
          for (int c = 0; c < width; c += 2) {
            const __m512i words = pack_bf16<Arch>(exp2_scores<Arch, 4>(s[c] - shift),
                                                  exp2_scores<Arch, 4>(s[c + 1] - shift));
            _mm512_store_si512(p_words + c * L, words);
            sum = dot_bf16<Arch>(sum, words, ones);
          }
        }
      } else {
        for (int c = 0; c < width; ++c) {
          const B<Arch> prob = exp2_scores<Arch>(s[c] - shift);
          prob.store_aligned(p_row + c * L);
          sum += prob;
        }
      }
      sum.store_aligned(l);
    }
    return any;
  }

  /// O[tile rows][col, col + V vectors) += P · V, v: the block's V at column col, key rows
  /// v_stride apart, and the columns of each further kPanel-wide panel panel_step further (V
  /// rows read in place: panel_step = kPanel, one contiguous row). With kPartial the last vector
  /// has `last_count` lanes (a compile-time choice: no per-key branch in the full chunks).
  template <int V, bool kPartial, class VT>
  void pv_chunk(int first_index, const VT* v, std::int64_t v_stride, std::int64_t panel_step,
                std::int64_t keys, std::int64_t col, std::int64_t last_count) noexcept {
    B<Arch> acc[R][V];
    // O's row stride in a local: the compiler cannot tell the stores from p_ and reloaded it
    // after each one.
    const std::int64_t o_stride = p_.dv_padded;
    float* o = o_tile_ + first_index * o_stride + col;
    const float* p_tile = p_tile_ + first_index * kKvBlock;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) acc[r][c] = B<Arch>::load_aligned(o + r * o_stride + c * L);
    }
    const VT* v_vector[V];
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) v_vector[c] = v + c * L / kPanel * panel_step + c * L % kPanel;
    for (std::int64_t j = 0; j < keys; ++j) {
      B<Arch> vv[V];
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) {
        const VT* at = v_vector[c] + j * v_stride;
        vv[c] = (kPartial && c == V - 1) ? simd::load_partial<Arch>(at, last_count, 0.f)
                                         : simd::load<Arch>(at);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const B<Arch> pb(p_tile[r * kKvBlock + j]);
#pragma GCC unroll 4
        for (int c = 0; c < V; ++c) acc[r][c] = simd::fmadd<Arch>(pb, vv[c], acc[r][c]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) acc[r][c].store_aligned(o + r * o_stride + c * L);
    }
  }

  /// O[tile rows] += P · V[first tile_keys[t] block rows] for each micro-tile t of a row group.
  /// Column passes outermost: the pass's V columns (4 KiB per panel) stay in L1 across the
  /// micro-tiles while their O and P rows stream past them.
  template <class VT>
  void pv(const std::int64_t* tile_keys, int tiles, const VT* v, std::int64_t v_stride) noexcept {
    constexpr int DV = Tl::kDvVecs;
    static_assert(kPanel % (DV * L) == 0 || (DV * L) % kPanel == 0, "a pass covers whole panels");
    // Packed V rows are padded to dv_padded (no partial vector); rows read in place end at dv.
    const std::int64_t width = v_packed_ ? p_.dv_padded : p_.dv;
    const std::int64_t vectors = (width + L - 1) / L;
    const std::int64_t tail = width - (vectors - 1) * L;
    // Where column col of the block's key rows starts, the key row stride there, and the step
    // from one panel of columns to the next.
    struct Source {
      const VT* v;
      std::int64_t stride, panel_step;
    };
    auto source = [&](std::int64_t col) {
      if (!v_packed_) return Source{v + col, v_stride, kPanel};
      return Source{v + packed_v_offset(0, col), kPanel, packed_v_offset(0, kPanel)};
    };
    std::int64_t vec = 0;
    for (; vec + DV < vectors; vec += DV) {
      const Source at = source(vec * L);
      for (int t = 0; t < tiles; ++t) {
        if (tile_keys[t] > 0) {
          pv_chunk<DV, false>(t * R, at.v, at.stride, at.panel_step, tile_keys[t], vec * L, L);
        }
      }
    }
    const Source at = source(vec * L);
    for (int t = 0; t < tiles; ++t) {
      if (tile_keys[t] == 0) continue;
      if (tail == L) {
        pv_last<false>(t * R, at, tile_keys[t], vec, vectors - vec, L);
      } else {
        pv_last<true>(t * R, at, tile_keys[t], vec, vectors - vec, tail);
      }
    }
  }

  /// flash_bf16: O[tile rows][col, col + V vectors) += P · V over the key pairs [0, pairs[j])
  /// of each block j of a step, bf16 P (a broadcast pair per row) times V packed as key pairs
  /// (v[j]: block j's panel of column col): 32 MACs per vdpbf16ps.
  template <int V>
  void pv_bf16_chunk(int first_index, const std::uint16_t* const* v, const std::int64_t* pairs,
                     int blocks, std::int64_t col) noexcept {
    __m512 acc[R][V];
    const std::int64_t o_stride = p_.dv_padded;  // a local, as in pv_chunk
    float* o = o_tile_ + first_index * o_stride + col;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) acc[r][c] = _mm512_load_ps(o + r * o_stride + c * L);
    }
    for (int block = 0; block < blocks; ++block) {
      const std::uint16_t* p_words = p_bf16_ + first_index * kStepKeys + block * kKvBlock;
      for (std::int64_t pair = 0; pair < pairs[block]; ++pair) {
        __m512i vv[V];
#pragma GCC unroll 4
        for (int c = 0; c < V; ++c) {
          vv[c] =
              _mm512_load_si512(v[block] + c * L / kPanel * kKvBlock * kPanel + pair * 2 * kPanel);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          std::uint32_t both;
          std::memcpy(&both, p_words + r * kStepKeys + 2 * pair, sizeof both);
          const __m512i pb = _mm512_set1_epi32(static_cast<int>(both));
#pragma GCC unroll 4
          for (int c = 0; c < V; ++c) acc[r][c] = dot_bf16<Arch>(acc[r][c], pb, vv[c]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) _mm512_store_ps(o + r * o_stride + c * L, acc[r][c]);
    }
  }

  /// flash_bf16: O[tile rows] += P · V over the first tile_keys[j][t] keys of each block j of a
  /// step for each micro-tile t, column passes outermost as in pv. v[j]: block j's bf16 key
  /// pairs (packed_v_pair_offset).
  void pv_bf16(const std::int64_t (*tile_keys)[kMaxRowGroup], int tiles,
               const std::uint16_t* const* v, int blocks) noexcept {
    constexpr int DV = Tl::kDvVecs;
    const std::int64_t vectors = p_.dv_padded / L;
    // An odd key count ends with a pair whose second key has P = 0 (masked or padding).
    std::int64_t pairs[kMaxRowGroup][kStepBlocks];
    for (int t = 0; t < tiles; ++t) {
      for (int j = 0; j < blocks; ++j) pairs[t][j] = (tile_keys[j][t] + 1) / 2;
    }
    const auto pass = [&]<int V>(std::integral_constant<int, V>, std::int64_t vec) {
      const std::uint16_t* panel[kStepBlocks];
      for (int j = 0; j < blocks; ++j) panel[j] = v[j] + packed_v_pair_offset(0, vec * L);
      for (int t = 0; t < tiles; ++t) {
        if (!idle(pairs[t], blocks)) pv_bf16_chunk<V>(t * R, panel, pairs[t], blocks, vec * L);
      }
    };
    std::int64_t vec = 0;
    for (; vec + DV <= vectors; vec += DV) pass(std::integral_constant<int, DV>{}, vec);
    switch (vectors - vec) {
      case 1:
        return pass(std::integral_constant<int, 1>{}, vec);
      case 2:
        return pass(std::integral_constant<int, 2>{}, vec);
      case 3:
        return pass(std::integral_constant<int, 3>{}, vec);
      default:
        return;
    }
  }

  /// No key of any block to run over (a micro-tile that attends none of the step).
  static bool idle(const std::int64_t* keys, int blocks) noexcept {
    for (int j = 0; j < blocks; ++j) {
      if (keys[j] > 0) return false;
    }
    return true;
  }

  template <bool kPartial, class Source>
  void pv_last(int first_index, const Source& at, std::int64_t keys, std::int64_t vec,
               std::int64_t left, std::int64_t tail) noexcept {
    const auto run = [&]<int V>(std::integral_constant<int, V>) {
      pv_chunk<V, kPartial>(first_index, at.v, at.stride, at.panel_step, keys, vec * L, tail);
    };
    static_assert(Tl::kDvVecs == 2 || Tl::kDvVecs == 4);
    switch (left) {
      case 1:
        return run(std::integral_constant<int, 1>{});
      case 2:
        return run(std::integral_constant<int, 2>{});
      case 3:
        if constexpr (Tl::kDvVecs == 4) return run(std::integral_constant<int, 3>{});
        [[fallthrough]];
      default:
        return run(std::integral_constant<int, Tl::kDvVecs>{});
    }
  }

  const FlashProblem& p_;
  const FlashTiles tiles_;
  const FlashTask& task_;
  Sequence seq_;
  std::int64_t dk_padded_ = 0, heads_ = 1, rows_per_head_ = 0, kv_end_ = 0;
  float *q_tile_, *o_tile_, *p_tile_, *row_max_, *row_sum_;
  std::uint16_t *q_bf16_, *p_bf16_;
  const T* k_base_ = nullptr;
  const T* v_base_ = nullptr;
  const float* v_packed_ = nullptr;
  const float* kt_ = nullptr;
  const std::uint16_t* kt_bf16_ = nullptr;
  const std::uint16_t* v_bf16_ = nullptr;
};

}  // namespace

template <class Arch>
void flash_task(const FlashRun& run, const FlashTask& task, float* scratch) noexcept {
  switch (run.problem.dtype) {
    case DType::bf16:
      return TaskRunner<Arch, bf16>(run, task, scratch).run();
    case DType::f16:
      return TaskRunner<Arch, f16>(run, task, scratch).run();
    default:
      return TaskRunner<Arch, float>(run, task, scratch).run();
  }
}

namespace {
template <class Arch, class T>
void merge_rows(const FlashProblem& p, const FlashTask& task, std::int64_t splits,
                const float* partial_out, const float* partial_lse, float* merged) noexcept {
  const Sequence seq = sequence_of(p, task.seq);
  const std::int64_t rows = task_heads(p, task) * (task.q_end - task.q_begin);
  for (std::int64_t r = 0; r < rows; ++r) {
    const core::LseWeights w =
        core::merge_by_lse<Arch>(partial_out + r * p.dv_padded, rows * p.dv_padded, partial_lse + r,
                                 rows, splits, p.dv_padded, merged);
    finish_row<Arch, T>(p, make_row<T>(p, task, seq, r), merged, w.total, w.top, 0.f);
  }
}
}  // namespace

template <class Arch>
void flash_merge_splits(const FlashProblem& problem, const FlashTask& task, std::int64_t splits,
                        const float* partial_out, const float* partial_lse,
                        float* merged) noexcept {
  switch (problem.dtype) {
    case DType::bf16:
      return merge_rows<Arch, bf16>(problem, task, splits, partial_out, partial_lse, merged);
    case DType::f16:
      return merge_rows<Arch, f16>(problem, task, splits, partial_out, partial_lse, merged);
    default:
      return merge_rows<Arch, float>(problem, task, splits, partial_out, partial_lse, merged);
  }
}

template <class Arch>
void widen_row(DType dtype, const void* src, std::int64_t count, float* dst) noexcept {
  const auto widen = [&]<class T>(const T* row) {
    constexpr std::int64_t kLanes = B<Arch>::size;
    for (std::int64_t i = 0; i < count; i += kLanes) {
      const std::int64_t width = std::min<std::int64_t>(kLanes, count - i);
      simd::store_chunk<Arch>(dst, i, width, simd::load_chunk<Arch>(row, i, width), false);
    }
  };
  switch (dtype) {
    case DType::bf16:
      return widen(static_cast<const bf16*>(src));
    case DType::f16:
      return widen(static_cast<const f16*>(src));
    default:
      return widen(static_cast<const float*>(src));
  }
}

namespace {

/// 16 rows of 16 floats transposed in registers: 32-bit, then 64-bit interleaves within each
/// 128-bit lane (column c of rows 4g..4g+3 in lane c / 4 of u[4g + c % 4]), then 128-bit
/// lanes gathered across the four groups. (Templates: a variant without the ISA emits nothing.)
template <class Arch>
void transpose_16x16(const float* const* rows, std::int64_t d, float* out) noexcept {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    const __m512 a = _mm512_loadu_ps(rows[i] + d), b = _mm512_loadu_ps(rows[i + 1] + d);
    t[i] = _mm512_unpacklo_ps(a, b);
    t[i + 1] = _mm512_unpackhi_ps(a, b);
  }
  for (int g = 0; g < 16; g += 4) {
    const __m512d lo_a = _mm512_castps_pd(t[g]), lo_b = _mm512_castps_pd(t[g + 2]);
    const __m512d hi_a = _mm512_castps_pd(t[g + 1]), hi_b = _mm512_castps_pd(t[g + 3]);
    u[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo_a, lo_b));
    u[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo_a, lo_b));
    u[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi_a, hi_b));
    u[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi_a, hi_b));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 low_01 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44);
    const __m512 high_01 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xEE);
    const __m512 low_23 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44);
    const __m512 high_23 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xEE);
    _mm512_store_ps(out + (j + 0) * 16, _mm512_shuffle_f32x4(low_01, low_23, 0x88));
    _mm512_store_ps(out + (j + 4) * 16, _mm512_shuffle_f32x4(low_01, low_23, 0xDD));
    _mm512_store_ps(out + (j + 8) * 16, _mm512_shuffle_f32x4(high_01, high_23, 0x88));
    _mm512_store_ps(out + (j + 12) * 16, _mm512_shuffle_f32x4(high_01, high_23, 0xDD));
  }
}

/// 8 rows of 8 floats transposed in registers into rows `stride` floats apart.
template <class Arch>
void transpose_8x8(const float* const* rows, std::int64_t d, float* out,
                   std::int64_t stride) noexcept {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    const __m256 a = _mm256_loadu_ps(rows[i] + d), b = _mm256_loadu_ps(rows[i + 1] + d);
    t[i] = _mm256_unpacklo_ps(a, b);
    t[i + 1] = _mm256_unpackhi_ps(a, b);
  }
  for (int g = 0; g < 8; g += 4) {
    u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
    u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
    u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    _mm256_store_ps(out + j * stride, _mm256_permute2f128_ps(u[j], u[4 + j], 0x20));
    _mm256_store_ps(out + (j + 4) * stride, _mm256_permute2f128_ps(u[j], u[4 + j], 0x31));
  }
}

}  // namespace

template <class Arch>
void transpose_k_panel(const float* const* rows, std::int64_t dk, float* panel) noexcept {
  static_assert(kPanel == 16);
  std::int64_t d = 0;
  if constexpr (simd::kIsAvx512<Arch>) {
    for (; d + 16 <= dk; d += 16) transpose_16x16<Arch>(rows, d, panel + d * kPanel);
  } else if constexpr (simd::kIsAvx2<Arch>) {
    for (; d + 8 <= dk; d += 8) {
      transpose_8x8<Arch>(rows, d, panel + d * kPanel, kPanel);
      transpose_8x8<Arch>(rows + 8, d, panel + d * kPanel + 8, kPanel);
    }
  }
  for (; d < dk; ++d) {
    for (int key = 0; key < kPanel; ++key) panel[d * kPanel + key] = rows[key][d];
  }
}

template void flash_task<KernelArch>(const FlashRun&, const FlashTask&, float*) noexcept;
template void transpose_k_panel<KernelArch>(const float* const*, std::int64_t, float*) noexcept;
template void widen_row<KernelArch>(DType, const void*, std::int64_t, float*) noexcept;
template void flash_merge_splits<KernelArch>(const FlashProblem&, const FlashTask&, std::int64_t,
                                             const float*, const float*, float*) noexcept;

}  // namespace ditops::attention
