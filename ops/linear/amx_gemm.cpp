// The linear layers' GEMMs on AMX tiles (amx_gemm.hpp): W8A8's int8 GEMM (TDPBUSD) and the
// bf16 GEMM of FLOAT layers of bf16 weights called with bf16 x (TDPBF16PS), for the panels of
// the avx512+bf16+vnni variant. Compiled once into the library, in that variant's object
// library with -mamx-tile -mamx-int8 -mamx-bf16 on top of its flags (CMakeLists.txt), and once
// into the test suite on the tile model (DITOPS_AMX_MODEL=1) at the baseline.
//
// A block is 32 rows x the panel's 16 or 32 columns: two A tiles (16 rows x 64 bytes of k of
// x: 64 u8 or 32 bf16) by one or two B tiles (16 words of k x 16 columns, loaded straight from
// the panel: its rows are the panel's words, 4 int8 or 2 bf16 of consecutive k per column,
// cols · 4 bytes apart), into two or four int32 or fp32 C tiles of 16 x 16. Per 64 bytes of k
// a 32 x 32 block loads 4 tiles and runs 4 TDPBUSD (16 x 16 x 64 multiply-adds each) or
// TDPBF16PS (16 x 16 x 32). The C tiles hold the sums over the whole k; then they go through a
// small buffer to the epilogue of the register-tile kernels (gemm_epilogue.hpp): int8's, or
// the FLOAT layers' sum + bias. Rows past the call's end are never read: a block of fewer than
// 32 rows (the call's last) configures its tiles with fewer rows. Panels are the outer loop,
// so a panel stays in L2 while the call's blocks of rows (in L2 too, the layer sizes them so)
// pass over it.

#include "ops/linear/amx_gemm.hpp"

#include <algorithm>
#include <type_traits>

#include "ops/core/amx_tiles.hpp"
#include "ops/core/arch.hpp"
#include "ops/linear/gemm_epilogue.hpp"

