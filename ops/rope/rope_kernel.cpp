// RoPE row kernel, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// f32 is memory-bound: x is streamed once; the cos/sin row of a position is reused by the N
// heads that follow it in memory (BSND) or stays in L2 across heads (BNSD, an [S, D] table of a
// few MB). 16-bit x is compute-bound on AVX2 (AMD EPYC Zen 3, [128, 24, 128] in cache, 1
// thread: f16 0.52 ns/element, bf16 0.90, f32 0.33, with the tables converted for every row):
// of the 12 conversions per 32 f16 elements of rotate-half, 8 converted the cos/sin rows. Where
// runs of rows read one table row (BSND's heads of a position), a 16-bit table row is widened
// to fp32 once into an L1 buffer (WidenedTables), its sin signed as the rotation wants it:
// f16 then runs 0.32 ns/element (half) and 0.39 (interleaved), bf16 0.58 and 0.71 in cache, and
// f16 [1, 4096, 24, 128] out of cache 1.3-1.5x faster. Rows go one after the other, in memory
// order: rotating four heads that share a table row side by side (one table load for four
// rows) measured 10-40% slower for f32, as the hardware prefetcher then follows four
// interleaved streams; so did walking BNSD in blocks of positions with the heads inside each
// block (22 vs 29 GB/s, f32, 2 threads), and so did prefetching x four rows ahead (f32 and
// bf16, 1 thread, AVX-512). The per-row work (row walker, stager, piece setup) is not what
// limits D = 128: rows of D = 1024 ran at the same ns/element. Results are stored two vectors
// at a time (bf16 packs a pair into one store, which AVX2 can stream; packing f16 likewise
// measured no faster). Streamed f32 outputs whose rows are whole pairs of vectors go through
// simd::ShiftedStreamWriter, in memory order, wherever out starts (rope.cpp decides; 16-bit
// rows, compute-bound, lose more to its joins than streaming saves); other streamed rows that
// share cache lines go through simd::LineStager. Each row reads every input piece before
// writing the output piece, so out may be x (but for the in-order rotate-half, which is then
// not used).

#include "ops/rope/rope_kernel.hpp"

#include <type_traits>

#include "ops/core/arch.hpp"
#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/streaming.hpp"
#include "ops/rope/rotation.hpp"

