// flash_bf16's task kernel on AMX-BF16 tiles: flash_task's contract (amx_flash.hpp) for runs
// with tiles.bf16_dot, on the K^T and V the run packed for the vdpbf16ps kernel. Compiled once
// into the library, in the avx512+bf16+vnni variant's object library with -mamx-tile
// -mamx-int8 -mamx-bf16 on top of its flags (CMakeLists.txt), and once into the test suite on
// the tile model (DITOPS_AMX_MODEL=1) at the baseline.
//
// A task's rows (head, position; GQA heads are rows of the same task, as in flash_kernel.cpp)
// are cut into row blocks of 16 (the last one shorter: its tiles are configured with fewer
// rows, and rows past the task's end are never read). A row group of up to 6 row blocks walks
// the KV blocks together, so each 64-key block of K^T and V (16 KiB each in bf16 at d = 128)
// stays in L1 across them. Per row block and KV block:
//   S = Q·K^T: per 32 d, one A tile (16 rows x 32 bf16 of the scaled Q, rounded as the
//     vdpbf16ps kernel rounds it) times four B tiles loaded straight from the packed K^T (its
//     [d / 2][64 keys][2] words are the VNNI layout: 16 pair rows x 16 keys per tile, rows 256
//     bytes apart) into four fp32 C tiles of 16 x 16, then stored to a 4 KiB buffer;
//   the online softmax on the variant's SIMD: the masks of flash_kernel.cpp (tile_rows.hpp:
//     causal diagonal, sequence and task ends, boolean or additive mask, row windows) on the
//     partial blocks only, the lazily moving running max, P = 2^(S - m) rounded to bf16 once
//     into a 2 KiB buffer, the row sums adding the rounded weights (the output stays a convex
//     combination of V rows);
//   O += P·V: P as two A tiles (32 keys each), V as B tiles straight from the packed bf16 V
//     (packed_v_pair_offset: per 16-column panel, 32 rows of a key pair x 16 columns, 64 bytes
//     each), and O as fp32 C tiles loaded from and stored back to the row block's O rows.
// Why O lives in memory and not in tiles: the 8 tiles of 1 KiB hold 128 fp32 columns of 16 rows
// in all; S takes 4 (64 keys), Q·K^T's A and B tiles the other 4, and O at d = 128 would need 8
// more. (For the same reason a row block is 16 rows, not 32: S of 32 rows is 8 C tiles.) O's
// 8 KiB per row block are read and written as C tiles once per KV block, from L1 or L2, each
// load and store feeding two TDPBF16PS (64 keys), and the rare rescales when the running max
// moves past kLazyMax run on SIMD over the same rows.
// The row sums and the LSE and the output (or split-KV partial) are written by finish_row, as
// flash_kernel.cpp writes them.

#include "ops/attention/amx_flash.hpp"

#include "ops/attention/tile_rows.hpp"
#include "ops/core/amx_tiles.hpp"
#include "ops/core/arch.hpp"
#include "ops/core/simd/convert.hpp"

