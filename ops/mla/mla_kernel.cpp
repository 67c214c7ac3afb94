// MLA paged decode kernel, compiled once per ISA level (cmake/DitopsKernels.cmake).
//
// One task = one sequence's range of paged blocks; all H query heads go through each block
// together, so every latent row is read from memory once per step (lesson 9, IPEX/FlashMLA).
// Stages per block follow the shared QK-SM-PV-UP schedule (ops/schedule): the cube order is
// walked and every run of cube stages is followed by its vector mirror, so with chunk = 2 the
// kernel computes S for blocks b, b+1 (QK), softmaxes both (SM), then PV+UP of b and of b+1.
// S/P live in 2 * chunk per-thread slots (the schedule's ping-pong slot and sub-position).
//
// QK: keys are packed once per block lane-per-token (lesson 3: no horizontal sums) and each
// key vector is reused by 8 heads. S_nope is exact integer arithmetic: with AVX512-VNNI one
// vpdpbusd multiplies 4 key bytes by 4 query bytes; keys go in as unsigned (k + 128, a flip of
// the sign bit) and 128 * sum(q) per group is subtracted (oneDNN's s8s8 compensation, here
// per head instead of per key so no key row sums are needed). Without VNNI, pairs of int16
// through pmaddwd give the same int32. S_rope is fp32 on the packed rope.
// PV: fp32 FMAs on value columns dequantized once per block (shared by all heads), 4 heads x
// 4 vectors of output in registers; UP (rescale the running output by alpha, add) is the
// epilogue of the same register tile, as PV(b) and UP(b) are adjacent in the merged order.
// Why fp32 P·V: a bf16 variant (exact int8 V as bf16, P * key scale rounded to bf16, two
// tokens per vdpbf16ps) was measured on this machine's AVX512-BF16 Xeon at 1.45x *slower* at
// 128 heads (B=4 kv=2048, 1 thread: 17.5-20.0 ms vs 12.0-12.9 ms CPU time) and adds 2^-9
// relative error per weight; fp32 FMAs issue on two ports, vdpbf16ps apparently not. int8 P
// (u8 with a fixed 1/255 scale) would lose small weights outright and was not pursued.

#include "ops/mla/mla_kernel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/core/arch.hpp"
#include "ops/core/simd.hpp"

namespace ditops::mla {
namespace {

template <class Arch>
using F32 = simd::F32<Arch>;
using simd::I32;

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
/// Key bytes as unsigned for vpdpbusd: x ^ 0x80 == x + 128 in two's complement.
constexpr std::uint32_t kSignFlip = 0x80808080u;

/// PV register tile: 4 heads x 4 vectors of output columns (16 accumulators).
constexpr int kValueTileHeads = 4;
constexpr int kValueTileVectors = 4;

/// F32<Arch>::size int8 values as floats.
template <class Arch>
inline F32<Arch> load_int8(const std::int8_t* src) noexcept {
  if constexpr (simd::kIsAvx512<Arch>) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
  } else if constexpr (simd::kIsAvx2<Arch>) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  } else {
    std::int32_t word;
    std::memcpy(&word, src, sizeof word);
    // SSE2 has no sign-extending byte load: place each byte in the top of a 32-bit lane and
    // shift it back down arithmetically.
    __m128i lanes = _mm_cvtsi32_si128(word);
    lanes = _mm_unpacklo_epi8(lanes, lanes);
    lanes = _mm_unpacklo_epi16(lanes, lanes);
    return _mm_cvtepi32_ps(_mm_srai_epi32(lanes, 24));
  }
}

/// The 4 bytes at `src` as one int32 (a broadcastable pair of int16 or quad of int8).
template <class T>
inline std::int32_t load_word(const T* src) noexcept {
  std::int32_t word;
  std::memcpy(&word, src, sizeof word);
  return word;
}

template <class Rope>
inline float rope_value(const Rope* row, int d) noexcept {
  return simd::scalar_to_float(row[d]);
}

/// Everything one block's QK needs about where its rows live.
struct BlockRows {
  const std::int8_t* nope;
  const float* scale;
  const void* rope;
  int tokens;  ///< valid rows (<= block_size)
};

inline BlockRows block_rows(const MlaProblem& p, std::int32_t block_id, int tokens) noexcept {
  const std::int64_t block = block_id;
  const void* rope =
      p.rope_bf16
          ? static_cast<const void*>(static_cast<const bf16*>(p.rope) + block * p.rope_strides[0])
          : static_cast<const void*>(static_cast<const float*>(p.rope) + block * p.rope_strides[0]);
  return {p.nope + block * p.nope_strides[0], p.nope_scale + block * p.scale_strides[0], rope,
          tokens};
}