namespace ditops::rope {
namespace {

template <class Arch>
using B = simd::F32<Arch>;

/// Rotate-half of one row in memory order, two vectors at a time, to a ShiftedStreamWriter:
/// the first half, then the second, each reading x's other half again (from L1). Not for rows
/// rotated in place: the second half reads the first half of x after it was written.
template <class Arch, class T, class C>
void rotate_half_in_order(const T* x, const C* cos, const C* sin, std::size_t dim,
                          simd::ShiftedStreamWriter<Arch>& writer) {
  constexpr std::size_t kLanes = B<Arch>::size;
  const std::size_t half = dim / 2;
  const auto first = [&](std::size_t at) {
    return first_half<Arch>(simd::load<Arch>(x + at), simd::load<Arch>(x + half + at),
                            simd::load<Arch>(cos + at), simd::load<Arch>(sin + at));
  };
  const auto second = [&](std::size_t at) {
    return second_half<Arch>(simd::load<Arch>(x + at), simd::load<Arch>(x + half + at),
                             simd::load<Arch>(cos + half + at), simd::load<Arch>(sin + half + at));
  };
  for (std::size_t i = 0; i < half; i += 2 * kLanes) {
    writer.template push_pair<T>(first(i), first(i + kLanes));
  }
  for (std::size_t i = 0; i < half; i += 2 * kLanes) {
    writer.template push_pair<T>(second(i), second(i + kLanes));
  }
}

/// Interleaved rotation of one row, two vectors at a time, to a ShiftedStreamWriter (each
/// piece reads its x before it is written: rows may be rotated in place).
template <class Arch, class T, class C>
void rotate_interleaved_in_order(const T* x, const C* cos, const C* sin, std::size_t dim,
                                 const InterleavedRotation<Arch>& rotated,
                                 simd::ShiftedStreamWriter<Arch>& writer) {
  constexpr std::size_t kLanes = B<Arch>::size;
  for (std::size_t i = 0; i < dim; i += 2 * kLanes) {
    writer.template push_pair<T>(
        rotated(simd::load<Arch>(x + i), simd::load<Arch>(cos + i), simd::load<Arch>(sin + i)),
        rotated(simd::load<Arch>(x + i + kLanes), simd::load<Arch>(cos + i + kLanes),
                simd::load<Arch>(sin + i + kLanes)));
  }
}

/// Whether streamed rows can go through a ShiftedStreamWriter: every row is whole pairs of
/// vectors (both halves, for rotate-half), starts on 4 bytes, and, for rotate-half, is not
/// rotated in place.
template <class Arch, class T>
bool rows_stream_shifted(const RopeProblem& p) {
  if constexpr (!simd::kHasShiftedStreams<Arch>) {
    return false;
  } else {
    const auto pair = static_cast<std::int64_t>(2 * B<Arch>::size);
    const bool half = p.mode == RotatedMode::rotated_half;
    if (p.dim % (half ? 2 * pair : pair) != 0 || (half && p.x == p.out)) return false;
    if (!simd::ShiftedStreamWriter<Arch>::starts(p.out)) return false;
    for (int d = 0; d < p.rows.dims; ++d) {
      if (p.rows.strides[kOut][d] * static_cast<std::int64_t>(sizeof(T)) % 4 != 0) return false;
    }
    return true;
  }
}

/// Streamed rows through a ShiftedStreamWriter (rows_stream_shifted).
template <class Arch, class T, class C, class Tables>
void rope_rows_shifted(const RopeProblem& p, std::int64_t begin, std::int64_t end, Tables& tables) {
  if constexpr (simd::kHasShiftedStreams<Arch>) {
    const auto dim = static_cast<std::size_t>(p.dim);
    core::RowWalker<4> walker(p.rows, begin);
    simd::ShiftedStreamWriter<Arch> writer;
    const InterleavedRotation<Arch> interleaved;
    for (std::int64_t row = begin; row < end; ++row, walker.next()) {
      const T* x = static_cast<const T*>(p.x) + walker.offset(kX);
      tables.fetch(static_cast<const C*>(p.cos) + walker.offset(kCos),
                   static_cast<const C*>(p.sin) + walker.offset(kSin), dim);
      writer.begin_row(static_cast<T*>(p.out) + walker.offset(kOut));
      if (p.mode == RotatedMode::rotated_half) {
        rotate_half_in_order<Arch, T>(x, tables.cos(), tables.sin(), dim, writer);
      } else {
        rotate_interleaved_in_order<Arch, T>(x, tables.cos(), tables.sin(), dim, interleaved,
                                             writer);
      }
    }
    writer.finish();
    simd::stream_fence<Arch>();
  }
}

template <class Arch, class T, class C, class Tables>
void rope_rows_with(const RopeProblem& p, std::int64_t begin, std::int64_t end, Tables& tables) {
  if constexpr (!Tables::kNegatedSin) {
    if (p.stream_joined && rows_stream_shifted<Arch, T>(p))
      return rope_rows_shifted<Arch, T, C>(p, begin, end, tables);
  }
  const auto dim = static_cast<std::size_t>(p.dim);
  core::RowWalker<4> walker(p.rows, begin);
  // Rows that share cache lines are computed into the stager's buffer and streamed from there.
  simd::LineStager<Arch, T> stager(dim, p.stream);
  for (std::int64_t row = begin; row < end; ++row, walker.next()) {
    const T* x = static_cast<const T*>(p.x) + walker.offset(kX);
    T* out = stager.begin_row(static_cast<T*>(p.out) + walker.offset(kOut));
    tables.fetch(static_cast<const C*>(p.cos) + walker.offset(kCos),
                 static_cast<const C*>(p.sin) + walker.offset(kSin), dim);
    if (p.mode == RotatedMode::rotated_half) {
      rotate_half<Arch, Tables::kNegatedSin>(RowLoads<Arch, T>{x}, tables.cos(), tables.sin(), out,
                                             dim, stager.streams_in_place());
    } else {
      rotate_interleaved<Arch, Tables::kNegatedSin>(
          RowLoads<Arch, T>{x}, tables.cos(), tables.sin(), out, dim, stager.streams_in_place());
    }
    stager.end_row();
  }
  stager.finish();
  if (p.stream) simd::stream_fence<Arch>();
}

/// Whether consecutive rows share their cos/sin row (both tables broadcast along x's innermost
/// row dim, which has more than one row), so that widening a 16-bit table row serves several.
inline bool rows_share_tables(const RopeProblem& p) {
  const int inner = p.rows.dims - 1;
  return inner >= 0 && p.rows.shape[inner] > 1 && p.rows.strides[kCos][inner] == 0 &&
         p.rows.strides[kSin][inner] == 0;
}

template <class Arch, class T, class C>
void rope_rows_typed(const RopeProblem& p, std::int64_t begin, std::int64_t end) {
  if constexpr (!std::is_same_v<C, float>) {
    if (static_cast<std::size_t>(p.dim) <= kMaxWidenedDim && rows_share_tables(p)) {
      WidenedTables<Arch, C> tables(p.mode);
      return rope_rows_with<Arch, T, C>(p, begin, end, tables);
    }
  }
  DirectTables<C> tables;
  rope_rows_with<Arch, T, C>(p, begin, end, tables);
}

template <class Arch, class T>
void rope_rows_for(const RopeProblem& p, std::int64_t begin, std::int64_t end) {
  if (p.table_dtype == DType::f32) {
    rope_rows_typed<Arch, T, float>(p, begin, end);
  } else {
    rope_rows_typed<Arch, T, T>(p, begin, end);
  }
}

}  // namespace

template <class Arch>
void rope_rows(const RopeProblem& problem, std::int64_t begin, std::int64_t end) noexcept {
  switch (problem.dtype) {
    case DType::bf16:
      return rope_rows_for<Arch, bf16>(problem, begin, end);
    case DType::f16:
      return rope_rows_for<Arch, f16>(problem, begin, end);
    default:
      return rope_rows_typed<Arch, float, float>(problem, begin, end);
  }
}

template void rope_rows<KernelArch>(const RopeProblem&, std::int64_t, std::int64_t) noexcept;

}  // namespace ditops::rope