namespace ditops::attention::DITOPS_AMX_NAMESPACE {
namespace {

using core::kTileRowBytes;
using core::kTileRows;
using core::TileConfig;

constexpr int kBlockRows = kTileRows;                        ///< rows of a row block
constexpr int kGroupRows = kMaxRowGroup * kMaxTileRows;      ///< scratch rows (96)
constexpr int kKeyTiles = static_cast<int>(kKvBlock) / 16;   ///< S C tiles per block (4)
constexpr std::int64_t kStepWords = kTileRowBytes / 2;       ///< bf16 of k per dot product
constexpr std::int64_t kKtPairBytes = kKvBlock * 2 * 2;      ///< a pair row of packed K^T
constexpr std::int64_t kPanelBytes = kKvBlock * kPanel * 2;  ///< a 16-column panel of V
constexpr std::int64_t kSRowBytes = kKvBlock * 4;            ///< a row of S (fp32)
constexpr std::int64_t kPRowBytes = kKvBlock * 2;            ///< a row of P (bf16)
static_assert(kKeyTiles == 4 && kPanel == 16 && kGroupRows % kBlockRows == 0);

/// The tile registers. Shaped by the row block (rows x 64 bytes): S's C tiles 0-3, which hold
/// P's two A tiles (0, 1) and O's C tiles (2, 3) during P·V, and Q's A tile 4. Shaped 16 x 64
/// bytes: the B tiles 5-7 (K^T, then V).
TileConfig row_block_config(int rows) noexcept {
  TileConfig config;
  config.palette = 1;
  for (int t = 0; t < 5; ++t) {
    config.rows[t] = static_cast<std::uint8_t>(rows);
    config.colsb[t] = kTileRowBytes;
  }
  for (int t = 5; t < 8; ++t) {
    config.rows[t] = kTileRows;
    config.colsb[t] = kTileRowBytes;
  }
  return config;
}

/// S [rows][64] (fp32, kSRowBytes apart) = Q rows (bf16, q_stride words apart, dk_padded of
/// them) · the packed K^T block kt ([dk_padded / 2][64][2] words).
void block_scores(const std::uint16_t* q, std::int64_t q_stride, const std::uint16_t* kt,
                  std::int64_t dk_padded, float* s) noexcept {
  DITOPS_TILE_ZERO(0);
  DITOPS_TILE_ZERO(1);
  DITOPS_TILE_ZERO(2);
  DITOPS_TILE_ZERO(3);
  constexpr std::int64_t kKeyWords = 16 * 2;  // 16 keys of a pair row
  for (std::int64_t d = 0; d < dk_padded; d += kStepWords) {
    const std::uint16_t* b = kt + d / 2 * kKvBlock * 2;  // pair row d / 2
    DITOPS_TILE_LOAD(4, q + d, q_stride * 2);
    DITOPS_TILE_LOAD(5, b, kKtPairBytes);
    DITOPS_TILE_DPBF16PS(0, 4, 5);
    DITOPS_TILE_LOAD(6, b + kKeyWords, kKtPairBytes);
    DITOPS_TILE_DPBF16PS(1, 4, 6);
    DITOPS_TILE_LOAD(7, b + 2 * kKeyWords, kKtPairBytes);
    DITOPS_TILE_DPBF16PS(2, 4, 7);
    DITOPS_TILE_LOAD(5, b + 3 * kKeyWords, kKtPairBytes);
    DITOPS_TILE_DPBF16PS(3, 4, 5);
  }
  DITOPS_TILE_STORE(0, s, kSRowBytes);
  DITOPS_TILE_STORE(1, s + 16, kSRowBytes);
  DITOPS_TILE_STORE(2, s + 32, kSRowBytes);
  DITOPS_TILE_STORE(3, s + 48, kSRowBytes);
}

/// O rows (fp32, o_stride floats apart, dv_padded columns) += P [rows][64] (bf16, kPRowBytes
/// apart) · the packed bf16 V block v. halves: 1 when no row attends keys 32-63 (their P is 0:
/// the second dot product is skipped), else 2.
void block_pv(const std::uint16_t* p, const std::uint16_t* v, std::int64_t dv_padded, float* o,
              std::int64_t o_stride, int halves) noexcept {
  constexpr std::int64_t kHalfWords = kPanelBytes / 2 / 2;  // 16 key pairs of a panel
  const std::int64_t o_bytes = o_stride * 4, panels = dv_padded / kPanel;
  DITOPS_TILE_LOAD(0, p, kPRowBytes);
  if (halves == 2) DITOPS_TILE_LOAD(1, p + 32, kPRowBytes);
  const auto panel_v = [&](std::int64_t panel) { return v + panel * kKvBlock * kPanel; };
  std::int64_t c = 0;
  for (; c + 2 <= panels; c += 2) {  // two panels: two independent C tiles
    const std::uint16_t *v0 = panel_v(c), *v1 = panel_v(c + 1);
    DITOPS_TILE_LOAD(2, o + c * kPanel, o_bytes);
    DITOPS_TILE_LOAD(3, o + (c + 1) * kPanel, o_bytes);
    DITOPS_TILE_LOAD(5, v0, kTileRowBytes);
    DITOPS_TILE_DPBF16PS(2, 0, 5);
    DITOPS_TILE_LOAD(6, v1, kTileRowBytes);
    DITOPS_TILE_DPBF16PS(3, 0, 6);
    if (halves == 2) {
      DITOPS_TILE_LOAD(7, v0 + kHalfWords, kTileRowBytes);
      DITOPS_TILE_DPBF16PS(2, 1, 7);
      DITOPS_TILE_LOAD(5, v1 + kHalfWords, kTileRowBytes);
      DITOPS_TILE_DPBF16PS(3, 1, 5);
    }
    DITOPS_TILE_STORE(2, o + c * kPanel, o_bytes);
    DITOPS_TILE_STORE(3, o + (c + 1) * kPanel, o_bytes);
  }
  if (c < panels) {  // an odd last panel (dv_padded = 16 mod 32)
    const std::uint16_t* v0 = panel_v(c);
    DITOPS_TILE_LOAD(2, o + c * kPanel, o_bytes);
    DITOPS_TILE_LOAD(5, v0, kTileRowBytes);
    DITOPS_TILE_DPBF16PS(2, 0, 5);
    if (halves == 2) {
      DITOPS_TILE_LOAD(6, v0 + kHalfWords, kTileRowBytes);
      DITOPS_TILE_DPBF16PS(2, 1, 6);
    }
    DITOPS_TILE_STORE(2, o + c * kPanel, o_bytes);
  }
}

template <class Arch, class T>
class AmxTaskRunner {
  static constexpr int L = static_cast<int>(B<Arch>::size);
  static constexpr int BV = static_cast<int>(kKvBlock) / L;  ///< score vectors per row
  /// exp2's polynomial: the vdpbf16ps kernel's on AVX-512 (the same weights up to the order of
  /// the score sums), the 6-degree one elsewhere (the model's baseline build).
  static constexpr int kExpDegree = simd::kIsAvx512<Arch> ? 4 : 6;

