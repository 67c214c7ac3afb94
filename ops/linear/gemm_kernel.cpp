// The linear layers' GEMM kernels, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// int8: the register tile is simd::dot_tile, the one the int8 attention and MLA kernels use:
// a word (4 bytes of k) of each of `rows` rows of x broadcast against the panel's columns.
// On AVX2 (16 ymm) 4 rows x 2 vectors: 8 accumulators, 2 weight vectors, the broadcast row,
// its magnitude and the sign-adjusted weights leave room for the pmaddwd constant; each word
// costs 2 loads + 4 broadcasts for 8 vpmaddubsw/vpmaddwd pairs, so the multiply ports, not the
// loads, bound it. With VNNI (32 zmm) 8 rows x 2 vectors: 16 vpdpbusd per 2 loads + 8
// broadcasts; with AVX-VNNI (16 ymm) 6 rows x 2 vectors: 12 accumulators, 2 weight vectors and
// the broadcast row, 12 vpdpbusd per 2 loads + 6 broadcasts. The panel of a whole k (k x 16
// bytes on AVX2: 48 KiB at k = 3072) streams from L2 while the tile's rows stay in L1; the
// layer hands out blocks of rows x panels.
// f32: 6 rows x 2 vectors on AVX2 (12 accumulators + 2 + 1 of 16 ymm), 12 x 2 on AVX-512
// (24 + 2 + 1 of 32 zmm), broadcast-FMA as in SGEMM.
// bf16 pairs (a FLOAT layer of bf16 weights on AVX512-BF16): the same 12 x 2 tile, blocking,
// partial sums and epilogue. bf16 x: a pair of k of a row broadcast against the panel's pairs,
// vdpbf16ps (32 multiply-adds per instruction, twice the fp32 FMA's), the rows' slice copied as
// bf16 and the chunks of k twice as deep (the same 16 KiB of panel). fp32 x: the fp32 FMA, each
// pair widened as it is loaded (a shift and an and per vector of 16 columns and 2 k, on the
// integer ports, beside 48 FMAs): weights half the size of fp32 panels, at the speed of fp32
// panels (the FMAs bound both), so a layer keeps only the pairs.

#include "ops/linear/gemm_kernel.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ops/core/arch.hpp"
#include "ops/core/simd/bf16_dot.hpp"
#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/int8_dot.hpp"
#include "ops/core/simd/partial.hpp"
#include "ops/core/simd/row_chunks.hpp"
#include "ops/linear/gemm_epilogue.hpp"

