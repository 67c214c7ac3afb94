#pragma once
// The AMX tile instructions the tile kernels use (ops/linear/amx_gemm.cpp and the other AMX
// kernels), in one of two implementations chosen by DITOPS_AMX_MODEL:
//   0 (default): the instructions themselves, from <immintrin.h> (-mamx-tile -mamx-int8
//      -mamx-bf16), in namespace ditops::core::amx. Only the library's AMX kernel objects
//      include it.
//   1: a software model of them, in namespace ditops::core::amx_model, with the ISA's
//      semantics and its legality checks: the test suite runs whole tile programs on CPUs
//      without AMX, and a program that would fault on the hardware (a tile used before
//      LDTILECFG, shapes a dot product does not accept, a configuration LDTILECFG rejects)
//      aborts naming the instruction.
// Tile registers are immediates of the instructions: the macros take them as literal numbers,
//   DITOPS_TILE_ZERO(tile)
//   DITOPS_TILE_LOAD(tile, base, stride)     (TILELOADD: rows x colsb bytes, rows stride apart)
//   DITOPS_TILE_STORE(tile, base, stride)    (TILESTORED)
//   DITOPS_TILE_DPBUSD(c, a, b)              (TDPBUSD: C[m][n] += Σ_k,i u8 A[m][4k+i] s8
//                                             B[k][4n+i], int32)
//   DITOPS_TILE_DPBF16PS(c, a, b)            (TDPBF16PS: C[m][n] += Σ_k,i bf16 A[m][2k+i] bf16
//                                             B[k][2n+i], fp32)
// B tiles are in the "VNNI" layout: a row holds, per column, the 4 bytes (int8) or 2 words (bf16)
// of consecutive k. The configuration goes through DITOPS_TILE_CONFIG(config) and
// DITOPS_TILE_RELEASE().

#include <cstdint>
#include <type_traits>

#ifndef DITOPS_AMX_MODEL
#define DITOPS_AMX_MODEL 0
#endif
// The namespace of the tile functions and of the kernel compiled on them: the two builds never
// share a symbol.
#if DITOPS_AMX_MODEL
#define DITOPS_AMX_NAMESPACE amx_model
#else
#define DITOPS_AMX_NAMESPACE amx
#endif

namespace ditops::core {

/// LDTILECFG's 64-byte operand, palette 1: 8 tiles of at most 16 rows of 64 bytes.
struct TileConfig {
  std::uint8_t palette = 0;    ///< 1: the AMX palette; 0: no tiles (as after TILERELEASE)
  std::uint8_t start_row = 0;  ///< restart point of an interrupted load or store; 0
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};  ///< bytes per row of each tile (only 0-7 exist in palette 1)
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

inline constexpr int kTiles = 8;          ///< palette 1
inline constexpr int kTileRows = 16;      ///< most rows of a tile
inline constexpr int kTileRowBytes = 64;  ///< most bytes of a tile row

}  // namespace ditops::core