 public:
  AmxTaskRunner(const FlashRun& run, const FlashTask& task, float* scratch) noexcept
      : p_(run.problem), task_(task), seq_(sequence_of(p_, task.seq)) {
    dk_padded_ = round_up(p_.dk, 32);
    // flash_scratch_floats() sizes this and more: O, S, P, max, sum, Q.
    o_ = scratch;
    s_ = o_ + kGroupRows * p_.dv_padded;
    p_words_ = reinterpret_cast<std::uint16_t*>(s_ + kBlockRows * kKvBlock);
    row_max_ = s_ + kBlockRows * kKvBlock + kBlockRows * kKvBlock / 2;
    row_sum_ = row_max_ + kGroupRows;
    q_ = reinterpret_cast<std::uint16_t*>(row_sum_ + kGroupRows * kMaxLanes);
    heads_ = task_heads(p_, task);
    rows_per_head_ = task.q_end - task.q_begin;
    kv_end_ = std::min(task.kv_end, seq_.kv_len);
    const std::int64_t slot = task.seq * p_.kv_heads + task.kv_head;
    kt_ = run.packed.k_bf16 + run.packed.k_offset[slot];
    v_ = run.packed.v_bf16 + run.packed.v_offset[slot];
    group_rows_ = static_cast<int>(std::min<std::int64_t>(
        kGroupRows, round_up(std::int64_t{run.tiles.row_group} * kMaxTileRows, kBlockRows)));
  }

  void run() noexcept {
    const std::int64_t total = heads_ * rows_per_head_;
    for (std::int64_t first = 0; first < total; first += group_rows_) {
      run_group(first, std::min<std::int64_t>(total, first + group_rows_));
    }
    if (configured_ != 0) DITOPS_TILE_RELEASE();
  }

