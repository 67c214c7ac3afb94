// The int8 attention task on AMX tiles: int8_attention_task's contract (amx_int8_attention.hpp).
// Compiled once into the library, in the avx512+bf16+vnni variant's object library with the tile
// instructions enabled on top of its flags (CMakeLists.txt), and once into the test suite on the
// tile model (DITOPS_AMX_MODEL=1) at the baseline.
//
// The task is the vpdpbusd kernel's (int8_runner.hpp: the same row groups, stage order, softmax
// and UP epilogue); only the two products run on tiles, 16 rows at a time, and give the same exact
// int32 sums:
// - QK: per 16 rows of Q (u8, q + 128, one A tile per 64 bytes of d) and the block's 64 keys,
//   four int32 C tiles of 16 x 16 start at -128 · Σ k of their keys (a row loaded with stride 0)
//   and take one TDPBUSD per 16 words of d, the B tiles loaded straight from the block's K
//   ([word][64 keys][4]: a word row of 16 keys is 64 bytes, rows 256 apart). A head dim that is
//   not a multiple of 64 ends with a smaller A / B pair (tiles 6 and 7). The C tiles are stored
//   to the runner's S rows, which the softmax stage reads as it reads the register tiles'.
// - PV: per 16 rows of P (u8, the block's 64 keys: one A tile) and 64 columns of V ([16 words]
//   [dv_padded][4]: B tiles straight from the block), four C tiles, stored to a 4 KiB buffer from
//   which up_row applies O = alpha · O + p_factor · v_scale · PV to the rows of the micro-tiles
//   that attend the block. It multiplies all 16 words: P levels past a tile's keys are 0 (masked)
//   and V past the block's keys is 0, so the sums are those of the vpdpbusd kernel, which stops
//   at the tile's last key.
// Rows of a 16-row step that belong to micro-tiles not attending the block are computed and
// ignored (the vpdpbusd kernel skips such micro-tiles); a step with none attending is skipped.
// The last step of a row group configures its tiles with fewer rows, so no row past the group is
// read.

#include "ops/attention/amx_int8_attention.hpp"

#include <algorithm>
#include <cstdint>

#include "ops/attention/int8_runner.hpp"
#include "ops/core/amx_tiles.hpp"
#include "ops/core/arch.hpp"

namespace ditops::attention::DITOPS_AMX_NAMESPACE {
namespace {

using core::kTileRowBytes;
using core::kTileRows;
using core::TileConfig;

constexpr int kStepWords = kTileRowBytes / 4;        // 4-byte words of one A tile row
constexpr int kColumnsPerTile = kTileRowBytes / 4;   // int32 columns of a C tile
constexpr std::int64_t kKeyRowBytes = kKvBlock * 4;  // a word of K: 64 keys x 4 bytes
static_assert(kKvBlock == 4 * kColumnsPerTile, "a KV block is four C tiles of keys");
static_assert(kKvBlock == kStepWords * 4, "a block's P row is one A tile row");

/// Tiles 0-3: C (rows x 16 int32); 4: A (rows x 64 bytes); 5: B (16 words x 16 columns); with
/// remainder_words > 0 (a head dim not a multiple of 64), 6: A (rows x 4 · remainder bytes) and
/// 7: B (remainder words x 16 columns).
TileConfig stage_config(int rows, std::int64_t remainder_words) noexcept {
  TileConfig config;
  config.palette = 1;
  for (int tile = 0; tile < 5; ++tile) {
    config.rows[tile] = static_cast<std::uint8_t>(rows);
    config.colsb[tile] = kTileRowBytes;
  }
  config.rows[5] = kStepWords;
  config.colsb[5] = kTileRowBytes;
  if (remainder_words > 0) {
    config.rows[6] = static_cast<std::uint8_t>(rows);
    config.colsb[6] = static_cast<std::uint16_t>(4 * remainder_words);
    config.rows[7] = static_cast<std::uint8_t>(remainder_words);
    config.colsb[7] = kTileRowBytes;
  }
  return config;
}

/// Loads the configuration for `rows` rows unless it is loaded (configured: its rows, or 0).
inline void configure(int rows, std::int64_t remainder_words, int& configured) noexcept {
  if (rows == configured) return;
  DITOPS_TILE_CONFIG(stage_config(rows, remainder_words));
  configured = rows;
}

/// Whether a micro-tile covering any of rows [first, first + rows) attends the block.
inline bool step_attends(const std::int64_t* tile_keys, int tile_rows, int first,
                         int rows) noexcept {
  for (int t = first / tile_rows; t <= (first + rows - 1) / tile_rows; ++t) {
    if (tile_keys[t] > 0) return true;
  }
  return false;
}

// One product into each of C tiles 0-3 (16 keys or columns each), the B tiles loaded from b
// (column tile j at b + 64 j bytes, rows `stride` apart) into tile B_TILE in turn. Tile numbers
// must be literals: the instructions take them as immediates.
#define DITOPS_FOUR_PRODUCTS(A_TILE, B_TILE, b, stride)      \
  DITOPS_TILE_LOAD(B_TILE, (b), stride);                     \
  DITOPS_TILE_DPBUSD(0, A_TILE, B_TILE);                     \
  DITOPS_TILE_LOAD(B_TILE, (b) + kTileRowBytes, stride);     \
  DITOPS_TILE_DPBUSD(1, A_TILE, B_TILE);                     \
  DITOPS_TILE_LOAD(B_TILE, (b) + 2 * kTileRowBytes, stride); \
  DITOPS_TILE_DPBUSD(2, A_TILE, B_TILE);                     \
  DITOPS_TILE_LOAD(B_TILE, (b) + 3 * kTileRowBytes, stride); \
  DITOPS_TILE_DPBUSD(3, A_TILE, B_TILE)

template <class Arch>
struct TileDots {
  static constexpr int R = Int8Tiles<Arch, true>::kRows, L = Int8Tiles<Arch, true>::kLanes;

