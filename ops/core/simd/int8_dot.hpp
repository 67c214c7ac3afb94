#pragma once
// Integer SIMD helpers for the int8 kernels: int8 dot products, the dot_tile register
// microkernel, int32 reductions, symmetric int8 scales and narrowing byte stores.

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/core/simd/gaps.hpp"

namespace ditops::simd {

// ---- integer dot products ------------------------------------------------------------------

template <class Arch>
using I32 = xsimd::batch<std::int32_t, Arch>;

/// Per-lane sum of the two int16 products of a and b (pmaddwd), exact in int32.
template <class Arch>
inline I32<Arch> madd_int16(I32<Arch> a, I32<Arch> b) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    return _mm512_madd_epi16(a, b);
  } else if constexpr (kIsAvx2<Arch>) {
    return _mm256_madd_epi16(a, b);
  } else {
    return _mm_madd_epi16(a, b);
  }
}

/// Whether dot_u8s8 is one vpdpbusd: AVX512-VNNI on zmm (the avx512+bf16+vnni variant) or
/// AVX-VNNI on ymm (the avx2+vnni variant). The int8 kernels then multiply u8 rows (x + 128,
/// the offset taken back through column sums) by s8, exact for any u8.
template <class Arch>
inline constexpr bool kHasVpdpbusd = kHasBf16Vnni<Arch> || kHasAvxVnni<Arch>;

/// Whether the int8 dot products below run on pmaddubsw: the SSE4.2 and AVX2 levels (SSSE3
/// has it and psignb; AVX-512 has no vpsignb, and the VNNI variants have vpdpbusd instead).
template <class Arch>
inline constexpr bool kHasMaddubs =
    !kHasVpdpbusd<Arch> && (kIsAvx2<Arch> || std::is_base_of_v<xsimd::ssse3, Arch>);

/// The largest u8 operand dot_u8s8 multiplies exactly by any s8 operand: pmaddubsw saturates
/// its int16 sums of two products, which hold 2 x 127 x 128 = 32512 but not 2 x 255 x 128.
template <class Arch>
inline constexpr int kDotU8Max = kHasMaddubs<Arch> ? 127 : 255;

/// The even (sign-extended low) and odd (high) bytes of each 16-bit half of v, as int16: the
/// pmaddwd emulation's widening (an arithmetic 16-bit shift sign-extends).
template <class Arch>
inline void widen_s8(I32<Arch> v, I32<Arch>& even, I32<Arch>& odd) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    even = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8);
    odd = _mm512_srai_epi16(v, 8);
  } else if constexpr (kIsAvx2<Arch>) {
    even = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
    odd = _mm256_srai_epi16(v, 8);
  } else {
    even = _mm_srai_epi16(_mm_slli_epi16(v, 8), 8);
    odd = _mm_srai_epi16(v, 8);
  }
}

/// acc + the per-lane sum of the 2 int16 pair sums of pmaddubsw(unsigned(a), signed(b)).
template <class Arch>
inline I32<Arch> add_maddubs(I32<Arch> acc, I32<Arch> a, I32<Arch> b) noexcept {
  const I32<Arch> int16_ones(0x00010001);
  if constexpr (kIsAvx2<Arch>) {
    return acc + madd_int16<Arch>(_mm256_maddubs_epi16(a, b), int16_ones);
  } else {
    return acc + madd_int16<Arch>(_mm_maddubs_epi16(a, b), int16_ones);
  }
}

/// The software model of the avx2+vnni variant (DITOPS_AVXVNNI_MODEL=1, ops/core/arch.hpp):
/// its dot_u8s8 is AVX2's pmaddwd emulation, exact for any u8 as vpdpbusd is.
template <class Arch>
inline constexpr bool kIsAvxVnniModel = std::is_base_of_v<avx2_vnni_model, Arch>;