 private:
  void run_group(std::int64_t first, std::int64_t end) noexcept {
    RowRef rows[kGroupRows];
    const int row_count = static_cast<int>(end - first);
    const int blocks = (row_count + kBlockRows - 1) / kBlockRows;
    std::int64_t block_min[kGroupRows / kBlockRows], block_max[kGroupRows / kBlockRows];
    std::int64_t group_end = task_.kv_begin;
    for (int b = 0; b < blocks; ++b) {
      block_min[b] = std::numeric_limits<std::int64_t>::max();
      block_max[b] = task_.kv_begin;
      for (int index = b * kBlockRows; index < std::min(row_count, (b + 1) * kBlockRows); ++index) {
        rows[index] = make_row<T>(p_, task_, seq_, first + index);
        std::fill(o_ + index * p_.dv_padded, o_ + (index + 1) * p_.dv_padded, 0.f);
        row_max_[index] = kMinusInf;
        B<Arch>(0.f).store_aligned(row_sum_ + index * L);
        block_min[b] = std::min(block_min[b], rows[index].visible_end);
        block_max[b] = std::max(block_max[b], rows[index].visible_end);
      }
      group_end = std::max(group_end, block_max[b]);
    }
    load_q(rows, row_count);
    const std::int64_t walk =
        task_.blocks ? task_.block_count : (group_end - task_.kv_begin + kKvBlock - 1) / kKvBlock;
    const auto block_at = [&](std::int64_t i) {
      return task_.blocks ? task_.blocks[i] * kKvBlock : task_.kv_begin + i * kKvBlock;
    };
    for (std::int64_t i = 0; i < walk; ++i) {
      const std::int64_t block = block_at(i);
      if (block >= group_end) break;
      const std::int64_t keys = std::min(kKvBlock, kv_end_ - block);
      if (i + 1 < walk && block_at(i + 1) < group_end) prefetch_block(block_at(i + 1));
      // Every other KV block takes the row blocks backwards, so a short last row block changes
      // the tile configuration once per KV block, not twice.
      const bool backwards = i % 2 == 1;
      for (int n = 0; n < blocks; ++n) {
        const int b = backwards ? blocks - 1 - n : n;
        if (block >= block_max[b]) continue;  // above the causal diagonal for every row
        const int first_row = b * kBlockRows;
        const int count = std::min(kBlockRows, row_count - first_row);
        bool attends = false;
        const bool partial = tile_needs_mask(p_, rows + first_row, count, block, keys,
                                             block + kKvBlock > block_min[b], attends);
        if (!attends) continue;
        run_block(rows + first_row, first_row, count, block, partial,
                  std::min(keys, block_max[b] - block));
      }
    }
    for (int index = 0; index < row_count; ++index) {
      finish_row<Arch, T>(p_, rows[index], o_ + index * p_.dv_padded,
                          simd::reduce_add<Arch>(B<Arch>::load_aligned(row_sum_ + index * L)),
                          row_max_[index], 0.f);
    }
  }

  /// The scaled Q rows of the group (scale·log2 e folded in, as flash_kernel.cpp does) rounded
  /// to bf16, dk_padded words per row, zero past dk.
  void load_q(const RowRef* rows, int row_count) noexcept {
    const B<Arch> scale(p_.scale_log2);
    for (int index = 0; index < row_count; ++index) {
      const char* q = static_cast<const char*>(rows[index].q);
      const std::int64_t bytes = p_.dk * std::int64_t{sizeof(T)};
      for (std::int64_t byte = 0; byte < bytes; byte += 64) _mm_prefetch(q + byte, _MM_HINT_T0);
      _mm_prefetch(q + bytes - 1, _MM_HINT_T0);
    }
    for (int index = 0; index < row_count; ++index) {
      const T* q = static_cast<const T*>(rows[index].q);
      auto* row = reinterpret_cast<bf16*>(q_ + index * dk_padded_);
      for (std::int64_t d = 0; d < dk_padded_; d += L) {
        const std::int64_t width = std::min<std::int64_t>(L, p_.dk - d);
        const B<Arch> value =
            width > 0 ? simd::load_chunk<Arch>(q, d, width) * scale : B<Arch>(0.f);
        simd::store<Arch>(row + d, value);
      }
    }
  }

  /// Shares the next KV block's K^T and V into L2 while this one computes.
  void prefetch_block(std::int64_t block) const noexcept {
    const auto* kt = reinterpret_cast<const char*>(kt_ + block / kKvBlock * dk_padded_ * kKvBlock);
    const auto* v = reinterpret_cast<const char*>(v_ + block * p_.dv_padded);
    for (std::int64_t i = 0; i < dk_padded_ * kKvBlock * 2; i += 64) {
      _mm_prefetch(kt + i, _MM_HINT_T1);
    }
    for (std::int64_t i = 0; i < p_.dv_padded * kKvBlock * 2; i += 64) {
      _mm_prefetch(v + i, _MM_HINT_T1);
    }
  }

  /// One row block (`count` rows from `first_row` of the group) against the KV block at
  /// `block`: S on tiles, the softmax (masking when `partial`), then P·V on tiles over the
  /// block's first `pv_keys` keys (P is 0 past them: masked or past the sequence end).
  void run_block(const RowRef* rows, int first_row, int count, std::int64_t block, bool partial,
                 std::int64_t pv_keys) noexcept {
    if (count != configured_) {
      const TileConfig config = row_block_config(count);
      DITOPS_TILE_CONFIG(config);
      configured_ = count;
    }
    block_scores(q_ + first_row * dk_padded_, dk_padded_,
                 kt_ + block / kKvBlock * dk_padded_ * kKvBlock, dk_padded_, s_);
    if (!softmax(rows, first_row, count, block, partial)) return;
    block_pv(p_words_, v_ + block * p_.dv_padded, p_.dv_padded, o_ + first_row * p_.dv_padded,
             p_.dv_padded, pv_keys > kKvBlock / 2 ? 2 : 1);
  }