/// Converts one block's rows for QK, row by row (no transpose): key words [token][word] (4
/// bytes + 128 each for VNNI, 2 int16 otherwise) and rope [token][64] in f32.
template <class Arch, class Rope>
void convert_block(const MlaProblem& p, const BlockRows& rows, const MlaWorkspace& ws) noexcept {
  using B = F32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  const auto* rope = static_cast<const Rope*>(rows.rope);
  for (int t = 0; t < rows.tokens; ++t) {
    const std::int8_t* key = rows.nope + t * p.nope_strides[1];
    if constexpr (simd::kHasBf16Vnni<Arch>) {
      std::uint32_t* words = ws.key_pack + t * (kNopeDim / 4);
      const __m512i flip = _mm512_set1_epi32(static_cast<int>(kSignFlip));
      for (int i = 0; i < kNopeDim; i += 64) {
        const __m512i bytes = _mm512_loadu_si512(key + i);
        _mm512_storeu_si512(words + i / 4, _mm512_xor_si512(bytes, flip));
      }
    } else {
      auto* pairs = reinterpret_cast<std::int16_t*>(ws.key_pack + t * (kNopeDim / 2));
      for (int i = 0; i < kNopeDim; ++i) pairs[i] = key[i];
    }
    const Rope* rope_row = rope + t * p.rope_strides[1];
    for (int d = 0; d < kRopeDim; d += kLanes) {
      simd::load<Arch>(rope_row + d).store_aligned(ws.rope_pack + t * kRopeDim + d);
    }
  }
}

/// Base-2 scores of kTokens tokens x kVectors vectors of heads (heads in lanes: each score
/// row of a token is a few vectors, and the softmax over tokens is vertical).
/// scores: [token][padded_heads].
template <class Arch, int kTokens, int kVectors>
inline void score_tile(const MlaProblem& p, const PreparedQueries& q, int vector0, int token0,
                       const BlockRows& rows, const MlaWorkspace& ws, float* scores) noexcept {
  using B = F32<Arch>;
  using I = I32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  const int hp = p.padded_heads;
  const int head0 = vector0 * kLanes;
  B score[kTokens][kVectors];
  // S_rope in fp32.
#pragma GCC unroll 16
  for (int t = 0; t < kTokens; ++t) {
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) score[t][v] = B(0.f);
  }
  for (int d = 0; d < kRopeDim; ++d) {
    B query[kVectors];
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) {
      query[v] = B::load_unaligned(q.rope + d * hp + head0 + v * kLanes);
    }
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) {
      const B key(ws.rope_pack[(token0 + t) * kRopeDim + d]);
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v)
        score[t][v] = simd::fmadd<Arch>(query[v], key, score[t][v]);
    }
  }
  // S_nope: exact int32 per 128-value group, dequantized with q scale * k scale(group).
  for (int g = 0; g < kScaleGroups; ++g) {
    I acc[kTokens][kVectors];
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) {
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) acc[t][v] = I(0);
    }
    if constexpr (simd::kHasBf16Vnni<Arch>) {
      constexpr int kWords = kGroupDim / 4;
      for (int word = g * kWords; word < (g + 1) * kWords; ++word) {
        __m512i query[kVectors];
#pragma GCC unroll 16
        for (int v = 0; v < kVectors; ++v) {
          query[v] = _mm512_loadu_si512(q.nope_words + word * hp + head0 + v * kLanes);
        }
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) {
          const __m512i key = _mm512_set1_epi32(
              static_cast<int>(ws.key_pack[(token0 + t) * (kNopeDim / 4) + word]));
#pragma GCC unroll 16
          for (int v = 0; v < kVectors; ++v) {
            acc[t][v] = simd::dot_u8s8<Arch>(acc[t][v], key, query[v]);
          }
        }
      }
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) {
        const I offset = I::load_unaligned(q.offset_sums + g * hp + head0 + v * kLanes);
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) acc[t][v] -= offset;
      }
    } else {
      constexpr int kWords = kGroupDim / 2;
      for (int word = g * kWords; word < (g + 1) * kWords; ++word) {
        I query[kVectors];
#pragma GCC unroll 16
        for (int v = 0; v < kVectors; ++v) {
          query[v] = I::load_unaligned(
              reinterpret_cast<const std::int32_t*>(q.nope_pairs + word * hp + head0 + v * kLanes));
        }
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) {
          const I key(static_cast<std::int32_t>(ws.key_pack[(token0 + t) * (kNopeDim / 2) + word]));
#pragma GCC unroll 16
          for (int v = 0; v < kVectors; ++v) acc[t][v] += simd::madd_int16<Arch>(query[v], key);
        }
      }
    }
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) {
      const B key_scale(
          rows.scale[(token0 + t) * p.scale_strides[1] + (p.scale_groups == 1 ? 0 : g)]);
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) {
        const B factor = B::load_unaligned(q.nope_factor + head0 + v * kLanes) * key_scale;
        score[t][v] = simd::fmadd<Arch>(xsimd::to_float(acc[t][v]), factor, score[t][v]);
      }
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < kTokens; ++t) {
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) {
      score[t][v].store_unaligned(scores + (token0 + t) * hp + head0 + v * kLanes);
    }
  }
}

