// RoPE row kernel, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// Memory-bound: x is streamed once; the cos/sin row of a position is reused by the N heads that
// follow it in memory (BSND) or stays in L2 across heads (BNSD, an [S, D] table of a few MB).
// Rows that share one cos/sin row are rotated kHeadsPerPass at a time: each table vector is
// loaded (and sin's sign flipped) once for all of them, so the loop loads x, and stores out, with
// little else around. Results are stored two vectors at a time (bf16 packs a pair in one store).
// Each row reads every input piece before writing the output piece, so out may be x.

#include "ops/rope/rope_kernel.hpp"

#include <type_traits>

#include "ops/core/arch.hpp"
#include "ops/core/simd.hpp"

namespace ditops::rope {
namespace {

template <class Arch>
using B = simd::F32<Arch>;

/// Rows that share a cos/sin row rotated together (FLUX: 24 heads share one position's table).
constexpr int kHeadsPerPass = 4;

/// Lane permutation [1, 0, 3, 2, ...]: the partner of each element of an interleaved pair.
struct PairSwap {
  static constexpr unsigned get(unsigned index, unsigned) { return index ^ 1u; }
};

/// out[i] = x[i]*cos[i] - x[i+h]*sin[i];  out[i+h] = x[i+h]*cos[i+h] + x[i]*sin[i+h], for Rows
/// rows sharing one cos/sin row.
template <class Arch, class T, class C, int Rows>
void rotate_half(const T* const (&x)[Rows], T* const (&out)[Rows], const C* cos, const C* sin,
                 std::size_t dim, bool stream) {
  constexpr std::size_t kLanes = B<Arch>::size;
  const std::size_t half = dim / 2;
  // Pieces follow the cache lines of the first half; the second half streams along only when
  // it starts at the same offset within a line.
  const bool same_line_phase = half * sizeof(T) % simd::kCacheLineBytes == 0;
  simd::for_each_piece<Arch>(
      out[0], half, stream,
      [&](std::size_t i, auto whole) {
        const C* c = cos + i;
        const C* s = sin + i;
        const B<Arch> c1a = simd::load<Arch>(c), c1b = simd::load<Arch>(c + kLanes);
        const B<Arch> c2a = simd::load<Arch>(c + half), c2b = simd::load<Arch>(c + half + kLanes);
        const B<Arch> minus_s1a = -simd::load<Arch>(s), minus_s1b = -simd::load<Arch>(s + kLanes);
        const B<Arch> s2a = simd::load<Arch>(s + half), s2b = simd::load<Arch>(s + half + kLanes);
        for (int r = 0; r < Rows; ++r) {
          const T* in = x[r] + i;
          const B<Arch> x1a = simd::load<Arch>(in), x1b = simd::load<Arch>(in + kLanes);
          const B<Arch> x2a = simd::load<Arch>(in + half),
                        x2b = simd::load<Arch>(in + half + kLanes);
          simd::store_pair<Arch>(out[r] + i, simd::fmadd<Arch>(x2a, minus_s1a, x1a * c1a),
                                 simd::fmadd<Arch>(x2b, minus_s1b, x1b * c1b), whole);
          simd::store_pair<Arch>(out[r] + half + i, simd::fmadd<Arch>(x1a, s2a, x2a * c2a),
                                 simd::fmadd<Arch>(x1b, s2b, x2b * c2b), whole && same_line_phase);
        }
      },
      [&](std::size_t i, std::size_t n, auto whole) {
        const B<Arch> c1 = simd::load_chunk<Arch>(cos, i, n);
        const B<Arch> c2 = simd::load_chunk<Arch>(cos + half, i, n);
        const B<Arch> minus_s1 = -simd::load_chunk<Arch>(sin, i, n);
        const B<Arch> s2 = simd::load_chunk<Arch>(sin + half, i, n);
        for (int r = 0; r < Rows; ++r) {
          const B<Arch> x1 = simd::load_chunk<Arch>(x[r], i, n);
          const B<Arch> x2 = simd::load_chunk<Arch>(x[r] + half, i, n);
          simd::store_chunk<Arch>(out[r], i, n, simd::fmadd<Arch>(x2, minus_s1, x1 * c1), whole);
          simd::store_chunk<Arch>(out[r] + half, i, n, simd::fmadd<Arch>(x1, s2, x2 * c2),
                                  whole && same_line_phase);
        }
      });
}

/// out[2j] = x[2j]*cos[2j] - x[2j+1]*sin[2j];  out[2j+1] = x[2j+1]*cos[2j+1] + x[2j]*sin[2j+1],
/// for Rows rows sharing one cos/sin row.
template <class Arch, class T, class C, int Rows>
void rotate_interleaved(const T* const (&x)[Rows], T* const (&out)[Rows], const C* cos,
                        const C* sin, std::size_t dim, bool stream) {
  constexpr std::size_t kLanes = B<Arch>::size;
  constexpr auto kSwap = xsimd::make_batch_constant<xsimd::batch<std::uint32_t, Arch>, PairSwap>();
  // -0.0 on even lanes flips the sign of sin there: rot(x) = [-x1, x0, -x3, x2, ...].
  alignas(64) float sign_lanes[kLanes];
  for (std::size_t lane = 0; lane < kLanes; ++lane) sign_lanes[lane] = lane % 2 ? 0.f : -0.f;
  const B<Arch> sign = B<Arch>::load_aligned(sign_lanes);
  // Pairs must not straddle pieces, so the first (line-alignment) piece must be even-sized; when
  // out sits an odd number of elements off a line boundary, do not stream.
  const bool align = stream && simd::elements_to_line(out[0]) % 2 == 0;
  simd::for_each_piece<Arch>(
      out[0], dim, align,
      [&](std::size_t i, auto whole) {
        const B<Arch> ca = simd::load<Arch>(cos + i), cb = simd::load<Arch>(cos + i + kLanes);
        const B<Arch> sa = simd::load<Arch>(sin + i) ^ sign;
        const B<Arch> sb = simd::load<Arch>(sin + i + kLanes) ^ sign;
        for (int r = 0; r < Rows; ++r) {
          const B<Arch> va = simd::load<Arch>(x[r] + i), vb = simd::load<Arch>(x[r] + i + kLanes);
          simd::store_pair<Arch>(out[r] + i,
                                 simd::fmadd<Arch>(va, ca, xsimd::swizzle(va, kSwap) * sa),
                                 simd::fmadd<Arch>(vb, cb, xsimd::swizzle(vb, kSwap) * sb), whole);
        }
      },
      [&](std::size_t i, std::size_t n, auto whole) {
        const B<Arch> c = simd::load_chunk<Arch>(cos, i, n);
        const B<Arch> s = simd::load_chunk<Arch>(sin, i, n) ^ sign;
        for (int r = 0; r < Rows; ++r) {
          const B<Arch> v = simd::load_chunk<Arch>(x[r], i, n);
          simd::store_chunk<Arch>(out[r], i, n,
                                  simd::fmadd<Arch>(v, c, xsimd::swizzle(v, kSwap) * s), whole);
        }
      });
}

template <class Arch, class T, class C, int Rows>
void rotate(const RopeProblem& p, const T* const (&x)[Rows], T* const (&out)[Rows], const C* cos,
            const C* sin) {
  const auto dim = static_cast<std::size_t>(p.dim);
  if (p.mode == RotatedMode::rotated_half) {
    rotate_half<Arch, T, C, Rows>(x, out, cos, sin, dim, p.stream);
  } else {
    rotate_interleaved<Arch, T, C, Rows>(x, out, cos, sin, dim, p.stream);
  }
}

template <class Arch, class T, class C>
void rope_rows_typed(const RopeProblem& p, std::int64_t begin, std::int64_t end) {
  core::RowWalker<4> walker(p.rows, begin);
  for (std::int64_t row = begin; row < end;) {
    // The rows that follow and use the same cos/sin row, up to kHeadsPerPass; with streaming
    // stores they must also sit at the same offset within a cache line, as the pieces follow
    // the first row's lines.
    const std::int64_t cos_offset = walker.offset(kCos), sin_offset = walker.offset(kSin);
    const T* x[kHeadsPerPass];
    T* out[kHeadsPerPass];
    int rows = 0;
    do {
      x[rows] = static_cast<const T*>(p.x) + walker.offset(kX);
      out[rows] = static_cast<T*>(p.out) + walker.offset(kOut);
      ++rows;
      ++row;
      walker.next();
    } while (rows < kHeadsPerPass && row < end && walker.offset(kCos) == cos_offset &&
             walker.offset(kSin) == sin_offset &&
             (!p.stream || simd::elements_to_line(static_cast<T*>(p.out) + walker.offset(kOut)) ==
                               simd::elements_to_line(out[0])));
    const C* cos = static_cast<const C*>(p.cos) + cos_offset;
    const C* sin = static_cast<const C*>(p.sin) + sin_offset;
    if (rows == kHeadsPerPass) {
      rotate<Arch>(p, x, out, cos, sin);
    } else {
      for (int r = 0; r < rows; ++r) {
        const T* const one_x[1] = {x[r]};
        T* const one_out[1] = {out[r]};
        rotate<Arch>(p, one_x, one_out, cos, sin);
      }
    }
  }
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