  /// The online-softmax update of flash_kernel.cpp's flash_bf16 path for each row of S: masks
  /// (partial blocks), the lazy running max (O and the sum rescaled only when a score passes
  /// it by more than kLazyMax), P rounded to bf16, the sum of the rounded weights. Returns
  /// false when no row attends a key of the block.
  bool softmax(const RowRef* rows, int first_row, int count, std::int64_t block,
               bool partial) noexcept {
    constexpr float kLazyMax = 8;  // log2 units: weights up to 256, exact enough in bf16
    bool any = false;
    for (int r = 0; r < count; ++r) {
      const int index = first_row + r;
      auto* p_row = reinterpret_cast<bf16*>(p_words_ + r * kKvBlock);
      B<Arch> s[BV];
      for (int c = 0; c < BV; ++c) s[c] = B<Arch>::load_aligned(s_ + r * kKvBlock + c * L);
      if (partial) mask_scores<Arch>(p_, rows[r], block, seq_.kv_len, s);
      B<Arch> top = s[0];
      for (int c = 1; c < BV; ++c) top = xsimd::max(top, s[c]);
      float& m = row_max_[index];
      // !(s <= bound) is also true for NaN scores, which take the exact path below.
      const bool within = m > kMinusInf && xsimd::all(top <= B<Arch>(m + kLazyMax));
      const float block_max = within ? m : simd::reduce_max<Arch>(top);
      if (!(block_max > kMinusInf)) {  // nothing attended in this row (or NaN scores)
        std::fill(p_words_ + r * kKvBlock, p_words_ + (r + 1) * kKvBlock, std::uint16_t{0});
        if (block_max != block_max) m = block_max;  // propagate NaN
        continue;
      }
      any = true;
      float* l = row_sum_ + index * L;
      if (block_max > m) {
        if (m > kMinusInf) {  // O and l hold earlier blocks
          const B<Arch> alpha(std::exp2(m - block_max));
          float* o = o_ + index * p_.dv_padded;
          for (std::int64_t i = 0; i < p_.dv_padded; i += L) {
            (B<Arch>::load_aligned(o + i) * alpha).store_aligned(o + i);
          }
          (B<Arch>::load_aligned(l) * alpha).store_aligned(l);
        }
        m = block_max;
      }
      const B<Arch> shift(m);
      B<Arch> sum = B<Arch>::load_aligned(l);
      for (int c = 0; c < BV; ++c) {
        simd::store<Arch>(p_row + c * L, exp2_scores<Arch, kExpDegree>(s[c] - shift));
        sum += simd::load<Arch>(p_row + c * L);  // the weight P·V multiplies
      }
      sum.store_aligned(l);
    }
    return any;
  }

  const FlashProblem& p_;
  const FlashTask& task_;
  Sequence seq_;
  std::int64_t dk_padded_ = 0, heads_ = 1, rows_per_head_ = 0, kv_end_ = 0;
  int group_rows_ = kGroupRows, configured_ = 0;  ///< rows of the loaded tile configuration
  float *o_, *s_, *row_max_, *row_sum_;
  std::uint16_t *p_words_, *q_;
  const std::uint16_t* kt_ = nullptr;
  const std::uint16_t* v_ = nullptr;
};

}  // namespace

template <class Arch>
void flash_task_amx(const FlashRun& run, const FlashTask& task, float* scratch) noexcept {
  switch (run.problem.dtype) {
    case DType::bf16:
      return AmxTaskRunner<Arch, bf16>(run, task, scratch).run();
    case DType::f16:
      return AmxTaskRunner<Arch, f16>(run, task, scratch).run();
    default:
      return AmxTaskRunner<Arch, float>(run, task, scratch).run();
  }
}

template void flash_task_amx<KernelArch>(const FlashRun&, const FlashTask&, float*) noexcept;

}  // namespace ditops::attention::DITOPS_AMX_NAMESPACE