/// acc + the per-lane sum of the 4 byte products unsigned(a) x signed(b), exact for a <=
/// kDotU8Max: vpdpbusd (the non-saturating form) with AVX512-VNNI or AVX-VNNI; pmaddubsw, then
/// pmaddwd by ones, on the SSE4.2 and AVX2 levels; elsewhere (and on the AVX-VNNI model) bytes
/// widened to int16 pairs through pmaddwd (bytes 0 and 2, then 1 and 3).
template <class Arch>
inline I32<Arch> dot_u8s8(I32<Arch> acc, I32<Arch> a, I32<Arch> b) noexcept {
  if constexpr (kHasBf16Vnni<Arch>) {
    // Inline asm, not _mm512_dpbusd_epi32: around the intrinsic GCC 12 copied every
    // accumulator to a scratch register and back (2 moves per vpdpbusd) and, with 24
    // accumulators, stored them to the stack each iteration (1.5x slower int8 attention).
    // Register operands only: given "vm", GCC reloaded a vector reused by several rows from
    // memory for every instruction (MLA QK: 3x the loads).
    __m512i sum = acc;
    asm("vpdpbusd %2, %1, %0"
        : "+v"(sum)
        : "v"(static_cast<__m512i>(a)), "v"(static_cast<__m512i>(b)));
    return sum;
  } else if constexpr (kHasAvxVnni<Arch> && !kIsAvxVnniModel<Arch>) {
    // Inline asm rather than _mm256_dpbusd_avx_epi32, for the register tiles' sake as above.
    // {vex} (%{ %}: braces escaped from the asm dialect syntax): the AVX-VNNI encoding (the
    // assembler's default is AVX512-VL's EVEX one, which a CPU without AVX-512 faults on); "x":
    // ymm0-15, the registers VEX encodes.
    __m256i sum = acc;
    asm("%{vex%} vpdpbusd %2, %1, %0"
        : "+x"(sum)
        : "x"(static_cast<__m256i>(a)), "x"(static_cast<__m256i>(b)));
    return sum;
  } else if constexpr (kHasMaddubs<Arch>) {
    return add_maddubs<Arch>(acc, a, b);
  } else {
    const I32<Arch> low_bytes(0x00ff00ff);
    const I32<Arch> a_even = a & low_bytes, a_odd = (a >> 8) & low_bytes;
    I32<Arch> b_even, b_odd;
    widen_s8<Arch>(b, b_even, b_odd);
    return acc + madd_int16<Arch>(a_even, b_even) + madd_int16<Arch>(a_odd, b_odd);
  }
}

/// |v| per byte (-128 gives 128 read as u8) on pmaddubsw levels, the operand dot_s8s8 takes
/// as a_magnitude; elsewhere v itself (the emulation does not use it).
template <class Arch>
inline I32<Arch> magnitude_s8(I32<Arch> v) noexcept {
  if constexpr (kIsAvx2<Arch>) {
    return _mm256_abs_epi8(v);
  } else if constexpr (kHasMaddubs<Arch>) {
    return _mm_abs_epi8(v);
  } else {
    return v;
  }
}

/// acc + the per-lane sum of the 4 byte products signed(a) x signed(b), with a_magnitude =
/// magnitude_s8(a); exact when b's bytes are in [-127, 127] (the sign trick would turn a b of
/// -128 into -128 again; a may be -128: 2 x 128 x 127 fits int16). pmaddubsw levels: |a| as
/// u8 times b carrying a's sign (psignb, ggml's q8_0 trick); elsewhere both widened to int16
/// through pmaddwd. The VNNI variants multiply u8 by s8 (dot_u8s8) instead.
template <class Arch>
inline I32<Arch> dot_s8s8(I32<Arch> acc, I32<Arch> a_magnitude, I32<Arch> a, I32<Arch> b) noexcept {
  static_assert(!kHasVpdpbusd<Arch>, "the VNNI kernels use dot_u8s8");
  if constexpr (kIsAvx2<Arch>) {
    return add_maddubs<Arch>(acc, a_magnitude, _mm256_sign_epi8(b, a));
  } else if constexpr (kHasMaddubs<Arch>) {
    return add_maddubs<Arch>(acc, a_magnitude, _mm_sign_epi8(b, a));
  } else {
    I32<Arch> a_even, a_odd, b_even, b_odd;
    widen_s8<Arch>(a, a_even, a_odd);
    widen_s8<Arch>(b, b_even, b_odd);
    return acc + madd_int16<Arch>(a_even, b_even) + madd_int16<Arch>(a_odd, b_odd);
  }
}

