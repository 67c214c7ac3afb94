// int8 attention, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// Operands (int8_quantize_kv_head, once per call): K minus its per-(sequence, KV head) mean
// (SageAttention's smoothing: q·(k - mean) differs from q·k by a per-row constant, so the
// softmax is unchanged and only the LSE needs q·mean back), quantized symmetrically per block
// of 64 keys to [-127, 127] and stored four d per 32-bit word, keys in lanes; V quantized per
// block and channel, stored four keys per word, channels in lanes. The same layouts serve
// every level: vpdpbusd and pmaddubsw both multiply 4-byte words lane by lane. Q is quantized
// per row (a block of one row costs nothing more here: its factor multiplies the row's scores
// anyway) with softmax scale * log2(e) folded in; with VNNI as u8 (q + 128) so vpdpbusd
// multiplies u8 Q by s8 K, the offset taken back with each key's precomputed 128 * sum(k);
// elsewhere as s8 for dot_s8s8 (the sign trick on pmaddubsw levels).
//
// A row group of micro-tiles walks its KV blocks in the shared schedule's order
// (schedule::walk_stages), so with chunk 2 it computes S for blocks b, b+1 (QK: int32 S in the
// ping-pong slot), softmaxes both (SM: dequantize fused with the row max, mask, online max/sum
// in fp32, P quantized per row and block as u8 = round(n * 2^(s - block max)), n = kPLevels),
// then PV and UP of b and b+1 (PV: u8 P x s8 V into int32, exact; UP: O = alpha * O +
// p_factor * v_scale * PV in fp32, the epilogue of the same register tile).
//
// Why int8 P·V and not bf16: vpdpbusd does 4 MACs per lane where vdpbf16ps does 2, and on the
// Intel Xeon this was chosen on vdpbf16ps runs at half the fp32 FMA rate (bench: peak_bf16;
// on AMD Zen 4 it runs at twice the FMA rate, still half of vpdpbusd's), so bf16 P·V would be
// slower than int8 everywhere, and fp32 P·V alone costs about as much as the whole int8 target. u8
// P with a per-(row, block) scale keeps every weight within 1 / (2n) of its block's largest one: n
// = 255 with vpdpbusd and the pmaddwd emulation, 63 on pmaddubsw levels, where two words' int16
// sums then add before one pmaddwd (13 % faster at S = 2048 than 127 levels, 1.5-2x the relative L2
// error). The accuracy tests (tests/attention/int8_test.cpp) measure the result against the fp64
// reference.

#include "ops/attention/int8_kernel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/attention/int8_runner.hpp"
#include "ops/core/arch.hpp"