namespace ditops::linear::DITOPS_AMX_NAMESPACE {
namespace {

using core::kTileRowBytes;
using core::kTileRows;
using core::TileConfig;

// Tile registers: C (i, j) = A tile i times B tile j is tile 2i + j (0-3); A tiles 4-5; B 6-7.
constexpr int kBlockRows = 2 * kTileRows;
constexpr std::int64_t kStepBytes = kTileRowBytes;  // bytes of k per step (16 words)
constexpr int kTileColumns = kTileRowBytes / 4;     // int32 columns of a C tile, s8 of a B tile

/// The configuration of a block of `rows` rows (1 to 32) and nb B tiles: A and C tiles of the
/// rows each covers (an A tile past the rows stays unconfigured), B tiles of 16 words.
TileConfig block_config(int rows, int nb) noexcept {
  TileConfig config;
  config.palette = 1;
  for (int i = 0; i < 2; ++i) {
    const int tile_rows = std::clamp(rows - i * kTileRows, 0, kTileRows);
    if (tile_rows == 0) continue;
    config.rows[4 + i] = static_cast<std::uint8_t>(tile_rows);
    config.colsb[4 + i] = kTileRowBytes;
    for (int j = 0; j < nb; ++j) {
      config.rows[2 * i + j] = static_cast<std::uint8_t>(tile_rows);
      config.colsb[2 * i + j] = kTileRowBytes;
    }
  }
  for (int j = 0; j < nb; ++j) {
    config.rows[6 + j] = kStepBytes / 4;
    config.colsb[6 + j] = kTileRowBytes;
  }
  return config;
}

// C += A · B on the unit of the sums' type (tile numbers are the instructions' immediates).
#define DOT(c, a, b)                 \
  do {                               \
    if constexpr (kBf16) {           \
      DITOPS_TILE_DPBF16PS(c, a, b); \
    } else {                         \
      DITOPS_TILE_DPBUSD(c, a, b);   \
    }                                \
  } while (false)

/// The int32 (kBf16: fp32) sums of a block (NA A tiles of rows, NB B tiles of columns) over
/// k_bytes bytes of k (a multiple of 64), stored to sums (row r at sums + r · NB · 16). a: the
/// block's first row (rows a_stride bytes apart); weights: the panel (words NB · 64 bytes
/// apart).
template <int NA, int NB, bool kBf16, class Sum>
void block_sums(const std::uint8_t* a, std::int64_t a_stride, const std::uint8_t* weights,
                std::int64_t k_bytes, Sum* sums) noexcept {
  constexpr std::int64_t kWordBytes = NB * kTileRowBytes;  // a word of k of the panel's columns
  DITOPS_TILE_ZERO(0);
  if constexpr (NB == 2) DITOPS_TILE_ZERO(1);
  if constexpr (NA == 2) {
    DITOPS_TILE_ZERO(2);
    if constexpr (NB == 2) DITOPS_TILE_ZERO(3);
  }
  for (std::int64_t kb = 0; kb < k_bytes; kb += kStepBytes) {
    const std::uint8_t* b = weights + kb / 4 * kWordBytes;
    DITOPS_TILE_LOAD(4, a + kb, a_stride);
    DITOPS_TILE_LOAD(6, b, kWordBytes);
    DOT(0, 4, 6);
    if constexpr (NB == 2) {
      DITOPS_TILE_LOAD(7, b + kTileRowBytes, kWordBytes);
      DOT(1, 4, 7);
    }
    if constexpr (NA == 2) {
      DITOPS_TILE_LOAD(5, a + kTileRows * a_stride + kb, a_stride);
      DOT(2, 5, 6);
      if constexpr (NB == 2) DOT(3, 5, 7);
    }
  }
  constexpr std::int64_t kRowBytes = NB * kTileColumns * 4;
  constexpr int kLowerHalf = kTileRows * NB * kTileColumns;  // of sums: rows 16-31
  DITOPS_TILE_STORE(0, sums, kRowBytes);
  if constexpr (NB == 2) DITOPS_TILE_STORE(1, sums + kTileColumns, kRowBytes);
  if constexpr (NA == 2) {
    DITOPS_TILE_STORE(2, sums + kLowerHalf, kRowBytes);
    if constexpr (NB == 2) DITOPS_TILE_STORE(3, sums + kLowerHalf + kTileColumns, kRowBytes);
  }
}
#undef DOT

/// The tile program of both GEMMs with NB B tiles (16 · NB columns per panel): a holds the
/// call's rows (from row_begin), a_stride bytes apart, k_bytes of k each; row_scale the int8
/// rows' scales (kBf16: unused).
template <class Arch, int NB, bool kBf16>
void gemm_tiles(const GemmProblem& p, const std::uint8_t* a, std::int64_t a_stride,
                std::int64_t k_bytes, const float* row_scale, std::int64_t row_begin,
                std::int64_t row_end, std::int64_t panel_begin, std::int64_t panel_end) noexcept {
  constexpr int kColumns = NB * kTileColumns, kLanes = simd::F32<Arch>::size;
  constexpr int V = kColumns / kLanes;
  static_assert(V * kLanes == kColumns);
  using F32 = simd::F32<Arch>;
  using I32 = simd::I32<Arch>;
  using Sum = std::conditional_t<kBf16, float, std::int32_t>;
  alignas(64) Sum sums[kBlockRows * kColumns];
  std::int64_t y_rows[kMaxAmxRows];
  y_row_offsets(p, row_begin, row_end, y_rows);
  const std::int64_t blocks = (row_end - row_begin + kBlockRows - 1) / kBlockRows;
  const int last_rows = static_cast<int>(row_end - row_begin - (blocks - 1) * kBlockRows);
  const TileConfig full = block_config(kBlockRows, NB), last = block_config(last_rows, NB);
  int configured = 0;  // rows of the loaded configuration
  for (std::int64_t panel = panel_begin; panel < panel_end; ++panel) {
    const auto* weights = static_cast<const std::uint8_t*>(p.panels) + panel * p.panel_bytes;
    const std::int64_t n0 = panel * kColumns;
    using Epilogue = std::conditional_t<kBf16, F32Epilogue<Arch, V>, Int8Epilogue<Arch, V>>;
    const Epilogue epilogue(p, n0);
    // Every other panel takes the blocks backwards, so a short last block changes the tile
    // configuration once per panel, not twice.
    const bool backwards = (panel - panel_begin) % 2 == 1;
    for (std::int64_t i = 0; i < blocks; ++i) {
      const std::int64_t block = backwards ? blocks - 1 - i : i;
      const std::int64_t row0 = row_begin + block * kBlockRows;
      const int rows = block == blocks - 1 ? last_rows : kBlockRows;
      if (rows != configured) {
        DITOPS_TILE_CONFIG(rows == kBlockRows ? full : last);
        configured = rows;
      }
      const std::uint8_t* block_a = a + (row0 - row_begin) * a_stride;
      if (rows > kTileRows) {
        block_sums<2, NB, kBf16>(block_a, a_stride, weights, k_bytes, sums);
      } else {
        block_sums<1, NB, kBf16>(block_a, a_stride, weights, k_bytes, sums);
      }
      store_tile<Arch, V>(p, y_rows + (row0 - row_begin), row0, rows, n0, [&](int r, int c) {
        if constexpr (kBf16) {
          return epilogue(F32::load_aligned(sums + r * kColumns + c * kLanes), c);
        } else {
          return epilogue(I32::load_aligned(sums + r * kColumns + c * kLanes), c,
                          row_scale[row0 - row_begin + r]);
        }
      });
    }
  }
  DITOPS_TILE_RELEASE();
}

}  // namespace

template <class Arch>
void gemm_int8_amx(const GemmProblem& p, const std::uint8_t* a, const float* row_scale,
                   std::int64_t row_begin, std::int64_t row_end, std::int64_t panel_begin,
                   std::int64_t panel_end) noexcept {
  if (row_end <= row_begin || panel_end <= panel_begin) return;
  if (p.columns == kTileColumns) {
    gemm_tiles<Arch, 1, false>(p, a, p.k_padded, p.k_padded, row_scale, row_begin, row_end,
                               panel_begin, panel_end);
  } else {
    gemm_tiles<Arch, 2, false>(p, a, p.k_padded, p.k_padded, row_scale, row_begin, row_end,
                               panel_begin, panel_end);
  }
}

template <class Arch>
void gemm_bf16_amx(const GemmProblem& p, const bf16* a, std::int64_t row_begin,
                   std::int64_t row_end, std::int64_t panel_begin,
                   std::int64_t panel_end) noexcept {
  if (row_end <= row_begin || panel_end <= panel_begin) return;
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(a);
  const std::int64_t row_bytes = p.k_padded * static_cast<std::int64_t>(sizeof(bf16));
  if (p.columns == kTileColumns) {
    gemm_tiles<Arch, 1, true>(p, bytes, row_bytes, row_bytes, nullptr, row_begin, row_end,
                              panel_begin, panel_end);
  } else {
    gemm_tiles<Arch, 2, true>(p, bytes, row_bytes, row_bytes, nullptr, row_begin, row_end,
                              panel_begin, panel_end);
  }
}

template void gemm_int8_amx<KernelArch>(const GemmProblem&, const std::uint8_t*, const float*,
                                        std::int64_t, std::int64_t, std::int64_t,
                                        std::int64_t) noexcept;
template void gemm_bf16_amx<KernelArch>(const GemmProblem&, const bf16*, std::int64_t, std::int64_t,
                                        std::int64_t, std::int64_t) noexcept;

}  // namespace ditops::linear::DITOPS_AMX_NAMESPACE