/// The byte type of the broadcast rows of dot_tile: u8 (dot_u8s8), s8 (dot_s8s8), or u8 of
/// at most kDotU6Max, for which pmaddubsw levels add two words' int16 sums before one pmaddwd
/// (2 x 2 x 63 x 128 = 32256 fits int16): 3 multiply uops per two words instead of 4.
enum class RowBytes : std::uint8_t { u8, s8, u6 };

/// The largest row byte of dot_tile with RowBytes::u6.
template <class Arch>
inline constexpr int kDotU6Max = kHasMaddubs<Arch> ? 63 : kDotU8Max<Arch>;

/// acc + the per-lane sum of the 8 byte products of two word pairs a0 x b0 and a1 x b1
/// (unsigned a at most kDotU6Max, signed b): both pmaddubsw sums added in int16, then one
/// pmaddwd by ones.
template <class Arch>
inline I32<Arch> dot_u6s8_pair(I32<Arch> acc, I32<Arch> a0, I32<Arch> b0, I32<Arch> a1,
                               I32<Arch> b1) noexcept {
  const I32<Arch> int16_ones(0x00010001);
  if constexpr (kIsAvx2<Arch>) {
    const __m256i sums =
        _mm256_add_epi16(_mm256_maddubs_epi16(a0, b0), _mm256_maddubs_epi16(a1, b1));
    return acc + madd_int16<Arch>(sums, int16_ones);
  } else {
    const __m128i sums = _mm_add_epi16(_mm_maddubs_epi16(a0, b0), _mm_maddubs_epi16(a1, b1));
    return acc + madd_int16<Arch>(sums, int16_ones);
  }
}

// One row of the AVX2 sign-trick tile below: the row's word broadcast from ROW (ymm12), its
// magnitude (ymm13), and per vector of columns (ymm10, ymm11) vpsignb, vpmaddubsw, vpmaddwd by
// ones and vpaddd of the product (ymm14, ymm15) into the row's accumulators.
#define DITOPS_S8_ROW_V1(ROW, ACC0)          \
  "vpbroadcastd " ROW                        \
  ", %%ymm12\n\t"                            \
  "vpabsb %%ymm12, %%ymm13\n\t"              \
  "vpsignb %%ymm12, %%ymm10, %%ymm14\n\t"    \
  "vpmaddubsw %%ymm14, %%ymm13, %%ymm14\n\t" \
  "vpmaddwd %[ones], %%ymm14, %%ymm14\n\t"   \
  "vpaddd %%ymm14, %[" ACC0 "], %[" ACC0 "]\n\t"
#define DITOPS_S8_ROW_V2(ROW, ACC0, ACC1)    \
  DITOPS_S8_ROW_V1(ROW, ACC0)                \
  "vpsignb %%ymm12, %%ymm11, %%ymm15\n\t"    \
  "vpmaddubsw %%ymm15, %%ymm13, %%ymm15\n\t" \
  "vpmaddwd %[ones], %%ymm15, %%ymm15\n\t"   \
  "vpaddd %%ymm15, %[" ACC1 "], %[" ACC1 "]\n\t"