/// Register tiles (tokens x head vectors): the 32 zmm registers hold 3 x 4 score and int32
/// tiles plus 4 query vectors; AVX2/SSE (16 registers) a 2 x 2 tile. Single head vectors
/// (16 heads on AVX-512) use more tokens to keep the dpbusd chains independent.
template <class Arch>
constexpr int kWideTokens = simd::kIsAvx512<Arch> ? 3 : 2;
template <class Arch>
constexpr int kWideVectors = simd::kIsAvx512<Arch> ? 4 : 2;
template <class Arch>
constexpr int kNarrowTokens = simd::kIsAvx512<Arch> ? 8 : 4;

template <class Arch, int kVectors, int kTokens>
inline void score_tokens(const MlaProblem& p, const PreparedQueries& q, int vector0,
                         const BlockRows& rows, const MlaWorkspace& ws, float* scores) noexcept {
  int token = 0;
  for (; token + kTokens <= rows.tokens; token += kTokens) {
    score_tile<Arch, kTokens, kVectors>(p, q, vector0, token, rows, ws, scores);
  }
  for (; token < rows.tokens; ++token) {
    score_tile<Arch, 1, kVectors>(p, q, vector0, token, rows, ws, scores);
  }
}

/// QK(b): S of every head for one block into `scores` ([block_size][padded_heads]).
template <class Arch>
void qk_stage(const MlaProblem& p, const PreparedQueries& q, const BlockRows& rows,
              const MlaWorkspace& ws, float* scores) noexcept {
  constexpr int kLanes = static_cast<int>(F32<Arch>::size);
  if (p.rope_bf16) {
    convert_block<Arch, bf16>(p, rows, ws);
  } else {
    convert_block<Arch, float>(p, rows, ws);
  }
  const int vectors = p.padded_heads / kLanes;
  int vector = 0;
  for (; vector + kWideVectors<Arch> <= vectors; vector += kWideVectors<Arch>) {
    score_tokens<Arch, kWideVectors<Arch>, kWideTokens<Arch>>(p, q, vector, rows, ws, scores);
  }
  for (; vector < vectors; ++vector) {
    score_tokens<Arch, 1, kNarrowTokens<Arch>>(p, q, vector, rows, ws, scores);
  }
}

/// SM(b): online softmax per head over the block's tokens, P = exp2(S - m_new) in place.
/// Heads are lanes, so max and sum over tokens are vertical (no horizontal reductions).
template <class Arch>
void sm_stage(const MlaProblem& p, int tokens, const MlaWorkspace& ws, float* scores,
              float* alpha) noexcept {
  using B = F32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  const int hp = p.padded_heads;
  for (int head0 = 0; head0 < hp; head0 += kLanes) {
    const B old_max = B::load_aligned(ws.row_max + head0);
    B new_max = old_max;
    for (int t = 0; t < tokens; ++t) {
      new_max = xsimd::max(new_max, B::load_unaligned(scores + t * hp + head0));
    }
    B sum(0.f);
    for (int t = 0; t < tokens; ++t) {
      const B prob =
          simd::exp2_nonpositive<Arch>(B::load_unaligned(scores + t * hp + head0) - new_max);
      prob.store_unaligned(scores + t * hp + head0);
      sum += prob;
    }
    const B rescale = simd::exp2_nonpositive<Arch>(old_max - new_max);  // 0 while old = -inf
    rescale.store_unaligned(alpha + head0);
    simd::fmadd<Arch>(B::load_aligned(ws.row_sum + head0), rescale, sum)
        .store_aligned(ws.row_sum + head0);
    new_max.store_aligned(ws.row_max + head0);
  }
}