#if DITOPS_AMX_MODEL

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ditops::core::amx_model {

/// One thread's tile state, as the hardware keeps it per thread.
struct TileState {
  bool configured = false;
  TileConfig config;
  alignas(64) std::uint8_t data[kTiles][kTileRows][kTileRowBytes] = {};
};
inline thread_local TileState tile_state;

[[noreturn]] inline void tile_fault(const char* instruction, const char* what, int tile = -1) {
  if (tile >= 0) {
    std::fprintf(stderr, "ditops AMX tile model: %s tmm%d: %s\n", instruction, tile, what);
  } else {
    std::fprintf(stderr, "ditops AMX tile model: %s: %s\n", instruction, what);
  }
  std::abort();
}

/// The tile an instruction names, which must be configured (rows and colsb both non-zero).
inline void check_tile(const char* instruction, int tile) {
  if (tile < 0 || tile >= kTiles) tile_fault(instruction, "no such tile in palette 1", tile);
  if (!tile_state.configured) tile_fault(instruction, "used before LDTILECFG", tile);
  if (tile_state.config.rows[tile] == 0) tile_fault(instruction, "tile not configured", tile);
}

/// LDTILECFG: checks the configuration as the instruction does (#GP otherwise) and zeroes
/// every tile; palette 0 leaves the tiles unconfigured, as TILERELEASE does.
inline void tile_load_config(const TileConfig& config) {
  constexpr const char* kName = "LDTILECFG";
  if (config.palette > 1) tile_fault(kName, "palette is neither 0 nor 1");
  if (config.start_row != 0) tile_fault(kName, "start_row is not 0");
  for (std::uint8_t byte : config.reserved) {
    if (byte != 0) tile_fault(kName, "reserved bytes are not 0");
  }
  if (config.palette == 0) {
    tile_state.configured = false;
    return;
  }
  for (int t = 0; t < 16; ++t) {
    const int rows = config.rows[t], colsb = config.colsb[t];
    if (t >= kTiles && (rows != 0 || colsb != 0)) {
      tile_fault(kName, "configures a tile palette 1 does not have", t);
    }
    if (rows > kTileRows) tile_fault(kName, "more than 16 rows", t);
    if (colsb > kTileRowBytes) tile_fault(kName, "more than 64 bytes per row", t);
    if ((rows == 0) != (colsb == 0)) tile_fault(kName, "rows and colsb not both 0 or non-0", t);
  }
  tile_state.config = config;
  tile_state.configured = true;
  std::memset(tile_state.data, 0, sizeof tile_state.data);
}

/// TILERELEASE: back to the initial state (no configuration).
inline void tile_release() { tile_state.configured = false; }

inline void tile_zero(int tile) {
  check_tile("TILEZERO", tile);
  std::memset(tile_state.data[tile], 0, sizeof tile_state.data[tile]);
}

/// TILELOADD: the configured rows x colsb bytes from base + row · stride; the rest of the tile
/// becomes 0.
inline void tile_load(int tile, const void* base, std::int64_t stride) {
  check_tile("TILELOADD", tile);
  const int rows = tile_state.config.rows[tile], colsb = tile_state.config.colsb[tile];
  std::memset(tile_state.data[tile], 0, sizeof tile_state.data[tile]);
  for (int r = 0; r < rows; ++r) {
    std::memcpy(tile_state.data[tile][r], static_cast<const std::uint8_t*>(base) + r * stride,
                static_cast<std::size_t>(colsb));
  }
}

/// TILESTORED: the configured rows x colsb bytes to base + row · stride.
inline void tile_store(int tile, void* base, std::int64_t stride) {
  check_tile("TILESTORED", tile);
  const int rows = tile_state.config.rows[tile], colsb = tile_state.config.colsb[tile];
  for (int r = 0; r < rows; ++r) {
    std::memcpy(static_cast<std::uint8_t*>(base) + r * stride, tile_state.data[tile][r],
                static_cast<std::size_t>(colsb));
  }
}

/// The shapes of a dot product C += A · B (TDPBUSD, TDPBF16PS), checked as the instructions
/// check them: three distinct configured tiles, A.rows = C.rows, A.colsb = 4 · B.rows, B.colsb =
/// C.colsb, each a multiple of 4 bytes.
struct DotShape {
  int m_rows, n_bytes, k_bytes;
};
inline DotShape dot_shape(const char* instruction, int c, int a, int b) {
  check_tile(instruction, c);
  check_tile(instruction, a);
  check_tile(instruction, b);
  if (c == a || c == b || a == b) {
    tile_fault(instruction, "C, A and B are not three distinct tiles");
  }
  const TileConfig& config = tile_state.config;
  const DotShape shape{config.rows[c], config.colsb[c], config.colsb[a]};
  if (config.rows[a] != shape.m_rows) tile_fault(instruction, "A's rows differ from C's", a);
  if (shape.k_bytes != 4 * config.rows[b]) {
    tile_fault(instruction, "A's colsb is not 4 x B's rows", a);
  }
  if (config.colsb[b] != shape.n_bytes) tile_fault(instruction, "B's colsb differs from C's", b);
  if (shape.n_bytes % 4 != 0 || shape.k_bytes % 4 != 0) {
    tile_fault(instruction, "colsb not whole dwords", c);
  }
  return shape;
}

/// C += A · B for the configured (checked) shapes, one C element at a time: `Sum` is C's element
/// type, and add(sum, a, b) adds the products of one dword of A (a row's 4 bytes of a k) and the
/// matching dword of B to it, in the instruction's order. C's rows and bytes past its configured
/// ones become 0.
template <class Sum, class AddDword>
inline void tile_dot(const char* instruction, int c, int a, int b, const AddDword& add) {
  const auto [m_rows, n_bytes, k_bytes] = dot_shape(instruction, c, a, b);
  auto& dst = tile_state.data[c];
  const auto& lhs = tile_state.data[a];
  const auto& rhs = tile_state.data[b];
  alignas(64) std::uint8_t result[kTileRows][kTileRowBytes] = {};
  for (int m = 0; m < m_rows; ++m) {
    for (int n = 0; n < n_bytes / 4; ++n) {
      Sum sum;
      std::memcpy(&sum, &dst[m][4 * n], 4);
      for (int k = 0; k < k_bytes / 4; ++k) sum = add(sum, &lhs[m][4 * k], &rhs[k][4 * n]);
      std::memcpy(&result[m][4 * n], &sum, 4);
    }
  }
  std::memcpy(dst, result, sizeof result);
}

/// TDPBUSD: C[m][n] += Σ_k Σ_i u8 A[m][4k + i] · s8 B[k][4n + i] in int32 (wrapping).
inline void tile_dpbusd(int c, int a, int b) {
  tile_dot<std::uint32_t>(
      "TDPBUSD", c, a, b, [](std::uint32_t sum, const std::uint8_t* x, const std::uint8_t* y) {
        for (int i = 0; i < 4; ++i) {
          const int product =
              static_cast<int>(x[i]) * static_cast<int>(static_cast<std::int8_t>(y[i]));
          sum += static_cast<std::uint32_t>(product);
        }
        return sum;
      });
}

/// bf16 -> fp32 as TDPBF16PS reads its inputs: denormals are zero (DAZ).
inline float bf16_input(std::uint16_t word) {
  if ((word & 0x7F80u) == 0) word &= 0x8000u;  // exponent 0: ±0 or a denormal
  const std::uint32_t bits = static_cast<std::uint32_t>(word) << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

/// An fp32 result as TDPBF16PS writes it: denormals flushed to zero (FTZ).
inline float flush_denormal(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7F800000u) == 0) bits &= 0x80000000u;
  std::memcpy(&value, &bits, 4);
  return value;
}

