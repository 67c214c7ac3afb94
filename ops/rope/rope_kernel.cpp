// RoPE row kernel, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// Memory-bound: x is streamed once; the cos/sin row of a position is reused by the N heads that
// follow it in memory (BSND) or stays in L2 across heads (BNSD, an [S, D] table of a few MB).
// Rows go one after the other, in memory order: rotating four heads that share a table row side
// by side (one table load for four rows) measured 10-40% slower for f32, as the hardware
// prefetcher then follows four interleaved streams; so did walking BNSD in blocks of positions
// with the heads inside each block (22 vs 29 GB/s, f32, 2 threads). Results are stored two vectors
// at a time (bf16 packs a pair into one store, which AVX2 can stream). Each row reads every input
// piece before writing the output piece, so out may be x.

#include "ops/rope/rope_kernel.hpp"

#include <type_traits>

#include "ops/core/arch.hpp"
#include "ops/core/simd.hpp"

namespace ditops::rope {
namespace {

template <class Arch>
using B = simd::F32<Arch>;

/// Lane permutation [1, 0, 3, 2, ...]: the partner of each element of an interleaved pair.
struct PairSwap {
  static constexpr unsigned get(unsigned index, unsigned) { return index ^ 1u; }
};

/// out[i] = x[i]*cos[i] - x[i+h]*sin[i];  out[i+h] = x[i+h]*cos[i+h] + x[i]*sin[i+h].
template <class Arch, class T, class C>
void rotate_half(const T* x, const C* cos, const C* sin, T* out, std::size_t dim, bool stream) {
  constexpr std::size_t kLanes = B<Arch>::size;
  const std::size_t half = dim / 2;
  // Pieces follow the cache lines of the first half; the second half streams along only when
  // it starts at the same offset within a line.
  const bool same_line_phase = half * sizeof(T) % simd::kCacheLineBytes == 0;
  simd::for_each_piece<Arch>(
      out, half, stream,
      [&](std::size_t i, auto whole) {
        const B<Arch> x1a = simd::load<Arch>(x + i), x1b = simd::load<Arch>(x + i + kLanes);
        const B<Arch> x2a = simd::load<Arch>(x + half + i);
        const B<Arch> x2b = simd::load<Arch>(x + half + i + kLanes);
        const B<Arch> c1a = simd::load<Arch>(cos + i), c1b = simd::load<Arch>(cos + i + kLanes);
        const B<Arch> c2a = simd::load<Arch>(cos + half + i);
        const B<Arch> c2b = simd::load<Arch>(cos + half + i + kLanes);
        const B<Arch> s1a = simd::load<Arch>(sin + i), s1b = simd::load<Arch>(sin + i + kLanes);
        const B<Arch> s2a = simd::load<Arch>(sin + half + i);
        const B<Arch> s2b = simd::load<Arch>(sin + half + i + kLanes);
        simd::store_pair<Arch>(out + i, simd::fmadd<Arch>(x1a, c1a, -(x2a * s1a)),
                               simd::fmadd<Arch>(x1b, c1b, -(x2b * s1b)), whole);
        simd::store_pair<Arch>(out + half + i, simd::fmadd<Arch>(x2a, c2a, x1a * s2a),
                               simd::fmadd<Arch>(x2b, c2b, x1b * s2b), whole && same_line_phase);
      },
      [&](std::size_t i, std::size_t n, auto whole) {
        const B<Arch> x1 = simd::load_chunk<Arch>(x, i, n);
        const B<Arch> x2 = simd::load_chunk<Arch>(x + half, i, n);
        const B<Arch> c1 = simd::load_chunk<Arch>(cos, i, n);
        const B<Arch> c2 = simd::load_chunk<Arch>(cos + half, i, n);
        const B<Arch> s1 = simd::load_chunk<Arch>(sin, i, n);
        const B<Arch> s2 = simd::load_chunk<Arch>(sin + half, i, n);
        simd::store_chunk<Arch>(out, i, n, simd::fmadd<Arch>(x1, c1, -(x2 * s1)), whole);
        simd::store_chunk<Arch>(out + half, i, n, simd::fmadd<Arch>(x2, c2, x1 * s2),
                                whole && same_line_phase);
      });
}

/// out[2j] = x[2j]*cos[2j] - x[2j+1]*sin[2j];  out[2j+1] = x[2j+1]*cos[2j+1] + x[2j]*sin[2j+1].
template <class Arch, class T, class C>
void rotate_interleaved(const T* x, const C* cos, const C* sin, T* out, std::size_t dim,
                        bool stream) {
  constexpr std::size_t kLanes = B<Arch>::size;
  constexpr auto kSwap = xsimd::make_batch_constant<xsimd::batch<std::uint32_t, Arch>, PairSwap>();
  // -0.0 on even lanes flips the sign of sin there: rot(x) = [-x1, x0, -x3, x2, ...].
  alignas(64) float sign_lanes[kLanes];
  for (std::size_t lane = 0; lane < kLanes; ++lane) sign_lanes[lane] = lane % 2 ? 0.f : -0.f;
  const B<Arch> sign = B<Arch>::load_aligned(sign_lanes);
  const auto rotated = [&](B<Arch> v, B<Arch> c, B<Arch> s) {
    return simd::fmadd<Arch>(v, c, xsimd::swizzle(v, kSwap) * (s ^ sign));
  };
  // Pairs must not straddle pieces, so the first (line-alignment) piece must be even-sized; when
  // out sits an odd number of elements off a line boundary, do not stream.
  const bool align = stream && simd::elements_to_line(out) % 2 == 0;
  simd::for_each_piece<Arch>(
      out, dim, align,
      [&](std::size_t i, auto whole) {
        simd::store_pair<Arch>(
            out + i,
            rotated(simd::load<Arch>(x + i), simd::load<Arch>(cos + i), simd::load<Arch>(sin + i)),
            rotated(simd::load<Arch>(x + i + kLanes), simd::load<Arch>(cos + i + kLanes),
                    simd::load<Arch>(sin + i + kLanes)),
            whole);
      },
      [&](std::size_t i, std::size_t n, auto whole) {
        simd::store_chunk<Arch>(
            out, i, n,
            rotated(simd::load_chunk<Arch>(x, i, n), simd::load_chunk<Arch>(cos, i, n),
                    simd::load_chunk<Arch>(sin, i, n)),
            whole);
      });
}

template <class Arch, class T, class C>
void rope_rows_typed(const RopeProblem& p, std::int64_t begin, std::int64_t end) {
  const auto dim = static_cast<std::size_t>(p.dim);
  core::RowWalker<4> walker(p.rows, begin);
  // Rows that share cache lines are computed into the stager's buffer and streamed from there.
  simd::LineStager<Arch, T> stager(dim, p.stream);
  for (std::int64_t row = begin; row < end; ++row, walker.next()) {
    const T* x = static_cast<const T*>(p.x) + walker.offset(kX);
    T* out = stager.begin_row(static_cast<T*>(p.out) + walker.offset(kOut));
    const C* cos = static_cast<const C*>(p.cos) + walker.offset(kCos);
    const C* sin = static_cast<const C*>(p.sin) + walker.offset(kSin);
    if (p.mode == RotatedMode::rotated_half) {
      rotate_half<Arch>(x, cos, sin, out, dim, stager.streams_in_place());
    } else {
      rotate_interleaved<Arch>(x, cos, sin, out, dim, stager.streams_in_place());
    }
    stager.end_row();
  }
  stager.finish();
  if (p.stream) simd::stream_fence<Arch>();
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