/// kHeads heads x kValueTileVectors vectors of columns: O = alpha * O + P · V over the block.
template <class Arch, int kHeads>
inline void value_tile(const MlaProblem& p, int head0, int column0, int tokens, const float* probs,
                       const float* alpha, const MlaWorkspace& ws) noexcept {
  using B = F32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  constexpr int kWidth = kValueTileVectors * kLanes;
  B acc[kHeads][kValueTileVectors];
#pragma GCC unroll 16
  for (int h = 0; h < kHeads; ++h) {
#pragma GCC unroll 16
    for (int j = 0; j < kValueTileVectors; ++j) acc[h][j] = B(0.f);
  }
  for (int t = 0; t < tokens; ++t) {
    B value[kValueTileVectors];
#pragma GCC unroll 16
    for (int j = 0; j < kValueTileVectors; ++j) {
      value[j] = B::load_aligned(ws.value_tile + t * kWidth + j * kLanes);
    }
#pragma GCC unroll 16
    for (int h = 0; h < kHeads; ++h) {
      const B prob(probs[t * p.padded_heads + head0 + h]);
#pragma GCC unroll 16
      for (int j = 0; j < kValueTileVectors; ++j) {
        acc[h][j] = simd::fmadd<Arch>(prob, value[j], acc[h][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int h = 0; h < kHeads; ++h) {
    float* out = ws.out_acc + (head0 + h) * kNopeDim + column0;
    const B rescale(alpha[head0 + h]);
#pragma GCC unroll 16
    for (int j = 0; j < kValueTileVectors; ++j) {
      const B old = B::load_aligned(out + j * kLanes);
      simd::fmadd<Arch>(old, rescale, acc[h][j]).store_aligned(out + j * kLanes);
    }
  }
}

/// PV(b) then UP(b): the block's value columns, dequantized once for all heads.
template <class Arch>
void pv_up_stage(const MlaProblem& p, const BlockRows& rows, const float* probs, const float* alpha,
                 const MlaWorkspace& ws) noexcept {
  using B = F32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  constexpr int kWidth = kValueTileVectors * kLanes;
  const int group_width = kNopeDim / p.scale_groups;
  for (int column0 = 0; column0 < kNopeDim; column0 += kWidth) {
    const int group = column0 / group_width;  // a tile never straddles groups (128 % kWidth == 0)
    for (int t = 0; t < rows.tokens; ++t) {
      const std::int8_t* key = rows.nope + t * p.nope_strides[1] + column0;
      const B scale(rows.scale[t * p.scale_strides[1] + group]);
#pragma GCC unroll 16
      for (int j = 0; j < kValueTileVectors; ++j) {
        (load_int8<Arch>(key + j * kLanes) * scale)
            .store_aligned(ws.value_tile + t * kWidth + j * kLanes);
      }
    }
    int head = 0;
    for (; head + kValueTileHeads <= p.heads; head += kValueTileHeads) {
      value_tile<Arch, kValueTileHeads>(p, head, column0, rows.tokens, probs, alpha, ws);
    }
    for (; head < p.heads; ++head) {
      value_tile<Arch, 1>(p, head, column0, rows.tokens, probs, alpha, ws);
    }
  }
}

template <class Arch, class Out>
void write_output(const MlaProblem& p, int sequence, int head, const float* values,
                  float factor) noexcept {
  using B = F32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  Out* out = static_cast<Out*>(p.out) + sequence * p.out_strides[0] + head * p.out_strides[1];
  const B scale(factor);
  for (int i = 0; i < kNopeDim; i += kLanes) {
    simd::store<Arch>(out + i, B::load_unaligned(values + i) * scale);
  }
}

}  // namespace

template <class Arch>
void mla_prepare_queries(const QueryInputs& in, const PreparedQueries& out,
                         std::int64_t first_unit, std::int64_t end_unit) noexcept {
  using B = F32<Arch>;
  using I = I32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  const std::int64_t hp = in.padded_heads;
  const std::int64_t units_per_sequence = hp / kHeadPadding;
  auto* words = const_cast<std::uint32_t*>(out.nope_words);
  auto* pairs = const_cast<std::uint32_t*>(out.nope_pairs);
  auto* offset_sums = const_cast<std::int32_t*>(out.offset_sums);
  auto* factor = const_cast<float*>(out.nope_factor);
  auto* rope = const_cast<float*>(out.rope);
  for (std::int64_t unit = first_unit; unit < end_unit; ++unit) {
    const std::int64_t b = unit / units_per_sequence;
    const std::int64_t first_head = unit % units_per_sequence * kHeadPadding;
    const std::int64_t end_head = std::min<std::int64_t>(first_head + kHeadPadding, in.heads);
    for (std::int64_t h = first_head; h < end_head; ++h) {
      B values[kNopeDim / kLanes];
      const std::int64_t nope_at = b * in.nope_strides[0] + h * in.nope_strides[1];
      B top(0.f);
      for (int i = 0; i < kNopeDim / kLanes; ++i) {
        values[i] = in.nope_bf16 ? simd::load<Arch>(static_cast<const bf16*>(in.nope) + nope_at + i * kLanes)
                                 : simd::load<Arch>(static_cast<const float*>(in.nope) + nope_at + i * kLanes);
        top = xsimd::max(top, xsimd::abs(values[i]));
      }
      // The cache format's rule (mla.hpp): scale = max|x| / 127, q = clamp(rne(x / scale)).
      const float scale = simd::reduce_max<Arch>(top) / 127.f;
      factor[b * hp + h] = scale > 0.f ? scale * in.log2_scale : 0.f;
      alignas(64) std::int8_t quantized[kNopeDim];
      for (int i = 0; i < kNopeDim / kLanes; ++i) {
        const I q = scale > 0.f ? xsimd::max(xsimd::min(xsimd::nearbyint_as_int(values[i] / B(scale)),
                                                        I(127)),
                                             I(-127))
                                : I(0);
        simd::store_low_bytes<Arch>(quantized + i * kLanes, q);
      }
      if constexpr (simd::kHasBf16Vnni<Arch>) {
        for (int word = 0; word < kNopeDim / 4; ++word) {
          std::memcpy(&words[(b * (kNopeDim / 4) + word) * hp + h], quantized + 4 * word, 4);
        }
        for (int g = 0; g < kScaleGroups; ++g) {
          I sum(0);
          for (int i = g * kGroupDim; i < (g + 1) * kGroupDim; i += kLanes) {
            sum += _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(quantized + i)));
          }
          offset_sums[(b * kScaleGroups + g) * hp + h] = 128 * simd::reduce_add<Arch>(sum);
        }
      } else {
        for (int word = 0; word < kNopeDim / 2; ++word) {
          const std::uint32_t low = static_cast<std::uint16_t>(quantized[2 * word]);
          const std::uint32_t high = static_cast<std::uint16_t>(quantized[2 * word + 1]);
          pairs[(b * (kNopeDim / 2) + word) * hp + h] = low | high << 16;
        }
      }
      const std::int64_t rope_at = b * in.rope_strides[0] + h * in.rope_strides[1];
      for (int d = 0; d < kRopeDim; d += kLanes) {
        alignas(64) float scaled[kLanes];
        const B x = in.rope_bf16 ? simd::load<Arch>(static_cast<const bf16*>(in.rope) + rope_at + d)
                                 : simd::load<Arch>(static_cast<const float*>(in.rope) + rope_at + d);
        (x * B(in.log2_scale)).store_aligned(scaled);
        for (int lane = 0; lane < kLanes; ++lane) rope[(b * kRopeDim + d + lane) * hp + h] = scaled[lane];
      }
    }
  }
}

template <class Arch>
void mla_decode_task(const MlaProblem& p, const MlaTask& task, const MlaWorkspace& ws) noexcept {
  using B = F32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  const PreparedQueries& all = p.queries;
  const std::int64_t sequence = task.sequence;
  const std::int64_t hp = p.padded_heads;
  const PreparedQueries q{all.nope_words + sequence * hp * (kNopeDim / 4),
                          all.nope_pairs + sequence * hp * (kNopeDim / 2),
                          all.offset_sums + sequence * hp * kScaleGroups,
                          all.nope_factor + sequence * hp, all.rope + sequence * hp * kRopeDim};
  for (int h = 0; h < p.padded_heads; ++h) {
    ws.row_max[h] = kMinusInf;
    ws.row_sum[h] = 0.f;
  }
  for (int h = 0; h < p.heads; ++h) {
    for (int i = 0; i < kNopeDim; i += kLanes) B(0.f).store_aligned(ws.out_acc + h * kNopeDim + i);
  }
  const std::int64_t slot_floats = static_cast<std::int64_t>(p.padded_heads) * p.block_size;
  auto rows_of = [&](int block) {
    const std::int64_t first = task.first_token + static_cast<std::int64_t>(block) * p.block_size;
    const int tokens =
        static_cast<int>(std::min<std::int64_t>(p.block_size, task.end_token - first));
    return block_rows(p, task.block_ids[block], tokens);
  };
  // Walk the cube order; after each run of equal cube stages, run their vector mirrors.
  const schedule::StageInstance* order = task.order;
  int run_begin = 0;
  while (run_begin < task.order_size) {
    int run_end = run_begin + 1;
    while (run_end < task.order_size && order[run_end].stage == order[run_begin].stage) ++run_end;
    const bool is_qk = order[run_begin].stage == schedule::Stage::qk;
    for (int i = run_begin; i < run_end; ++i) {  // cube: QK or PV (+ UP, fused)
      const schedule::StageInstance& stage = order[i];
      const int buffer = stage.slot * p.chunk + stage.sub;
      float* scores = ws.scores + buffer * slot_floats;
      float* alpha = ws.alpha + buffer * p.padded_heads;
      if (is_qk) {
        qk_stage<Arch>(p, q, rows_of(stage.block), ws, scores);
      } else {
        pv_up_stage<Arch>(p, rows_of(stage.block), scores, alpha, ws);
      }
    }
    if (is_qk) {
      for (int i = run_begin; i < run_end; ++i) {  // vector: SM of the run's blocks
        const schedule::StageInstance& stage = order[i];
        const int buffer = stage.slot * p.chunk + stage.sub;
        sm_stage<Arch>(p, rows_of(stage.block).tokens, ws, ws.scores + buffer * slot_floats,
                       ws.alpha + buffer * p.padded_heads);
      }
    }
    run_begin = run_end;
  }
  for (int h = 0; h < p.heads; ++h) {
    const float* values = ws.out_acc + h * kNopeDim;
    const float inverse_sum = 1.f / ws.row_sum[h];
    if (task.splits == 1) {
      if (p.out_bf16) {
        write_output<Arch, bf16>(p, task.sequence, h, values, inverse_sum);
      } else {
        write_output<Arch, float>(p, task.sequence, h, values, inverse_sum);
      }
    } else {
      float* partial = task.partial_out + h * kNopeDim;
      for (int i = 0; i < kNopeDim; i += kLanes) {
        (B::load_aligned(values + i) * B(inverse_sum)).store_unaligned(partial + i);
      }
      task.partial_lse[h] = ws.row_max[h] + std::log2(ws.row_sum[h]);
    }
  }
}

template <class Arch>
void mla_merge_splits(const MlaProblem& p, int sequence, int splits, const float* partial_out,
                      const float* partial_lse, int head_begin, int head_end) noexcept {
  using B = F32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  alignas(64) float merged[kNopeDim];
  for (int h = head_begin; h < head_end; ++h) {
    float max_lse = kMinusInf;
    for (int s = 0; s < splits; ++s) max_lse = std::max(max_lse, partial_lse[s * p.heads + h]);
    float total_weight = 0.f;
    for (int i = 0; i < kNopeDim; i += kLanes) B(0.f).store_aligned(merged + i);
    for (int s = 0; s < splits; ++s) {
      const float weight = std::exp2(partial_lse[s * p.heads + h] - max_lse);
      total_weight += weight;
      const float* part = partial_out + (static_cast<std::int64_t>(s) * p.heads + h) * kNopeDim;
      for (int i = 0; i < kNopeDim; i += kLanes) {
        simd::fmadd<Arch>(B(weight), B::load_unaligned(part + i), B::load_aligned(merged + i))
            .store_aligned(merged + i);
      }
    }
    if (p.out_bf16) {
      write_output<Arch, bf16>(p, sequence, h, merged, 1.f / total_weight);
    } else {
      write_output<Arch, float>(p, sequence, h, merged, 1.f / total_weight);
    }
  }
}

template void mla_prepare_queries<KernelArch>(const QueryInputs&, const PreparedQueries&,
                                              std::int64_t, std::int64_t) noexcept;
template void mla_decode_task<KernelArch>(const MlaProblem&, const MlaTask&,
                                          const MlaWorkspace&) noexcept;
template void mla_merge_splits<KernelArch>(const MlaProblem&, int, int, const float*, const float*,
                                           int, int) noexcept;

}  // namespace ditops::mla