namespace ditops::linear {
namespace {

using simd::F32;
using simd::I32;

template <class Arch>
constexpr int kInt8Rows = simd::kHasBf16Vnni<Arch>  ? 8
                          : simd::kHasAvxVnni<Arch> ? 6
                                                    : 4;
template <class Arch>
constexpr int kF32Rows = simd::kIsAvx512<Arch> ? 12
                         : simd::kIsAvx2<Arch> ? 6
                                               : 4;
constexpr int kVectors = 2;  // per tile row, f32 and int8 past one vector of columns
/// Columns of a tile of V vectors (kVectors unless said).
template <class Arch, int V = kVectors>
constexpr int kCols = V* static_cast<int>(F32<Arch>::size);
/// Words of k (4 bytes) per chunk of gemm_int8: 16 KiB of panel, half of the smallest L1d.
template <class Arch, int V>
constexpr std::int64_t kChunkWords = 16384 / (kCols<Arch, V> * 4);
/// f32: k per chunk, so that a panel's slice (16 KiB) stays in L1 while every row tile of the
/// block passes over it; the block's rows of x for the chunk (the slice, about 60-120 KiB)
/// stay in L2 while the task's panels pass, and so do the partial sums.
template <class Arch, int V = kVectors>
constexpr std::int64_t kF32ChunkK = 16384 / (kCols<Arch, V> * 4);
/// Row stride of the slice: 16 floats more than a chunk, so that the rows of a tile, read side
/// by side, fall into different L1 sets (a stride that is a multiple of 4 KiB maps every row
/// to one set of the 8-way L1).
template <class Arch>
constexpr std::int64_t kF32SliceStride = kF32ChunkK<Arch, 1> + 16;
/// bf16 x on bf16 pairs: k per chunk (the same 16 KiB of panel at 2 bytes per weight) and the
/// slice's row stride in bf16 elements (the f32 slice's bytes).
template <class Arch, int V = kVectors>
constexpr std::int64_t kBf16ChunkK = 2 * kF32ChunkK<Arch, V>;
template <class Arch>
constexpr std::int64_t kBf16SliceStride = 2 * kF32SliceStride<Arch>;
/// Rows of a block (120: B's traffic from memory is 1 / 120 of the FLOPs' operands) and panels
/// of a task (256 columns: the partial sums, 120 KiB, stay in L2).
template <class Arch>
constexpr int kF32BlockTiles = 120 / kF32Rows<Arch>;
template <class Arch>
constexpr int kF32TaskPanels = 256 / kCols<Arch>;
template <class Arch>
constexpr simd::RowBytes kRowBytes =
    simd::kHasVpdpbusd<Arch> ? simd::RowBytes::u8 : simd::RowBytes::s8;
/// What quantize_rows adds to x's int8 values (Int8Layout::activation_offset).
template <class Arch>
constexpr int kActivationOffset = kRowBytes<Arch> == simd::RowBytes::u8 ? 128 : 0;

template <class Arch, class T>
const T* row_of(const GemmProblem& p, const core::RowWalker<1>& walker) noexcept {
  return static_cast<const T*>(p.x) + walker.offset(kX);
}

/// x · smooth (where present) of elements [i, i + count) of a row. Always inlined: GCC left it
/// a call per vector in the AVX2 quantizer's two passes (half of a thin layer's time there).
template <class Arch, class T>
[[gnu::always_inline]] inline F32<Arch> smoothed(const T* row, const float* smooth, std::int64_t i,
                                                 std::int64_t count) noexcept {
  const F32<Arch> v =
      simd::load_chunk<Arch>(row, static_cast<std::size_t>(i), static_cast<std::size_t>(count));
  return smooth ? v * simd::load_chunk<Arch>(smooth, static_cast<std::size_t>(i),
                                             static_cast<std::size_t>(count))
                : v;
}

template <class Arch, class T>
void quantize_typed(const GemmProblem& p, const ActivationQuant& quant, std::int64_t begin,
                    std::int64_t end, std::uint8_t* a, float* row_scale) noexcept {
  using B = F32<Arch>;
  constexpr std::int64_t kLanes = B::size, kGroup = 4 * kLanes;
  constexpr std::int64_t kGroupBytes = kGroup * static_cast<std::int64_t>(sizeof(T));
  static_assert(64 % kGroup == 0, "k_padded (a multiple of 64) holds whole groups");
  constexpr bool kSignedBytes = kActivationOffset<Arch> == 0;
  const I32<Arch> added(kActivationOffset<Arch>);
  core::RowWalker<1> walker(p.rows, begin), ahead(p.rows, begin);
  ahead.next();
  for (std::int64_t r = begin; r < end; ++r, walker.next(), ahead.next()) {
    const T* row = row_of<Arch, T>(p, walker);
    // The next row's lines are asked for (into L2) while this one is quantized: the quantizing
    // pass computes from L1, and without them memory idled there, the max pass of the next row
    // then waiting on its misses (perf: half the time of a [4608, 3072] -> 16 dynamic layer
    // stalled on that pass's loads; with them 15 % faster, static 7 %; two or four rows ahead
    // measured no faster).
    const char* next_row =
        r + 1 < end ? reinterpret_cast<const char*>(row_of<Arch, T>(p, ahead)) : nullptr;
    std::uint8_t* dst = a + (r - begin) * p.k_padded;
    float scale = quant.scale, shift = quant.offset;
    float low = -128.f, high = 127.f;
    if (quant.dynamic) {
      B top(0.f);
      for (std::int64_t i = 0; i < p.k; i += kLanes) {
        top = xsimd::max(
            top, xsimd::abs(smoothed<Arch>(row, quant.smooth, i, std::min(kLanes, p.k - i))));
      }
      scale = simd::int8_scale(simd::reduce_max<Arch>(top));
      shift = 0.f;
      low = -127.f;
      row_scale[r - begin] = scale;
    } else {
      row_scale[r - begin] = quant.row_scale;
    }
    // x / scale + shift as the formula reads, rounded to the integers the fp32 quotient gives
    // (simd::QuotientRounder: a product by 1 / scale where that provably rounds alike), four
    // vectors at a time for one wide store.
    const simd::QuotientRounder<Arch> rounder(scale, shift, low, high);
    for (std::int64_t i = 0; i < p.k_padded; i += kGroup) {
      if (next_row != nullptr && i < p.k) {
        for (std::int64_t byte = 0; byte < kGroupBytes; byte += 64) {
          __builtin_prefetch(next_row + i * static_cast<std::int64_t>(sizeof(T)) + byte, 0, 2);
        }
      }
      F32<Arch> values[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const std::int64_t at = i + j * kLanes;
        values[j] =
            at < p.k ? smoothed<Arch>(row, quant.smooth, at, std::min(kLanes, p.k - at)) : B(0.f);
      }
      I32<Arch> q[4];
      rounder(values, q);
      simd::store_bytes_x4<Arch, kSignedBytes>(dst + i, q[0] + added, q[1] + added, q[2] + added,
                                               q[3] + added);
    }
  }
}

/// Copies x[row_begin + r, k0 : k0 + depth] to slice + r · kF32SliceStride as f32 for the block's
/// rows r < rows; rows >= m become zeros (their sums are computed and never stored). Then asks
/// for each row's next chunk, into L2: a chunk is a short run of each of 120 rows, too short
/// for the hardware prefetchers, and a thin layer (one panel) computes too little per chunk to
/// hide the misses (without this, 16 output columns ran at 0.4 of the FMA peak).
template <class Arch, int V, class T>
void pack_f32_slice(const GemmProblem& p, const std::int64_t* x_rows, std::int64_t row_begin,
                    std::int64_t rows, std::int64_t k0, std::int64_t depth, float* slice) noexcept {
  constexpr std::int64_t kLanes = F32<Arch>::size, kLine = 64 / sizeof(T);
  const std::int64_t next_depth = std::min(2 * kF32ChunkK<Arch, V>, p.k - k0 - depth);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* dst = slice + r * kF32SliceStride<Arch>;
    if (row_begin + r >= p.m) {
      for (std::int64_t i = 0; i < depth; i += kLanes) F32<Arch>(0.f).store_aligned(dst + i);
      continue;
    }
    const T* src = static_cast<const T*>(p.x) + x_rows[r] + k0;
    for (std::int64_t i = 0; i < depth; i += kLanes) {
      smoothed<Arch>(src, nullptr, i, std::min(kLanes, depth - i)).store_aligned(dst + i);
    }
    for (std::int64_t i = 0; i < next_depth; i += kLine) __builtin_prefetch(src + depth + i, 0, 2);
  }
}

/// The bf16 slice of pack_f32_slice for bf16 x on bf16 pairs: x[row_begin + r, k0 : k0 + depth]
/// copied as bf16 to slice + r · kBf16SliceStride, a zero after an odd depth (the last pair's
/// second k, whose weights are zero padding too); rows >= m become zeros.
template <class Arch, int V>
void pack_bf16_slice(const GemmProblem& p, const std::int64_t* x_rows, std::int64_t row_begin,
                     std::int64_t rows, std::int64_t k0, std::int64_t depth,
                     std::uint16_t* slice) noexcept {
  constexpr std::int64_t kLine = 64 / sizeof(bf16);
  const std::int64_t next_depth = std::min(2 * kBf16ChunkK<Arch, V>, p.k - k0 - depth);
  const std::int64_t even_depth = (depth + 1) / 2 * 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::uint16_t* dst = slice + r * kBf16SliceStride<Arch>;
    if (row_begin + r >= p.m) {
      std::memset(dst, 0, static_cast<std::size_t>(even_depth) * sizeof(bf16));
      continue;
    }
    const bf16* src = static_cast<const bf16*>(p.x) + x_rows[r] + k0;
    std::memcpy(dst, src, static_cast<std::size_t>(depth) * sizeof(bf16));
    if (depth != even_depth) dst[depth] = 0;
    for (std::int64_t i = 0; i < next_depth; i += kLine) __builtin_prefetch(src + depth + i, 0, 2);
  }
}