/// The AVX2 s8 tile of dot_tile for 4 rows, V (1 or 2) vectors and rows' words 4 bytes apart,
/// as one asm loop over the words. Written as intrinsics, GCC hoisted each row's broadcast above
/// the rows before it and ran out of the 16 ymm registers: it kept accumulators on the stack, a
/// store and a reload per word (the linear layers' int8 GEMM at 0.80 of the vpmaddubsw chain's
/// peak). Here the 8 accumulators and the pmaddwd constant take 9 registers the compiler picks,
/// the weight vectors, the row's word and magnitude and the products 6 fixed ones (ymm10-15:
/// an asm statement takes at most 30 operands), and the loop touches memory only for its loads.
template <int V>
[[gnu::always_inline]] inline void dot_tile_s8_avx2_4rows(
    const std::uint8_t* rows, std::int64_t row_bytes, const std::int8_t* vectors,
    std::int64_t word_bytes, std::int64_t words, __m256i (&acc)[4][V]) noexcept {
  static_assert(V == 1 || V == 2, "one or two vectors of columns");
  if (words <= 0) return;
  __m256i acc00 = acc[0][0], acc10 = acc[1][0], acc20 = acc[2][0], acc30 = acc[3][0];
  const __m256i ones = _mm256_set1_epi16(1);
  const std::int64_t row_bytes3 = 3 * row_bytes;
  const std::int8_t* const end = vectors + words * word_bytes;
  if constexpr (V == 2) {
    __m256i acc01 = acc[0][1], acc11 = acc[1][1], acc21 = acc[2][1], acc31 = acc[3][1];
    asm volatile(
        "1:\n\t"
        "vmovdqa (%[vectors]), %%ymm10\n\t"
        "vmovdqa 32(%[vectors]), %%ymm11\n\t"  //
        DITOPS_S8_ROW_V2("(%[rows])", "acc00", "acc01")
        DITOPS_S8_ROW_V2("(%[rows],%[row_bytes],1)", "acc10", "acc11")
        DITOPS_S8_ROW_V2("(%[rows],%[row_bytes],2)", "acc20", "acc21")
        DITOPS_S8_ROW_V2("(%[rows],%[row_bytes3],1)", "acc30", "acc31")
        "add %[word_bytes], %[vectors]\n\t"
        "add $4, %[rows]\n\t"
        "cmp %[end], %[vectors]\n\t"
        "jne 1b"
        : [acc00] "+x"(acc00), [acc01] "+x"(acc01), [acc10] "+x"(acc10), [acc11] "+x"(acc11),
          [acc20] "+x"(acc20), [acc21] "+x"(acc21), [acc30] "+x"(acc30), [acc31] "+x"(acc31),
          [vectors] "+r"(vectors), [rows] "+r"(rows)
        : [ones] "x"(ones), [row_bytes] "r"(row_bytes), [row_bytes3] "r"(row_bytes3),
          [word_bytes] "r"(word_bytes), [end] "r"(end)
        : "cc", "memory", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    acc[0][1] = acc01, acc[1][1] = acc11, acc[2][1] = acc21, acc[3][1] = acc31;
  } else {
    asm volatile(
        "1:\n\t"
        "vmovdqa (%[vectors]), %%ymm10\n\t"  //
        DITOPS_S8_ROW_V1("(%[rows])", "acc00")
        DITOPS_S8_ROW_V1("(%[rows],%[row_bytes],1)", "acc10")
        DITOPS_S8_ROW_V1("(%[rows],%[row_bytes],2)", "acc20")
        DITOPS_S8_ROW_V1("(%[rows],%[row_bytes3],1)", "acc30")
        "add %[word_bytes], %[vectors]\n\t"
        "add $4, %[rows]\n\t"
        "cmp %[end], %[vectors]\n\t"
        "jne 1b"
        : [acc00] "+x"(acc00), [acc10] "+x"(acc10), [acc20] "+x"(acc20), [acc30] "+x"(acc30),
          [vectors] "+r"(vectors), [rows] "+r"(rows)
        : [ones] "x"(ones), [row_bytes] "r"(row_bytes), [row_bytes3] "r"(row_bytes3),
          [word_bytes] "r"(word_bytes), [end] "r"(end)
        : "cc", "memory", "xmm10", "xmm12", "xmm13", "xmm14");
  }
  acc[0][0] = acc00, acc[1][0] = acc10, acc[2][0] = acc20, acc[3][0] = acc30;
}
#undef DITOPS_S8_ROW_V1
#undef DITOPS_S8_ROW_V2

/// The int8 register tile of the int8 attention and MLA kernels: acc[r][c] += the word of row
/// r at word w (rows + r * row_bytes + w * word_row_bytes; bytes as kRowBytes) times the V
/// consecutive s8 vectors of word w (vectors + w * word_bytes), exact int32 within the ranges
/// of dot_u8s8 / dot_s8s8, for w < words. Accumulators are plain register arrays: GCC kept
/// arrays of xsimd integer batches in memory (a store and a reload around every vpdpbusd).
template <class Arch, int R, int V, RowBytes kRowBytes>
[[gnu::always_inline]] inline void dot_tile(
    const void* rows, std::int64_t row_bytes, std::int64_t word_row_bytes,
    const std::int8_t* vectors, std::int64_t word_bytes, std::int64_t words,
    typename I32<Arch>::register_type (&acc)[R][V]) noexcept {
  using Reg = typename I32<Arch>::register_type;
  constexpr std::int64_t kLanes = I32<Arch>::size;
  const auto* row_base = static_cast<const std::uint8_t*>(rows);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) acc[r][c] = I32<Arch>(0);
  }
  const auto row_word = [&](int r, std::int64_t word) {
    std::int32_t bytes;
    std::memcpy(&bytes, row_base + r * row_bytes + word * word_row_bytes, sizeof bytes);
    return Reg(I32<Arch>(bytes));
  };
  if constexpr (kRowBytes == RowBytes::s8 && kIsAvx2<Arch> && R == 4 && V <= 2) {
    if (word_row_bytes == 4) {
      dot_tile_s8_avx2_4rows<V>(row_base, row_bytes, vectors, word_bytes, words, acc);
      return;
    }
  }
  std::int64_t first_single = 0;
  if constexpr (kRowBytes == RowBytes::u6 && kHasMaddubs<Arch>) {
    for (; first_single + 2 <= words; first_single += 2) {
      Reg vector0[V], vector1[V];
      const auto* at = reinterpret_cast<const std::int32_t*>(vectors + first_single * word_bytes);
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) {
        vector0[c] = I32<Arch>::load_aligned(at + c * kLanes);
        vector1[c] = I32<Arch>::load_aligned(at + word_bytes / 4 + c * kLanes);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const Reg row0 = row_word(r, first_single), row1 = row_word(r, first_single + 1);
#pragma GCC unroll 4
        for (int c = 0; c < V; ++c) {
          acc[r][c] = dot_u6s8_pair<Arch>(acc[r][c], row0, vector0[c], row1, vector1[c]);
        }
      }
    }
  }
  for (std::int64_t word = first_single; word < words; ++word) {
    Reg vector[V];
    const auto* at = reinterpret_cast<const std::int32_t*>(vectors + word * word_bytes);
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) vector[c] = I32<Arch>::load_aligned(at + c * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Reg row = row_word(r, word);
      const Reg magnitude = magnitude_s8<Arch>(row);  // unused unless s8
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) {
        if constexpr (kRowBytes == RowBytes::s8) {
          acc[r][c] = dot_s8s8<Arch>(acc[r][c], magnitude, row, vector[c]);
        } else {
          acc[r][c] = dot_u8s8<Arch>(acc[r][c], row, vector[c]);
        }
      }
    }
  }
}

