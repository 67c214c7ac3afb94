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
#include "ops/core/simd.hpp"
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

/// The cos/sin rows of the current row as the kernel reads them: the tables themselves.
template <class C>
class DirectTables {
 public:
  using Element = C;
  static constexpr bool kNegatedSin = false;
  void fetch(const C* cos, const C* sin, std::size_t) noexcept {
    cos_ = cos;
    sin_ = sin;
  }
  const C* cos() const noexcept { return cos_; }
  const C* sin() const noexcept { return sin_; }

 private:
  const C* cos_ = nullptr;
  const C* sin_ = nullptr;
};

/// Rows of at most this many elements have their 16-bit cos/sin rows widened (WidenedTables).
constexpr std::size_t kMaxWidenedDim = 1024;

/// 16-bit cos/sin rows widened to fp32 in an L1 buffer, once for each run of rows that reads
/// the same table row (BSND's N heads of a position): the rotation then loads floats, not
/// converting the table for every head (8 of the 12 conversions per 32 f16 elements of
/// rotate-half). fetch() widens again whenever the table row differs from the one held. The
/// sin row is stored with the sign the rotation would give it (kNegatedSin): negated in its
/// first half for rotate-half, on even lanes for the interleaved mode; that saves a negation per
/// vector of every row that reads it.
template <class Arch, class C>
class WidenedTables {
 public:
  using Element = float;
  static constexpr bool kNegatedSin = true;
  explicit WidenedTables(RotatedMode mode) noexcept : mode_(mode) {}
  void fetch(const C* cos, const C* sin, std::size_t dim) noexcept {
    if (cos == cos_src_ && sin == sin_src_) return;
    cos_src_ = cos;
    sin_src_ = sin;
    const B<Arch> none(0.f), all(-0.f);
    widen(cos, cos_, 0, dim, none);
    if (mode_ == RotatedMode::rotated_half) {
      widen(sin, sin_, 0, dim / 2, all);
      widen(sin, sin_, dim / 2, dim, none);
    } else {
      widen(sin, sin_, 0, dim, even_signs());
    }
  }
  const float* cos() const noexcept { return cos_; }
  const float* sin() const noexcept { return sin_; }

 private:
  /// dst[i] = src[i] ^ sign for i in [from, to), whole vectors from `from` (the buffers have
  /// room for a partial one at the end, which a later call may overwrite).
  static void widen(const C* src, float* dst, std::size_t from, std::size_t to,
                    B<Arch> sign) noexcept {
    constexpr std::size_t kLanes = B<Arch>::size;
    std::size_t i = from;
    for (; i + kLanes <= to; i += kLanes)
      (simd::load<Arch>(src + i) ^ sign).store_unaligned(dst + i);
    if (i < to) (simd::load_chunk<Arch>(src, i, to - i) ^ sign).store_unaligned(dst + i);
  }

  /// -0.0 on even lanes: the sign InterleavedRotation gives sin there.
  static B<Arch> even_signs() noexcept {
    alignas(64) float lanes[B<Arch>::size];
    for (std::size_t lane = 0; lane < B<Arch>::size; ++lane) lanes[lane] = lane % 2 ? 0.f : -0.f;
    return B<Arch>::load_aligned(lanes);
  }

  RotatedMode mode_;
  const C* cos_src_ = nullptr;
  const C* sin_src_ = nullptr;
  // A partial vector at the end of a half may spill kLanes - 1 floats past it.
  alignas(simd::kCacheLineBytes) float cos_[kMaxWidenedDim + 16];
  alignas(simd::kCacheLineBytes) float sin_[kMaxWidenedDim + 16];
};

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