/// What a call of gemm_f32 multiplies: f32 panels by x as f32 (bf16 x widened into the slice);
/// bf16 pairs by x as f32 (the pairs widened as they are loaded); bf16 pairs by bf16 x
/// (vdpbf16ps).
enum class F32Mode { f32, widened_pairs, bf16_dot };

}  // namespace

template <class Arch>
Int8Layout int8_layout(std::int64_t n) noexcept {
  Int8Layout layout;
  // A layer of at most one vector of columns (DiT output projections: 16 features) takes tiles
  // one vector wide: two would multiply padding for half their work.
  layout.tile = {kInt8Rows<Arch>, n <= kCols<Arch, 1> ? kCols<Arch, 1> : kCols<Arch>};
  layout.activation_offset = kActivationOffset<Arch>;
  layout.exact_for_minus_128 = !simd::kHasMaddubs<Arch>;
  return layout;
}

template <class Arch>
TileShape f32_tile(std::int64_t n) noexcept {
  return {kF32Rows<Arch>, n <= kCols<Arch, 1> ? kCols<Arch, 1> : kCols<Arch>};
}

template <class Arch>
void quantize_rows(const GemmProblem& problem, const ActivationQuant& quant, std::int64_t begin,
                   std::int64_t end, std::uint8_t* a, float* row_scale) noexcept {
  if (problem.x_dtype == DType::f32) {
    quantize_typed<Arch, float>(problem, quant, begin, end, a, row_scale);
  } else {
    quantize_typed<Arch, bf16>(problem, quant, begin, end, a, row_scale);
  }
}