/// Largest lane of an int32 vector.
template <class Arch>
inline std::int32_t reduce_max(I32<Arch> v) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    return _mm512_reduce_max_epi32(v);
  } else if constexpr (kIsAvx2<Arch> || std::is_base_of_v<xsimd::sse4_1, Arch>) {
    // Halving shuffles (pmaxsd is SSE4.1) rather than a store and a scalar loop: the int8
    // softmax takes one block max per row and block of 64 scores.
    __m128i top;
    if constexpr (kIsAvx2<Arch>) {
      top = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    } else {
      top = v;
    }
    top = _mm_max_epi32(top, _mm_shuffle_epi32(top, 0x4e));
    top = _mm_max_epi32(top, _mm_shuffle_epi32(top, 0xb1));
    return _mm_cvtsi128_si32(top);
  } else {
    alignas(64) std::int32_t lanes[I32<Arch>::size];
    v.store_aligned(lanes);
    std::int32_t best = lanes[0];
    for (std::size_t i = 1; i < I32<Arch>::size; ++i) best = lanes[i] > best ? lanes[i] : best;
    return best;
  }
}

/// Sum of the lanes of an int32 vector (wrapping, as the lanes' own adds).
template <class Arch>
inline std::int32_t reduce_add(I32<Arch> v) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    return _mm512_reduce_add_epi32(v);
  } else {
    alignas(64) std::int32_t lanes[I32<Arch>::size];
    v.store_aligned(lanes);
    std::uint32_t sum = 0;
    for (std::size_t i = 0; i < I32<Arch>::size; ++i) sum += static_cast<std::uint32_t>(lanes[i]);
    return static_cast<std::int32_t>(sum);
  }
}