  /// S rows (64 int32 each, from s) of every 16-row step a micro-tile attending the block
  /// covers: u8 Q · s8 K^T - 128 · Σ k.
  static void qk(const std::uint8_t* q8, std::int64_t q_stride, const std::int64_t* tile_keys,
                 int tiles, const std::int8_t* k, std::int64_t dk_words, const std::int32_t* k_sum,
                 std::int32_t* s) noexcept {
    alignas(64) std::int32_t start[kKvBlock];  // the C tiles' first row, per key
    for (std::int64_t key = 0; key < kKvBlock; ++key) {
      start[key] = static_cast<std::int32_t>(0u - static_cast<std::uint32_t>(k_sum[key]));
    }
    const auto* key_bytes = reinterpret_cast<const std::uint8_t*>(k);
    const std::int64_t whole = dk_words / kStepWords * kStepWords;
    const std::int64_t remainder = dk_words - whole;
    const int rows_total = tiles * R;
    int configured = 0;
    for (int first = 0; first < rows_total; first += kTileRows) {
      const int rows = std::min(kTileRows, rows_total - first);
      if (!step_attends(tile_keys, R, first, rows)) continue;
      configure(rows, remainder, configured);
      DITOPS_TILE_LOAD(0, start, 0);
      DITOPS_TILE_LOAD(1, start + kColumnsPerTile, 0);
      DITOPS_TILE_LOAD(2, start + 2 * kColumnsPerTile, 0);
      DITOPS_TILE_LOAD(3, start + 3 * kColumnsPerTile, 0);
      const std::uint8_t* q = q8 + first * q_stride;
      for (std::int64_t word = 0; word < whole; word += kStepWords) {
        DITOPS_TILE_LOAD(4, q + word * 4, q_stride);
        DITOPS_FOUR_PRODUCTS(4, 5, key_bytes + word * kKeyRowBytes, kKeyRowBytes);
      }
      if (remainder > 0) {
        DITOPS_TILE_LOAD(6, q + whole * 4, q_stride);
        DITOPS_FOUR_PRODUCTS(6, 7, key_bytes + whole * kKeyRowBytes, kKeyRowBytes);
      }
      std::int32_t* rows_out = s + first * kKvBlock;
      DITOPS_TILE_STORE(0, rows_out, kKeyRowBytes);
      DITOPS_TILE_STORE(1, rows_out + kColumnsPerTile, kKeyRowBytes);
      DITOPS_TILE_STORE(2, rows_out + 2 * kColumnsPerTile, kKeyRowBytes);
      DITOPS_TILE_STORE(3, rows_out + 3 * kColumnsPerTile, kKeyRowBytes);
    }
  }