/// gemm_int8 with tiles of V vectors of columns.
template <class Arch, int V>
void gemm_int8_tiles(const GemmProblem& p, const std::uint8_t* a, const float* row_scale,
                     std::int64_t row_begin, std::int64_t row_end, std::int64_t panel_begin,
                     std::int64_t panel_end) noexcept {
  constexpr int R = kInt8Rows<Arch>, kLanes = F32<Arch>::size, kColumns = kCols<Arch, V>;
  constexpr std::int64_t kChunk = kChunkWords<Arch, V>;
  using Reg = typename I32<Arch>::register_type;
  const std::int64_t words = p.k_padded / 4;
  alignas(64) std::int32_t partial[kMaxBlockTiles * R * kColumns];
  std::int64_t y_rows[kMaxBlockTiles * R];
  y_row_offsets(p, row_begin, row_end, y_rows);
  for (std::int64_t panel = panel_begin; panel < panel_end; ++panel) {
    const auto* weights = static_cast<const std::int8_t*>(p.panels) + panel * p.panel_bytes;
    const std::int64_t n0 = panel * kColumns;
    const Int8Epilogue<Arch, V> epilogue(p, n0);
    // k in chunks whose slice of the panel (16 KiB) stays in L1 while every row tile of the
    // block passes over it; a whole-k panel (48 KiB at k = 3072 on AVX2) would be re-read from
    // L2 by each tile. Sums of the earlier chunks wait in `partial` (L1 too).
    for (std::int64_t first_word = 0; first_word < words; first_word += kChunk) {
      const std::int64_t chunk_words = std::min(kChunk, words - first_word);
      const bool first_chunk = first_word == 0;
      const bool last_chunk = first_word + chunk_words == words;
      for (std::int64_t row0 = row_begin; row0 < row_end; row0 += R) {
        Reg acc[R][V];
        simd::dot_tile<Arch, R, V, kRowBytes<Arch>>(
            a + (row0 - row_begin) * p.k_padded + first_word * 4, p.k_padded, 4,
            weights + first_word * kColumns * 4, kColumns * 4, chunk_words, acc);
        std::int32_t* tile_partial = partial + (row0 - row_begin) * kColumns;
        if (!first_chunk) {
          for (int r = 0; r < R; ++r) {
            for (int c = 0; c < V; ++c) {
              acc[r][c] = I32<Arch>(acc[r][c]) +
                          I32<Arch>::load_aligned(tile_partial + r * kColumns + c * kLanes);
            }
          }
        }
        if (!last_chunk) {
          for (int r = 0; r < R; ++r) {
            for (int c = 0; c < V; ++c) {
              I32<Arch>(acc[r][c]).store_aligned(tile_partial + r * kColumns + c * kLanes);
            }
          }
          continue;
        }
        store_tile<Arch, V>(p, y_rows + (row0 - row_begin), row0, R, n0, [&](int r, int c) {
          return epilogue(I32<Arch>(acc[r][c]), c, row_scale[row0 - row_begin + r]);
        });
      }
    }
  }
}