/// The scale of symmetric int8 quantization of values whose largest magnitude is `top`:
/// top / 127, or 1 when that is not a normal float (all zero, or so small that 1 / scale
/// would overflow): every value then quantizes to 0.
inline float int8_scale(float top) noexcept {
  const float scale = top / 127.f;
  return scale >= std::numeric_limits<float>::min() ? scale : 1.f;
}

/// The low byte of each int32 lane (values known to fit) to dst, F32<Arch>::size bytes.
/// SSE and AVX2 have no truncating narrow: the low bytes (0..255, masked) go through the
/// saturating packs, which keep them as they are (a store and a byte loop cost the AVX2 int8
/// attention 3 % when its softmax narrowed P with it; that now uses store_bytes_x4).
template <class Arch>
inline void store_low_bytes(void* dst, I32<Arch> v) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    _mm_storeu_si128(static_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(v));
  } else if constexpr (kIsAvx2<Arch>) {
    const __m256i words = _mm256_packs_epi32(v & I32<Arch>(0xff), I32<Arch>(0));
    const __m256i bytes = _mm256_packus_epi16(words, words);  // 4 bytes per 128-bit lane
    const __m128i low8 =
        _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1));
    _mm_storel_epi64(static_cast<__m128i*>(dst), low8);
  } else {
    const __m128i words = _mm_packs_epi32(v & I32<Arch>(0xff), _mm_setzero_si128());
    const std::int32_t bytes = _mm_cvtsi128_si32(_mm_packus_epi16(words, words));
    std::memcpy(dst, &bytes, sizeof bytes);
  }
}