/// TDPBF16PS: C[m][n] (fp32) += A[m][2k] · B[k][2n] + A[m][2k + 1] · B[k][2n + 1] over k, in
/// the ISA's order (per k, the even pair's product added, then the odd one's, each an fp32
/// operation rounded to nearest even; bf16 products are exact in fp32), inputs DAZ, results FTZ
/// (a k of 2 words per 4 bytes).
inline void tile_dpbf16ps(int c, int a, int b) {
  tile_dot<float>("TDPBF16PS", c, a, b,
                  [](float sum, const std::uint8_t* x, const std::uint8_t* y) {
                    for (int i = 0; i < 2; ++i) {
                      std::uint16_t x_word, y_word;
                      std::memcpy(&x_word, x + 2 * i, 2);
                      std::memcpy(&y_word, y + 2 * i, 2);
                      sum = flush_denormal(sum + bf16_input(x_word) * bf16_input(y_word));
                    }
                    return sum;
                  });
}

}  // namespace ditops::core::amx_model

#define DITOPS_TILE_ZERO(tile) ::ditops::core::amx_model::tile_zero(tile)
#define DITOPS_TILE_LOAD(tile, base, stride) \
  ::ditops::core::amx_model::tile_load(tile, base, stride)
#define DITOPS_TILE_STORE(tile, base, stride) \
  ::ditops::core::amx_model::tile_store(tile, base, stride)
#define DITOPS_TILE_DPBUSD(c, a, b) ::ditops::core::amx_model::tile_dpbusd(c, a, b)
#define DITOPS_TILE_DPBF16PS(c, a, b) ::ditops::core::amx_model::tile_dpbf16ps(c, a, b)
#define DITOPS_TILE_CONFIG(config) ::ditops::core::amx_model::tile_load_config(config)
#define DITOPS_TILE_RELEASE() ::ditops::core::amx_model::tile_release()

#else  // the instructions

// GCC's macros, then clang's.
#if !(defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)) && \
    !(defined(__AMXTILE__) && defined(__AMXINT8__) && defined(__AMXBF16__))
#error "AMX kernels are compiled with -mamx-tile -mamx-int8 -mamx-bf16 (or DITOPS_AMX_MODEL=1)"
#endif
#include <immintrin.h>

#include "ops/core/arch.hpp"

// The tile kernels take the avx512+bf16+vnni variant's operands and helpers, so they are
// compiled with its flags (CMakeLists.txt).
static_assert(std::is_same_v<ditops::KernelArch, ditops::avx512_bf16>,
              "AMX kernels are compiled with the avx512+bf16+vnni variant's flags");

namespace ditops::core::amx {

inline void tile_load_config(const TileConfig& config) {
  // GCC's _tile_loadconfig tells the compiler it reads 8 bytes of the 64: make every store to
  // the configuration happen before it.
  __asm__ volatile("" : : "m"(config) : "memory");
  _tile_loadconfig(&config);
}
inline void tile_release() { _tile_release(); }

}  // namespace ditops::core::amx

#define DITOPS_TILE_ZERO(tile) _tile_zero(tile)
#define DITOPS_TILE_LOAD(tile, base, stride) _tile_loadd(tile, base, stride)
#define DITOPS_TILE_STORE(tile, base, stride) _tile_stored(tile, base, stride)
#define DITOPS_TILE_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#define DITOPS_TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define DITOPS_TILE_CONFIG(config) ::ditops::core::amx::tile_load_config(config)
#define DITOPS_TILE_RELEASE() ::ditops::core::amx::tile_release()

#endif