template <class Arch>
void gemm_int8(const GemmProblem& p, const std::uint8_t* a, const float* row_scale,
               std::int64_t row_begin, std::int64_t row_end, std::int64_t panel_begin,
               std::int64_t panel_end) noexcept {
  if (p.columns == kCols<Arch, 1>) {
    gemm_int8_tiles<Arch, 1>(p, a, row_scale, row_begin, row_end, panel_begin, panel_end);
  } else {
    gemm_int8_tiles<Arch, kVectors>(p, a, row_scale, row_begin, row_end, panel_begin, panel_end);
  }
}

template <class Arch>
F32Blocking f32_blocking() noexcept {
  constexpr int kBlockRows = kF32BlockTiles<Arch> * kF32Rows<Arch>;
  return {kBlockRows, kF32TaskPanels<Arch>,
          kBlockRows * (kF32SliceStride<Arch> + kF32TaskPanels<Arch> * kCols<Arch>)};
}

/// acc += the tile's rows of x (`rows`: the slice's first row of the tile, kStride apart; f32,
/// or bf16 for bf16_dot) times `depth` k of the panel's weights from `weights`, multiplying as
/// `M` says, while asking for the weights `depth` k further on.
template <class Arch, int V, F32Mode M, class Weight>
inline void multiply_chunk(const Weight* weights, const void* rows, std::int64_t depth,
                           typename F32<Arch>::register_type (&acc)[kF32Rows<Arch>][V]) noexcept {
  constexpr int R = kF32Rows<Arch>, kLanes = F32<Arch>::size, kColumns = kCols<Arch, V>;
  constexpr int kWeightLines = kColumns * 4 > 64 ? kColumns * 4 / 64 : 1;  // per k or pair
  constexpr std::int64_t kStride =
      M == F32Mode::bf16_dot ? kBf16SliceStride<Arch> : kF32SliceStride<Arch>;
  using Reg = typename F32<Arch>::register_type;
  if constexpr (M == F32Mode::f32) {
    const auto* tile_rows = static_cast<const float*>(rows);
    for (std::int64_t k = 0; k < depth; ++k) {
      Reg column[V];
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) {
        column[c] = F32<Arch>::load_aligned(weights + k * kColumns + c * kLanes);
      }
      // The weights the panel's next chunk (or the next panel) starts with, as many
      // lines per k as this one reads: with few rows the call streams the weights, in
      // runs of 16 KiB, too short for the prefetchers (AVX2, 16 rows: 1.7x).
#pragma GCC unroll 2
      for (int line = 0; line < kWeightLines; ++line) {
        __builtin_prefetch(weights + (depth + k) * kColumns + line * 16, 0, 2);
      }
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        const F32<Arch> x(tile_rows[r * kStride + k]);
#pragma GCC unroll 4
        for (int c = 0; c < V; ++c) {
          acc[r][c] = simd::fmadd<Arch>(x, F32<Arch>(column[c]), F32<Arch>(acc[r][c]));
        }
      }
    }
  } else if constexpr (M == F32Mode::widened_pairs) {
    // k and k + 1 of each row in turn, in order (the sums of f32 panels, bit for bit);
    // after an odd depth the slice's next float and the padding's weights are zeros.
    const auto* tile_rows = static_cast<const float*>(rows);
    const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (std::int64_t k = 0; k < depth; k += 2) {
      Reg even[V], odd[V];
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) {
        const __m512i both = _mm512_load_si512(weights + k * kColumns + c * 2 * kLanes);
        even[c] = _mm512_castsi512_ps(_mm512_slli_epi32(both, 16));
        odd[c] = _mm512_castsi512_ps(_mm512_and_si512(both, high_half));
      }
#pragma GCC unroll 2
      for (int line = 0; line < kWeightLines; ++line) {
        __builtin_prefetch(weights + (depth + k) * kColumns + line * 32, 0, 2);
      }
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        const F32<Arch> x0(tile_rows[r * kStride + k]), x1(tile_rows[r * kStride + k + 1]);
#pragma GCC unroll 4
        for (int c = 0; c < V; ++c) {
          acc[r][c] = simd::fmadd<Arch>(x0, F32<Arch>(even[c]), F32<Arch>(acc[r][c]));
          acc[r][c] = simd::fmadd<Arch>(x1, F32<Arch>(odd[c]), F32<Arch>(acc[r][c]));
        }
      }
    }
  } else {
    const auto* tile_rows = static_cast<const std::uint16_t*>(rows);
    for (std::int64_t k = 0; k < depth; k += 2) {
      __m512i column[V];
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) {
        column[c] = _mm512_load_si512(weights + k * kColumns + c * 2 * kLanes);
      }
#pragma GCC unroll 2
      for (int line = 0; line < kWeightLines; ++line) {
        __builtin_prefetch(weights + (depth + k) * kColumns + line * 32, 0, 2);
      }
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        std::uint32_t pair;
        std::memcpy(&pair, tile_rows + r * kStride + k, sizeof pair);
        const __m512i x = _mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 4
        for (int c = 0; c < V; ++c) acc[r][c] = simd::dot_bf16<Arch>(acc[r][c], x, column[c]);
      }
    }
  }
}