/// The lanes of four int32 vectors as 4 x lanes consecutive bytes at dst (a's lanes first), each
/// lane in [0, 255] (u8) or, with kSigned, in [-128, 127] (s8): two saturating packs and, on
/// AVX2, one lane permute for 32 bytes, where store_low_bytes per vector takes six instructions
/// and a 4- or 8-byte store each.
template <class Arch, bool kSigned = false>
inline void store_bytes_x4(void* dst, I32<Arch> a, I32<Arch> b, I32<Arch> c, I32<Arch> d) noexcept {
  if constexpr (kIsAvx512<Arch>) {
    auto* bytes = static_cast<std::uint8_t*>(dst);
    store_low_bytes<Arch>(bytes, a);
    store_low_bytes<Arch>(bytes + 16, b);
    store_low_bytes<Arch>(bytes + 32, c);
    store_low_bytes<Arch>(bytes + 48, d);
  } else if constexpr (kIsAvx2<Arch>) {
    // Per 128-bit lane the packs interleave 4 lanes of a, b, c, d: dwords a0 b0 c0 d0 | a1 b1
    // c1 d1, where x0 / x1 are x's low / high four lanes.
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    const __m256i bytes = kSigned ? _mm256_packs_epi16(ab, cd) : _mm256_packus_epi16(ab, cd);
    _mm256_storeu_si256(
        static_cast<__m256i*>(dst),
        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  } else {
    const __m128i ab = _mm_packs_epi32(a, b), cd = _mm_packs_epi32(c, d);
    _mm_storeu_si128(static_cast<__m128i*>(dst),
                     kSigned ? _mm_packs_epi16(ab, cd) : _mm_packus_epi16(ab, cd));
  }
}

// ---- quantization ----------------------------------------------------------------------------

/// round(clamp(x / divisor + addend, low, high)), ties to even, lane by lane: the integers the
/// fp32 quotient and then the sum give (the quantizers' contract), from a product by the
/// reciprocal in all but a few lanes. The division costs the quantizer of a linear layer's
/// input a fifth of its time on AVX2 (one vdivps per vector, on one pipe).
/// Why it is exact: y = x · (1 / divisor) + addend (one fma, or a product and a sum) is within
/// 2^-24 · (5 |y| + 3 |addend|) of the quotient's sum (each rounding at most 2^-24 relative, the
/// reciprocal's one scaled by x / divisor). Both round to the same integer unless one lies within
/// that distance of a half-integer; for |y| < 256 a margin of 2^-12 + 2^-20 · |addend| is more
/// than three times it, and past 256 both are clamped alike (low and high are integers of at
/// most 128 in magnitude). A group of vectors with a lane within the margin of a half-integer
/// (about 1 lane in 2,000 for uniform fractions) is divided instead. A divisor whose reciprocal
/// is not a normal float is always divided. NaN stays NaN on both paths, as before the clamp.
template <class Arch>
class QuotientRounder {
 public:
  QuotientRounder(float divisor, float addend, float low, float high) noexcept
      : divisor_(divisor), addend_(addend), low_(low), high_(high) {
    const float reciprocal = 1.f / divisor;
    fast_ = std::isnormal(divisor) && std::isnormal(reciprocal);
    reciprocal_ = F32<Arch>(reciprocal);
    near_half_ = F32<Arch>(0.5f - (0x1p-12f + 0x1p-20f * std::fabs(addend)));
  }

  /// q[j] for the N vectors x[j].
  template <int N>
  [[gnu::always_inline]] void operator()(const F32<Arch> (&x)[N],
                                         I32<Arch> (&q)[N]) const noexcept {
    F32<Arch> y[N];
    bool divide = !fast_;
    if (fast_) {
      xsimd::batch_bool<float, Arch> near(false);
#pragma GCC unroll 4
      for (int j = 0; j < N; ++j) {
        y[j] = fmadd<Arch>(x[j], reciprocal_, addend_);
        near = near || xsimd::abs(y[j] - xsimd::nearbyint(y[j])) >= near_half_;
      }
      divide = xsimd::any(near);
    }
    if (divide) {
#pragma GCC unroll 4
      for (int j = 0; j < N; ++j) y[j] = x[j] / divisor_ + addend_;
    }
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) {
      q[j] = xsimd::nearbyint_as_int(xsimd::min(xsimd::max(y[j], low_), high_));
    }
  }

 private:
  F32<Arch> divisor_, addend_, low_, high_, reciprocal_, near_half_;
  bool fast_ = false;
};

}  // namespace ditops::simd