namespace ditops::attention {
namespace {

/// Largest |x| over count (<= lanes) elements at src, as a vector to max-reduce later.
template <class Arch, class T>
inline B<Arch> abs_chunk(const T* src, std::int64_t i, std::int64_t count,
                         const float* subtract) noexcept {
  B<Arch> x = simd::load_chunk<Arch>(src, i, count);
  if (subtract) x -= simd::load_chunk<Arch>(subtract, i, count);
  return xsimd::abs(x);
}

template <class Arch, class T>
void key_mean(const FlashProblem& p, std::int64_t seq, std::int64_t kv_head, float* mean) {
  constexpr int L = Int8Tiles<Arch>::kLanes;
  const Sequence s = sequence_of(p, seq);
  const T* k = static_cast<const T*>(p.k) + seq * p.k_strides.batch + s.k_row0 * p.k_strides.seq +
               kv_head * p.k_strides.head;
  std::fill(mean, mean + p.dk, 0.f);
  for (std::int64_t key = 0; key < s.kv_len; ++key) {
    if (key + 8 < s.kv_len) prefetch_row(k + (key + 8) * p.k_strides.seq, p.dk);
    for (std::int64_t d = 0; d < p.dk; d += L) {
      const std::int64_t width = std::min<std::int64_t>(L, p.dk - d);
      simd::store_chunk<Arch>(mean, d, width,
                              simd::load_chunk<Arch>(mean, d, width) +
                                  simd::load_chunk<Arch>(k + key * p.k_strides.seq, d, width),
                              false);
    }
  }
  const B<Arch> inverse(s.kv_len > 0 ? 1.f / static_cast<float>(s.kv_len) : 0.f);
  for (std::int64_t d = 0; d < p.dk; d += L) {
    const std::int64_t width = std::min<std::int64_t>(L, p.dk - d);
    simd::store_chunk<Arch>(mean, d, width, simd::load_chunk<Arch>(mean, d, width) * inverse,
                            false);
  }
}

template <class Arch, class T>
void quantize_block(const FlashProblem& p, const Int8Operands& op, std::int64_t seq,
                    std::int64_t kv_head, std::int64_t block, std::int64_t global,
                    const float* mean) {
  constexpr int L = Int8Tiles<Arch>::kLanes;
  const Sequence s = sequence_of(p, seq);
  const std::int64_t first = block * kKvBlock;
  const std::int64_t keys = std::min(kKvBlock, s.kv_len - first);
  const T* k = static_cast<const T*>(p.k) + seq * p.k_strides.batch +
               (s.k_row0 + first) * p.k_strides.seq + kv_head * p.k_strides.head;
  const T* v = static_cast<const T*>(p.v) + seq * p.v_strides.batch +
               (s.k_row0 + first) * p.v_strides.seq + kv_head * p.v_strides.head;
  std::int8_t* k_out = op.k + global * op.dk_words * kKvBlock * 4;
  std::int32_t* k_sum = op.k_sum + global * kKvBlock;
  std::int8_t* v_out = op.v + global * kKvBlock * p.dv_padded;
  float* v_scale = op.v_scale + global * p.dv_padded;

  // K: one scale for the block (symmetric, max |k - mean| / 127). The max passes read the
  // block's rows first, each a fresh page where heads interleave ([B, S, N, D]): rows 8 keys
  // ahead are asked for, so their misses overlap (the quantizing pass's share of the call at
  // S = 2048 went from 6.2 to 4.9 %).
  B<Arch> k_top(0.f);
  for (std::int64_t key = 0; key < keys; ++key) {
    if (key + 8 < keys) prefetch_row(k + (key + 8) * p.k_strides.seq, p.dk);
    for (std::int64_t d = 0; d < p.dk; d += L) {
      k_top = xsimd::max(k_top, abs_chunk<Arch>(k + key * p.k_strides.seq, d,
                                                std::min<std::int64_t>(L, p.dk - d), mean));
    }
  }
  const float k_max = simd::reduce_max<Arch>(k_top);
  const float k_scale = simd::int8_scale(k_max);
  op.k_scale[global] = k_scale;
  std::memset(k_out, 0, static_cast<std::size_t>(op.dk_words * kKvBlock * 4));
  std::fill(k_sum, k_sum + kKvBlock, 0);
  const B<Arch> k_inverse(1.f / k_scale);
  for (std::int64_t key = 0; key < keys; ++key) {
    I32<Arch> sum(0);
    for (std::int64_t d = 0; d < p.dk; d += L) {
      const std::int64_t width = std::min<std::int64_t>(L, p.dk - d);
      B<Arch> x = simd::load_chunk<Arch>(k + key * p.k_strides.seq, d, width);
      if (mean) x -= simd::load_chunk<Arch>(mean, d, width);
      const I32<Arch> quantized = clamp_int8(round_to_int<Arch>(x * k_inverse));  // 0 past dk
      sum += quantized;
      alignas(64) std::int8_t bytes[L];
      simd::store_low_bytes<Arch>(bytes, quantized);
      // d .. d + L - 1 are words d / 4 ..: each word's 4 bytes sit at [word][key][0..3].
      for (int w = 0; w < L / 4 && d + 4 * w < p.dk; ++w) {
        std::memcpy(k_out + ((d / 4 + w) * kKvBlock + key) * 4, bytes + 4 * w, 4);
      }
    }
    // 128 · Σ k, what u8 Q (q + 128) adds to a score, on every level: the AMX kernel takes Q as
    // u8 whatever level quantized K, and kernels with s8 Q ignore it. Wrapping like the lanes'
    // adds: a non-finite key quantizes to INT_MIN (the conversion's "integer indefinite"), and
    // 128 times that overflowed int (undefined behaviour).
    k_sum[key] =
        static_cast<std::int32_t>(128u * static_cast<std::uint32_t>(simd::reduce_add<Arch>(sum)));
  }

  // V: one scale per channel over the block's keys (running max in v_scale, key by key).
  std::memset(v_out, 0, static_cast<std::size_t>(kKvBlock * p.dv_padded));
  std::fill(v_scale, v_scale + p.dv_padded, 0.f);
  for (std::int64_t key = 0; key < keys; ++key) {
    if (key + 8 < keys) prefetch_row(v + (key + 8) * p.v_strides.seq, p.dv);
    for (std::int64_t d = 0; d < p.dv; d += L) {
      const std::int64_t width = std::min<std::int64_t>(L, p.dv - d);
      const B<Arch> top = xsimd::max(simd::load_chunk<Arch>(v_scale, d, width),
                                     abs_chunk<Arch>(v + key * p.v_strides.seq, d, width, nullptr));
      simd::store_chunk<Arch>(v_scale, d, width, top, false);
    }
  }
  for (std::int64_t d = 0; d < p.dv_padded; d += L) {
    const B<Arch> top = B<Arch>::load_unaligned(v_scale + d);
    // simd::int8_scale per lane: 1 where max / 127 is not a normal float.
    const B<Arch> scale = top * B<Arch>(1.f / 127.f);
    xsimd::select(scale >= B<Arch>(std::numeric_limits<float>::min()), scale, B<Arch>(1.f))
        .store_unaligned(v_scale + d);
  }
  std::int64_t key = 0;
  if constexpr (simd::kIsAvx512<Arch>) {
    // 4 keys x 16 channels to 16 words of 4 keys each: two rounds of byte/word unpacking.
    for (; key + 4 <= keys; key += 4) {
      for (std::int64_t d = 0; d < p.dv; d += L) {
        const std::int64_t width = std::min<std::int64_t>(L, p.dv - d);
        const B<Arch> inverse = B<Arch>(1.f) / B<Arch>::load_unaligned(v_scale + d);
        auto bytes = [&](std::int64_t row) {
          return _mm512_cvtepi32_epi8(round_to_int<Arch>(
              simd::load_chunk<Arch>(v + row * p.v_strides.seq, d, width) * inverse));
        };
        const __m128i k0 = bytes(key), k1 = bytes(key + 1), k2 = bytes(key + 2),
                      k3 = bytes(key + 3);
        const __m128i k01_low = _mm_unpacklo_epi8(k0, k1), k01_high = _mm_unpackhi_epi8(k0, k1);
        const __m128i k23_low = _mm_unpacklo_epi8(k2, k3), k23_high = _mm_unpackhi_epi8(k2, k3);
        auto* dst = reinterpret_cast<__m128i*>(v_out + ((key / 4) * p.dv_padded + d) * 4);
        _mm_storeu_si128(dst + 0, _mm_unpacklo_epi16(k01_low, k23_low));
        _mm_storeu_si128(dst + 1, _mm_unpackhi_epi16(k01_low, k23_low));
        _mm_storeu_si128(dst + 2, _mm_unpacklo_epi16(k01_high, k23_high));
        _mm_storeu_si128(dst + 3, _mm_unpackhi_epi16(k01_high, k23_high));
      }
    }
  }
  for (; key < keys; ++key) {
    for (std::int64_t d = 0; d < p.dv; d += L) {
      const std::int64_t width = std::min<std::int64_t>(L, p.dv - d);
      const B<Arch> inverse = B<Arch>(1.f) / B<Arch>::load_unaligned(v_scale + d);
      alignas(64) std::int8_t bytes[L];
      simd::store_low_bytes<Arch>(
          bytes, round_to_int<Arch>(simd::load_chunk<Arch>(v + key * p.v_strides.seq, d, width) *
                                    inverse));
      // Key j of channel c is byte j % 4 of word [j / 4][c].
      std::int8_t* dst = v_out + ((key / 4) * p.dv_padded + d) * 4 + key % 4;
      for (int i = 0; i < width; ++i) dst[4 * i] = bytes[i];
    }
  }
}

/// Smoothing mean (when `mean` is set) and every block of one (sequence, KV head): the
/// quantizing pass finds the keys the mean pass read in L2 (short sequences) or L3. Every call
/// quantizes all of K and V, in parallel over (sequence, KV head) only: a decode call with one
/// KV head packs on one thread (the backend is for prefill-sized work).
template <class Arch, class T>
void quantize_head(const FlashProblem& p, const Int8Operands& op, std::int64_t seq,
                   std::int64_t kv_head, float* mean) {
  if (mean) key_mean<Arch, T>(p, seq, kv_head, mean);
  const std::int64_t blocks = (sequence_of(p, seq).kv_len + kKvBlock - 1) / kKvBlock;
  const std::int64_t first = op.first_block[seq * p.kv_heads + kv_head];
  for (std::int64_t block = 0; block < blocks; ++block) {
    quantize_block<Arch, T>(p, op, seq, kv_head, block, first + block, mean);
  }
}

}  // namespace

template <class Arch>
void int8_quantize_kv_head(const FlashProblem& p, const Int8Operands& op, std::int64_t seq,
                           std::int64_t kv_head, float* mean) noexcept {
  switch (p.dtype) {
    case DType::bf16:
      return quantize_head<Arch, bf16>(p, op, seq, kv_head, mean);
    case DType::f16:
      return quantize_head<Arch, f16>(p, op, seq, kv_head, mean);
    default:
      return quantize_head<Arch, float>(p, op, seq, kv_head, mean);
  }
}

template <class Arch>
void int8_attention_task(const FlashProblem& p, const Int8Operands& op, const FlashTask& task,
                         float* scratch) noexcept {
  switch (p.dtype) {
    case DType::bf16:
      return Int8Runner<Arch, bf16>(p, op, task, scratch).run();
    case DType::f16:
      return Int8Runner<Arch, f16>(p, op, task, scratch).run();
    default:
      return Int8Runner<Arch, float>(p, op, task, scratch).run();
  }
}

template void int8_quantize_kv_head<KernelArch>(const FlashProblem&, const Int8Operands&,
                                                std::int64_t, std::int64_t, float*) noexcept;
template void int8_attention_task<KernelArch>(const FlashProblem&, const Int8Operands&,
                                              const FlashTask&, float*) noexcept;

}  // namespace ditops::attention