/// gemm_f32 with tiles of V vectors of columns, multiplying as `M` says.
template <class Arch, int V, F32Mode M>
void gemm_f32_tiles(const GemmProblem& p, std::int64_t row_begin, std::int64_t row_end,
                    std::int64_t panel_begin, std::int64_t panel_end, float* scratch) noexcept {
  constexpr int R = kF32Rows<Arch>, kLanes = F32<Arch>::size, kColumns = kCols<Arch, V>;
  constexpr bool kPairs = M != F32Mode::f32, kDot = M == F32Mode::bf16_dot;
  // The weights are f32, or bf16 pairs: 4 or 2 bytes per weight, and per k (a pair's k are
  // at the same element offset k · kColumns as a k of f32 panels).
  using Weight = std::conditional_t<kPairs, std::uint16_t, float>;
  constexpr std::int64_t kStride = kDot ? kBf16SliceStride<Arch> : kF32SliceStride<Arch>;
  constexpr std::int64_t kChunk = kDot ? kBf16ChunkK<Arch, V> : kF32ChunkK<Arch, V>;
  using Reg = typename F32<Arch>::register_type;
  const std::int64_t rows = row_end - row_begin;
  // rows x kStride: x[rows, k0 : k0 + depth] as f32, or as bf16 (kDot), in the same bytes
  float* const slice = scratch;
  auto* const bf16_slice = reinterpret_cast<std::uint16_t*>(scratch);
  float* const partial = scratch + kF32BlockTiles<Arch> * R * kF32SliceStride<Arch>;
  std::int64_t x_rows[kMaxBlockTiles * R], y_rows[kMaxBlockTiles * R];
  y_row_offsets(p, row_begin, row_end, y_rows);
  {
    core::RowWalker<1> walker(p.rows, row_begin);
    for (std::int64_t r = row_begin; r < std::min(row_end, p.m); ++r, walker.next()) {
      x_rows[r - row_begin] = walker.offset(kX);
    }
  }
  const std::int64_t panel_weights = p.panel_bytes / static_cast<std::int64_t>(sizeof(Weight));
  for (std::int64_t k0 = 0; k0 < p.k; k0 += kChunk) {
    const std::int64_t depth = std::min(kChunk, p.k - k0);
    const bool first_chunk = k0 == 0, last_chunk = k0 + depth == p.k;
    if constexpr (kDot) {
      pack_bf16_slice<Arch, V>(p, x_rows, row_begin, rows, k0, depth, bf16_slice);
    } else if (p.x_dtype == DType::f32) {
      pack_f32_slice<Arch, V, float>(p, x_rows, row_begin, rows, k0, depth, slice);
    } else {
      pack_f32_slice<Arch, V, bf16>(p, x_rows, row_begin, rows, k0, depth, slice);
    }
    for (std::int64_t panel = panel_begin; panel < panel_end; ++panel) {
      const Weight* weights =
          static_cast<const Weight*>(p.panels) + panel * panel_weights + k0 * kColumns;
      const std::int64_t n0 = panel * kColumns;
      float* panel_partial = partial + (panel - panel_begin) * rows * kColumns;
      const F32Epilogue<Arch, V> epilogue(p, n0);
      for (std::int64_t row0 = row_begin; row0 < row_end; row0 += R) {
        // The sums of the earlier chunks continue in the same order: every element is summed
        // over k in sequence whatever the blocking, so the result is the same at any thread
        // count. Plain register arrays: GCC keeps arrays of xsimd batches in memory.
        float* tile_partial = panel_partial + (row0 - row_begin) * kColumns;
        Reg acc[R][V];
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
          for (int c = 0; c < V; ++c) {
            acc[r][c] = first_chunk
                            ? F32<Arch>(0.f)
                            : F32<Arch>::load_aligned(tile_partial + r * kColumns + c * kLanes);
          }
        }
        const void* tile_rows =
            kDot ? static_cast<const void*>(bf16_slice + (row0 - row_begin) * kStride)
                 : static_cast<const void*>(slice + (row0 - row_begin) * kStride);
        multiply_chunk<Arch, V, M>(weights, tile_rows, depth, acc);
        if (!last_chunk) {
#pragma GCC unroll 12
          for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
            for (int c = 0; c < V; ++c) {
              F32<Arch>(acc[r][c]).store_aligned(tile_partial + r * kColumns + c * kLanes);
            }
          }
          continue;
        }
        store_tile<Arch, V>(p, y_rows + (row0 - row_begin), row0, R, n0,
                            [&](int r, int c) { return epilogue(F32<Arch>(acc[r][c]), c); });
      }
    }
  }
}