  /// PV of every 16-row step a micro-tile attending the block covers, then up_row for the rows
  /// of those micro-tiles: p, alpha and p_factor are the runner's slot (row r at p + 64 r); o
  /// its O rows (dv_padded floats apart).
  static void pv_up(const std::uint8_t* p, const std::int64_t* tile_keys, int tiles,
                    const std::int8_t* v, std::int64_t dv_padded, const float* v_scale,
                    const float* alpha, const float* p_factor, float* o) noexcept {
    const auto* value_bytes = reinterpret_cast<const std::uint8_t*>(v);
    const std::int64_t v_stride = dv_padded * 4, column_tiles = dv_padded / kColumnsPerTile;
    const int rows_total = tiles * R;
    int configured = 0;
    alignas(64) std::int32_t sums[kTileRows * kKvBlock];  // 16 rows x 64 columns
    for (int first = 0; first < rows_total; first += kTileRows) {
      const int rows = std::min(kTileRows, rows_total - first);
      if (!step_attends(tile_keys, R, first, rows)) continue;
      configure(rows, 0, configured);
      DITOPS_TILE_LOAD(4, p + first * kKvBlock, kKvBlock);
      for (std::int64_t tile = 0; tile < column_tiles; tile += 4) {
        const int count = static_cast<int>(std::min<std::int64_t>(4, column_tiles - tile));
        const std::uint8_t* b = value_bytes + tile * kTileRowBytes;
        DITOPS_TILE_ZERO(0);
        DITOPS_TILE_LOAD(5, b, v_stride);
        DITOPS_TILE_DPBUSD(0, 4, 5);
        DITOPS_TILE_STORE(0, sums, kKeyRowBytes);
        if (count > 1) {
          DITOPS_TILE_ZERO(1);
          DITOPS_TILE_LOAD(5, b + kTileRowBytes, v_stride);
          DITOPS_TILE_DPBUSD(1, 4, 5);
          DITOPS_TILE_STORE(1, sums + kColumnsPerTile, kKeyRowBytes);
        }
        if (count > 2) {
          DITOPS_TILE_ZERO(2);
          DITOPS_TILE_LOAD(5, b + 2 * kTileRowBytes, v_stride);
          DITOPS_TILE_DPBUSD(2, 4, 5);
          DITOPS_TILE_STORE(2, sums + 2 * kColumnsPerTile, kKeyRowBytes);
        }
        if (count > 3) {
          DITOPS_TILE_ZERO(3);
          DITOPS_TILE_LOAD(5, b + 3 * kTileRowBytes, v_stride);
          DITOPS_TILE_DPBUSD(3, 4, 5);
          DITOPS_TILE_STORE(3, sums + 3 * kColumnsPerTile, kKeyRowBytes);
        }
        const std::int64_t column = tile * kColumnsPerTile;
        switch (count) {
          case 1:
            update<kColumnsPerTile / L>(first, rows, tile_keys, sums, v_scale + column, alpha,
                                        p_factor, o + column, dv_padded);
            break;
          case 2:
            update<2 * kColumnsPerTile / L>(first, rows, tile_keys, sums, v_scale + column, alpha,
                                            p_factor, o + column, dv_padded);
            break;
          case 3:
            update<3 * kColumnsPerTile / L>(first, rows, tile_keys, sums, v_scale + column, alpha,
                                            p_factor, o + column, dv_padded);
            break;
          default:
            update<4 * kColumnsPerTile / L>(first, rows, tile_keys, sums, v_scale + column, alpha,
                                            p_factor, o + column, dv_padded);
        }
      }
    }
  }

 private:
  /// up_row over V vectors of columns for rows [first, first + rows) of attending micro-tiles
  /// (alpha 1 multiplies exactly, so rescaling every row gives the vpdpbusd kernel's bits).
  template <int V>
  static void update(int first, int rows, const std::int64_t* tile_keys, const std::int32_t* sums,
                     const float* v_scale, const float* alpha, const float* p_factor, float* o,
                     std::int64_t dv_padded) noexcept {
    for (int r = 0; r < rows; ++r) {
      const int row = first + r;
      if (tile_keys[row / R] == 0) continue;
      typename simd::I32<Arch>::register_type pv[V];
      for (int c = 0; c < V; ++c)
        pv[c] = simd::I32<Arch>::load_aligned(sums + r * kKvBlock + c * L);
      up_row<Arch, V, true>(pv, v_scale, alpha[row], p_factor[row], o + row * dv_padded);
    }
  }
};

#undef DITOPS_FOUR_PRODUCTS

}  // namespace

template <class Arch>
void int8_attention_task_amx(const FlashProblem& p, const Int8Operands& op, const FlashTask& task,
                             float* scratch) noexcept {
  switch (p.dtype) {
    case DType::bf16:
      Int8Runner<Arch, bf16, TileDots<Arch>>(p, op, task, scratch).run();
      break;
    case DType::f16:
      Int8Runner<Arch, f16, TileDots<Arch>>(p, op, task, scratch).run();
      break;
    default:
      Int8Runner<Arch, float, TileDots<Arch>>(p, op, task, scratch).run();
  }
  DITOPS_TILE_RELEASE();
}

template void int8_attention_task_amx<KernelArch>(const FlashProblem&, const Int8Operands&,
                                                  const FlashTask&, float*) noexcept;

}  // namespace ditops::attention::DITOPS_AMX_NAMESPACE