/// gemm_f32 with tiles of V vectors of columns, in the mode the panels and x ask for.
template <class Arch, int V>
void gemm_f32_mode(const GemmProblem& p, std::int64_t row_begin, std::int64_t row_end,
                   std::int64_t panel_begin, std::int64_t panel_end, float* scratch) noexcept {
  if constexpr (simd::kHasBf16Vnni<Arch>) {
    if (p.weight_dtype == DType::bf16) {
      if (p.x_dtype == DType::bf16) {
        gemm_f32_tiles<Arch, V, F32Mode::bf16_dot>(p, row_begin, row_end, panel_begin, panel_end,
                                                   scratch);
      } else {
        gemm_f32_tiles<Arch, V, F32Mode::widened_pairs>(p, row_begin, row_end, panel_begin,
                                                        panel_end, scratch);
      }
      return;
    }
  }
  gemm_f32_tiles<Arch, V, F32Mode::f32>(p, row_begin, row_end, panel_begin, panel_end, scratch);
}

template <class Arch>
void gemm_f32(const GemmProblem& p, std::int64_t row_begin, std::int64_t row_end,
              std::int64_t panel_begin, std::int64_t panel_end, float* scratch) noexcept {
  if (p.columns == kCols<Arch, 1>) {
    gemm_f32_mode<Arch, 1>(p, row_begin, row_end, panel_begin, panel_end, scratch);
  } else {
    gemm_f32_mode<Arch, kVectors>(p, row_begin, row_end, panel_begin, panel_end, scratch);
  }
}

template Int8Layout int8_layout<KernelArch>(std::int64_t) noexcept;
template TileShape f32_tile<KernelArch>(std::int64_t) noexcept;
template void quantize_rows<KernelArch>(const GemmProblem&, const ActivationQuant&, std::int64_t,
                                        std::int64_t, std::uint8_t*, float*) noexcept;
template F32Blocking f32_blocking<KernelArch>() noexcept;
template void gemm_int8<KernelArch>(const GemmProblem&, const std::uint8_t*, const float*,
                                    std::int64_t, std::int64_t, std::int64_t,
                                    std::int64_t) noexcept;
template void gemm_f32<KernelArch>(const GemmProblem&, std::int64_t, std::int64_t, std::int64_t,
                                   std::int64_t, float*) noexcept;

}  // namespace ditops::linear
