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
// per head instead of per key so no key row sums are needed). On the SSE4.2 and AVX2 levels
// pmaddubsw multiplies |k| (packed per block) by q carrying k's sign (psignb on the cache row):
// exact for any cache byte, q being in [-127, 127]. Elsewhere pairs of int16 through pmaddwd
// give the same int32. S_rope is fp32 on the packed rope.
// PV: int8 dot products, as the int8 attention backend's. V is the block's int8 nope rows
// themselves, interleaved 4 tokens per 32-bit lane once per block; each token's key scale is
// folded into its weight, and the weights of a block are quantized per (head, scale group) to
// u8 levels against the block's largest (within 1/510 of that one; 1/254 on pmaddubsw levels,
// whose int16 pair sums hold 127 x 128 products but not 255 x 128), so vpdpbusd sums 4
// tokens of 4 columns x heads exactly and one factor per (head, group) dequantizes. 6 heads x
// 4 vectors of output in registers; UP (rescale the running output by alpha, add) is the
// epilogue of the same register tile, as PV(b) and UP(b) are adjacent in the merged order.
// The softmax sum stays the fp32 sum of the unquantized weights.
// Measured before (one thread, B=4 kv=2048): fp32 FMAs on values dequantized per block, 11.3
// ms at 128 heads; a bf16 variant was 1.45x slower than that on the Intel Xeon measured, whose
// vdpbf16ps runs at half the FMA rate (AMD Zen 4's runs at twice it).

#include "ops/mla/mla_kernel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/core/arch.hpp"
#include "ops/core/lse_merge.hpp"
#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"
#include "ops/core/simd/int8_dot.hpp"

namespace ditops::mla {
namespace {

template <class Arch>
using F32 = simd::F32<Arch>;
using simd::I32;

using core::kMinusInf;
/// Key bytes as unsigned for vpdpbusd: x ^ 0x80 == x + 128 in two's complement.
constexpr std::uint32_t kSignFlip = 0x80808080u;

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
/// bytes + 128 each for vpdpbusd, 4 |bytes| for pmaddubsw, whose signs QK reads from the cache
/// rows, 2 int16 otherwise) and rope [token][64] in f32.
template <class Arch, class Rope>
void convert_block(const MlaProblem& p, const BlockRows& rows, const MlaWorkspace& ws) noexcept {
  using B = F32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  const auto* rope = static_cast<const Rope*>(rows.rope);
  for (int t = 0; t < rows.tokens; ++t) {
    const std::int8_t* key = rows.nope + t * p.nope_strides[1];
    if constexpr (simd::kHasVpdpbusd<Arch>) {
      using I = simd::I32<Arch>;
      auto* words = reinterpret_cast<std::int32_t*>(ws.key_pack + t * (kNopeDim / 4));
      const I flip(static_cast<std::int32_t>(kSignFlip));
      for (int i = 0; i < kNopeDim / 4; i += static_cast<int>(I::size)) {
        (I::load_unaligned(reinterpret_cast<const std::int32_t*>(key) + i) ^ flip)
            .store_unaligned(words + i);
      }
    } else if constexpr (simd::kHasMaddubs<Arch>) {
      constexpr int kBytes = static_cast<int>(sizeof(typename simd::I32<Arch>::register_type));
      auto* magnitudes = reinterpret_cast<std::int8_t*>(ws.key_pack + t * (kNopeDim / 4));
      for (int i = 0; i < kNopeDim; i += kBytes) {
        simd::I32<Arch> bytes =
            simd::I32<Arch>::load_unaligned(reinterpret_cast<const std::int32_t*>(key + i));
        simd::magnitude_s8<Arch>(bytes).store_unaligned(
            reinterpret_cast<std::int32_t*>(magnitudes + i));
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

// score_tile's phases: each is called once per tile shape, so the compiler inlines it and the
// tile's accumulators stay in registers. [[gnu::always_inline]] changed the inliner's other
// choices in the task instead, and its key conversion loop ran 30 % slower at avx512bw (Zen 4).

/// Stores S_rope of the tile (fp32): the nope groups then add into these scores.
template <class Arch, int kTokens, int kVectors>
inline void rope_scores(const PreparedQueries& q, int hp, int head0, int token0,
                        const MlaWorkspace& ws, float* tile) noexcept {
  using B = F32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  B score[kTokens][kVectors];
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
#pragma GCC unroll 16
  for (int t = 0; t < kTokens; ++t) {
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) score[t][v].store_unaligned(tile + t * hp + v * kLanes);
  }
}

template <class Arch, int kTokens, int kVectors>
using NopeSums = typename I32<Arch>::register_type[kTokens][kVectors];

/// Exact int32 S_nope of group g from key bytes: vpdpbusd's u8 keys times s8 queries less the
/// offset sums, or pmaddubsw's |k| times q carrying k's sign.
template <class Arch, int kTokens, int kVectors>
inline void nope_sums_bytes(const MlaProblem& p, const PreparedQueries& q, int head0, int token0,
                            int g, const BlockRows& rows, const MlaWorkspace& ws,
                            NopeSums<Arch, kTokens, kVectors>& acc) noexcept {
  using I = I32<Arch>;
  using Reg = typename I::register_type;
  constexpr int kLanes = static_cast<int>(F32<Arch>::size);
  const int hp = p.padded_heads;
  constexpr int kWords = kGroupDim / 4;
  for (int word = g * kWords; word < (g + 1) * kWords; ++word) {
    Reg query[kVectors];
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) {
      query[v] = I::load_unaligned(reinterpret_cast<const std::int32_t*>(q.nope_words) + word * hp +
                                   head0 + v * kLanes);
    }
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) {
      const Reg key =
          I(static_cast<std::int32_t>(ws.key_pack[(token0 + t) * (kNopeDim / 4) + word]));
      if constexpr (simd::kHasVpdpbusd<Arch>) {
#pragma GCC unroll 16
        for (int v = 0; v < kVectors; ++v) {
          acc[t][v] = simd::dot_u8s8<Arch>(acc[t][v], key, query[v]);
        }
      } else {  // key holds |k|; k's signs come from the cache row
        const Reg signs = I(load_word(rows.nope + (token0 + t) * p.nope_strides[1] + 4 * word));
#pragma GCC unroll 16
        for (int v = 0; v < kVectors; ++v) {
          acc[t][v] = simd::dot_s8s8<Arch>(acc[t][v], key, signs, query[v]);
        }
      }
    }
  }
  if constexpr (simd::kHasVpdpbusd<Arch>) {
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) {
      const I offset = I::load_unaligned(q.offset_sums + g * hp + head0 + v * kLanes);
#pragma GCC unroll 16
      for (int t = 0; t < kTokens; ++t) acc[t][v] = I(acc[t][v]) - offset;
    }
  }
}

/// Exact int32 S_nope of group g from int16 pairs (pmaddwd), where no byte dot product exists.
template <class Arch, int kTokens, int kVectors>
inline void nope_sums_pairs(const PreparedQueries& q, int hp, int head0, int token0, int g,
                            const MlaWorkspace& ws,
                            NopeSums<Arch, kTokens, kVectors>& acc) noexcept {
  using I = I32<Arch>;
  constexpr int kLanes = static_cast<int>(F32<Arch>::size);
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
      for (int v = 0; v < kVectors; ++v) {
        acc[t][v] = I(acc[t][v]) + simd::madd_int16<Arch>(query[v], key);
      }
    }
  }
}

/// Adds group g's int32 sums, dequantized with q scale * k scale(g), to the tile's scores.
template <class Arch, int kTokens, int kVectors>
inline void add_nope_scores(const MlaProblem& p, const PreparedQueries& q, int head0, int token0,
                            int g, const BlockRows& rows,
                            const NopeSums<Arch, kTokens, kVectors>& acc, float* tile) noexcept {
  using B = F32<Arch>;
  using I = I32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  const int hp = p.padded_heads;
#pragma GCC unroll 16
  for (int t = 0; t < kTokens; ++t) {
    const B key_scale(
        rows.scale[(token0 + t) * p.scale_strides[1] + (p.scale_groups == 1 ? 0 : g)]);
#pragma GCC unroll 16
    for (int v = 0; v < kVectors; ++v) {
      const B factor = B::load_unaligned(q.nope_factor + head0 + v * kLanes) * key_scale;
      float* at = tile + t * hp + v * kLanes;
      simd::fmadd<Arch>(xsimd::to_float(I(acc[t][v])), factor, B::load_unaligned(at))
          .store_unaligned(at);
    }
  }
}

/// Base-2 scores of kTokens tokens x kVectors vectors of heads (heads in lanes: each score
/// row of a token is a few vectors, and the softmax over tokens is vertical).
/// scores: [token][padded_heads]. S_rope is written first; each 128-value group's exact int32
/// S_nope is then dequantized into it (the tile's scores wait in L1 between groups, so the
/// registers hold only the int32 accumulators and one row of query vectors).
template <class Arch, int kTokens, int kVectors>
inline void score_tile(const MlaProblem& p, const PreparedQueries& q, int vector0, int token0,
                       const BlockRows& rows, const MlaWorkspace& ws, float* scores) noexcept {
  using I = I32<Arch>;
  constexpr int kLanes = static_cast<int>(F32<Arch>::size);
  const int hp = p.padded_heads;
  const int head0 = vector0 * kLanes;
  float* tile = scores + token0 * hp + head0;
  rope_scores<Arch, kTokens, kVectors>(q, hp, head0, token0, ws, tile);
  for (int g = 0; g < kScaleGroups; ++g) {
    NopeSums<Arch, kTokens, kVectors> acc;
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) {
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) acc[t][v] = I(0);
    }
    if constexpr (simd::kHasVpdpbusd<Arch> || simd::kHasMaddubs<Arch>) {
      nope_sums_bytes<Arch, kTokens, kVectors>(p, q, head0, token0, g, rows, ws, acc);
    } else {
      nope_sums_pairs<Arch, kTokens, kVectors>(q, hp, head0, token0, g, ws, acc);
    }
    add_nope_scores<Arch, kTokens, kVectors>(p, q, head0, token0, g, rows, acc, tile);
  }
}

/// Register tiles (tokens x head vectors): with VNNI the 32 zmm registers hold a 6 x 4 int32
/// tile plus 4 query vectors and a key (each query vector loaded once per 6 tokens: at 128
/// heads a sequence's queries, 64 KiB, stream from L2, and 3 tokens per load measured 1.3x
/// slower); plain AVX-512 3 x 4; AVX-VNNI (16 ymm) 4 x 2 beside 2 query vectors and a key (at
/// 6 x 2, 15 registers, GCC 12 kept half the accumulators on the stack); pmaddubsw (16
/// registers) 4 x 2 beside 2 query vectors, a key's |k| and k words, a temporary and the ones
/// vector; SSE2's pmaddwd pairs 2 x 2. Single head vectors (16 heads on AVX-512) use more tokens
/// to keep the dpbusd chains independent.
template <class Arch>
constexpr int kWideTokens = simd::kHasBf16Vnni<Arch>                             ? 6
                            : simd::kIsAvx512<Arch>                              ? 3
                            : simd::kHasMaddubs<Arch> || simd::kHasAvxVnni<Arch> ? 4
                                                                                 : 2;
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

/// PV register tile: kPvHeads heads x kPvVectors vectors of output columns. With VNNI 6 x 4
/// int32 accumulators fill 24 of 32 zmm, with AVX-VNNI 6 x 2 15 of 16 ymm beside the 2 value
/// vectors and the level word; pmaddubsw (16 ymm / xmm) 4 x 2 beside the 2 value vectors, the
/// level word, a temporary and the ones vector; the pmaddwd emulation needs two widened copies
/// of each value vector, so fewer.
template <class Arch>
constexpr int kPvHeads = simd::kHasVpdpbusd<Arch>                           ? 6
                         : simd::kIsAvx512<Arch> || simd::kHasMaddubs<Arch> ? 4
                                                                            : 2;
template <class Arch>
constexpr int kPvVectors = simd::kHasBf16Vnni<Arch> ? 4 : 2;

/// The block's nope rows as value words for vpdpbusd, 4 tokens per 32-bit lane:
/// pack[word][column][4] = nope[4 word + 0..3][column]; tokens past the block end are 0.
template <class Arch>
void pack_values(const MlaProblem& p, const BlockRows& rows, std::int8_t* pack) noexcept {
  const int words = (rows.tokens + 3) / 4;
  for (int word = 0; word < words; ++word) {
    const std::int8_t* row[4];
    alignas(16) static constexpr std::int8_t kZeros[kNopeDim] = {};
    for (int k = 0; k < 4; ++k) {
      const int token = 4 * word + k;
      row[k] = token < rows.tokens ? rows.nope + token * p.nope_strides[1] : kZeros;
    }
    // 16 columns of 4 rows to 16 words: two rounds of byte/word unpacking (SSE2, every level).
    for (int column = 0; column < kNopeDim; column += 16) {
      const auto load = [&](int k) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[k] + column));
      };
      const __m128i r0 = load(0), r1 = load(1), r2 = load(2), r3 = load(3);
      const __m128i low01 = _mm_unpacklo_epi8(r0, r1), high01 = _mm_unpackhi_epi8(r0, r1);
      const __m128i low23 = _mm_unpacklo_epi8(r2, r3), high23 = _mm_unpackhi_epi8(r2, r3);
      auto* dst = reinterpret_cast<__m128i*>(pack + (word * kNopeDim + column) * 4);
      _mm_store_si128(dst + 0, _mm_unpacklo_epi16(low01, low23));
      _mm_store_si128(dst + 1, _mm_unpackhi_epi16(low01, low23));
      _mm_store_si128(dst + 2, _mm_unpacklo_epi16(high01, high23));
      _mm_store_si128(dst + 3, _mm_unpackhi_epi16(high01, high23));
    }
  }
}

/// P of one block as u8 levels per (scale group, head): the weight of token t in columns of
/// group g is P[t][h] * key scale(t, g), quantized against the block's largest one:
/// level = round(n * w / max w), w = factor * level with factor = max w / n (0 for an all-zero
/// head), n = simd::kDotU8Max (255, or 127 where pmaddubsw multiplies the levels). levels:
/// [group][word][Hp] words of 4 tokens; factor: [group][Hp]. The group's running softmax sum (UP:
/// alpha * sum + this block's) adds the weights as quantized, factor * level / key scale (a token
/// of scale 0 its weight as is): the output stays a convex combination of the values, where the
/// exact sum would shrink it by the weights that round to 0.
template <class Arch>
void quantize_weights(const MlaProblem& p, const BlockRows& rows, const float* probs,
                      const float* alpha, const MlaWorkspace& ws) noexcept {
  using B = F32<Arch>;
  using I = I32<Arch>;
  constexpr int kLanes = static_cast<int>(B::size);
  const int hp = p.padded_heads;
  const int words = (rows.tokens + 3) / 4;
  const int words_max = p.block_size / 4;
  float inverse_scale[kMaxBlockSize];
  for (int g = 0; g < p.scale_groups; ++g) {
    const auto scale = [&](int t) { return rows.scale[t * p.scale_strides[1] + g]; };
    for (int t = 0; t < rows.tokens; ++t) inverse_scale[t] = scale(t) > 0.f ? 1.f / scale(t) : 0.f;
    for (int head0 = 0; head0 < hp; head0 += kLanes) {
      B top(0.f);
      for (int t = 0; t < rows.tokens; ++t) {
        top = xsimd::max(top, B::load_unaligned(probs + t * hp + head0) * B(scale(t)));
      }
      constexpr float kLevels = simd::kDotU8Max<Arch>;
      const B factor = top * B(1.f / kLevels);
      factor.store_unaligned(ws.level_factor + g * hp + head0);
      const B inverse = xsimd::select(top > B(0.f), B(kLevels) / top, B(0.f));
      B level_sum(0.f);  // sum of level / key scale: the weights PV uses, as softmax terms
      // Tokens whose group scale is 0 (all-zero values) add nothing to P·V but their weight
      // still counts in the softmax sum; level / scale cannot say it, so it is added as is
      // (left out, a block mixing such tokens with others gave outputs up to 10x too large).
      B zero_scale_weight(0.f);
      for (int word = 0; word < words; ++word) {
        I packed(0);
        for (int k = 0; k < 4 && 4 * word + k < rows.tokens; ++k) {
          const int t = 4 * word + k;
          if (scale(t) == 0.f) zero_scale_weight += B::load_unaligned(probs + t * hp + head0);
          const B w = B::load_unaligned(probs + t * hp + head0) * B(scale(t)) * inverse;
          const I level = xsimd::min(xsimd::nearbyint_as_int(w), I(simd::kDotU8Max<Arch>));
          level_sum = simd::fmadd<Arch>(xsimd::to_float(level), B(inverse_scale[t]), level_sum);
          packed = packed | (level << (8 * k));
        }
        packed.store_unaligned(reinterpret_cast<std::int32_t*>(ws.levels) +
                               (g * words_max + word) * hp + head0);
      }
      float* sum = ws.level_sum + g * hp + head0;
      simd::fmadd<Arch>(B::load_unaligned(sum), B::load_unaligned(alpha + head0),
                        simd::fmadd<Arch>(level_sum, factor, zero_scale_weight))
          .store_unaligned(sum);
    }
  }
}

/// kHeads heads x kPvVectors vectors of columns from column0: O = alpha * O + factor * (levels
/// · values), the int32 dot products exact.
template <class Arch, int kHeads>
inline void value_tile(const MlaProblem& p, int head0, int column0, int words, int group,
                       const float* alpha, const MlaWorkspace& ws) noexcept {
  using B = F32<Arch>;
  using I = I32<Arch>;
  using Reg = typename I::register_type;
  constexpr int kLanes = static_cast<int>(B::size);
  constexpr int V = kPvVectors<Arch>;
  const int hp = p.padded_heads;
  const auto* levels = reinterpret_cast<const std::uint8_t*>(
      ws.levels + group * (p.block_size / 4) * hp + head0);  // word w of head h: [w][hp]
  Reg acc[kHeads][V];
  simd::dot_tile<Arch, kHeads, V, simd::RowBytes::u8>(
      levels, 4, hp * 4, ws.value_pack + column0 * 4, kNopeDim * 4, words, acc);
#pragma GCC unroll 8
  for (int h = 0; h < kHeads; ++h) {
    float* out = ws.out_acc + (head0 + h) * kNopeDim + column0;
    const B rescale(alpha[head0 + h]), factor(ws.level_factor[group * hp + head0 + h]);
#pragma GCC unroll 4
    for (int j = 0; j < V; ++j) {
      const B old = B::load_aligned(out + j * kLanes) * rescale;
      simd::fmadd<Arch>(xsimd::to_float(I(acc[h][j])), factor, old).store_aligned(out + j * kLanes);
    }
  }
}

/// PV(b) then UP(b): the block's rows packed as value words and its weights as u8 levels, once
/// for all heads; then int8 dot products per register tile.
template <class Arch>
void pv_up_stage(const MlaProblem& p, const BlockRows& rows, const float* probs, const float* alpha,
                 const MlaWorkspace& ws) noexcept {
  constexpr int kLanes = static_cast<int>(F32<Arch>::size);
  constexpr int kWidth = kPvVectors<Arch> * kLanes;
  static_assert(kGroupDim % kWidth == 0, "a tile never straddles scale groups");
  pack_values<Arch>(p, rows, ws.value_pack);
  quantize_weights<Arch>(p, rows, probs, alpha, ws);
  const int words = (rows.tokens + 3) / 4;
  const int group_width = kNopeDim / p.scale_groups;
  for (int column0 = 0; column0 < kNopeDim; column0 += kWidth) {
    const int group = column0 / group_width;
    int head = 0;
    for (; head + kPvHeads<Arch> <= p.heads; head += kPvHeads<Arch>) {
      value_tile<Arch, kPvHeads<Arch>>(p, head, column0, words, group, alpha, ws);
    }
    for (; head < p.heads; ++head) value_tile<Arch, 1>(p, head, column0, words, group, alpha, ws);
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
void mla_prepare_queries(const QueryInputs& in, const PreparedQueries& out, std::int64_t first_unit,
                         std::int64_t end_unit) noexcept {
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
        values[i] =
            in.nope_bf16
                ? simd::load<Arch>(static_cast<const bf16*>(in.nope) + nope_at + i * kLanes)
                : simd::load<Arch>(static_cast<const float*>(in.nope) + nope_at + i * kLanes);
        top = xsimd::max(top, xsimd::abs(values[i]));
      }
      // The cache format's rule (mla.hpp): scale = max|x| / 127, q = clamp(rne(x / scale)).
      const float scale = simd::reduce_max<Arch>(top) / 127.f;
      factor[b * hp + h] = scale > 0.f ? scale * in.log2_scale : 0.f;
      alignas(64) std::int8_t quantized[kNopeDim];
      for (int i = 0; i < kNopeDim / kLanes; ++i) {
        const I q =
            scale > 0.f
                ? xsimd::max(xsimd::min(xsimd::nearbyint_as_int(values[i] / B(scale)), I(127)),
                             I(-127))
                : I(0);
        simd::store_low_bytes<Arch>(quantized + i * kLanes, q);
      }
      if constexpr (simd::kHasVpdpbusd<Arch> || simd::kHasMaddubs<Arch>) {
        for (int word = 0; word < kNopeDim / 4; ++word) {
          std::memcpy(&words[(b * (kNopeDim / 4) + word) * hp + h], quantized + 4 * word, 4);
        }
      }
      if constexpr (simd::kHasVpdpbusd<Arch>) {
        for (int g = 0; g < kScaleGroups; ++g) {
          I sum(0);
          for (int i = g * kGroupDim; i < (g + 1) * kGroupDim; i += kLanes) {
            if constexpr (simd::kIsAvx512<Arch>) {
              sum += _mm512_cvtepi8_epi32(
                  _mm_load_si128(reinterpret_cast<const __m128i*>(quantized + i)));
            } else {
              sum += _mm256_cvtepi8_epi32(
                  _mm_loadl_epi64(reinterpret_cast<const __m128i*>(quantized + i)));
            }
          }
          offset_sums[(b * kScaleGroups + g) * hp + h] = 128 * simd::reduce_add<Arch>(sum);
        }
      } else if constexpr (!simd::kHasMaddubs<Arch>) {
        for (int word = 0; word < kNopeDim / 2; ++word) {
          const std::uint32_t low = static_cast<std::uint16_t>(quantized[2 * word]);
          const std::uint32_t high = static_cast<std::uint16_t>(quantized[2 * word + 1]);
          pairs[(b * (kNopeDim / 2) + word) * hp + h] = low | high << 16;
        }
      }
      const std::int64_t rope_at = b * in.rope_strides[0] + h * in.rope_strides[1];
      for (int d = 0; d < kRopeDim; d += kLanes) {
        alignas(64) float scaled[kLanes];
        const B x = in.rope_bf16
                        ? simd::load<Arch>(static_cast<const bf16*>(in.rope) + rope_at + d)
                        : simd::load<Arch>(static_cast<const float*>(in.rope) + rope_at + d);
        (x * B(in.log2_scale)).store_aligned(scaled);
        for (int lane = 0; lane < kLanes; ++lane)
          rope[(b * kRopeDim + d + lane) * hp + h] = scaled[lane];
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
    for (int g = 0; g < kScaleGroups; ++g) ws.level_sum[g * p.padded_heads + h] = 0.f;
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
  // The shared schedule's stage order; UP is PV's register-tile epilogue (pv_up_stage), so
  // the UP mirrors have nothing left to do.
  schedule::walk_stages(task.order, task.order_size, std::numeric_limits<std::int64_t>::max(),
                        [&](const schedule::StageInstance& stage) {
                          const int buffer = schedule::buffer_index(stage, p.chunk);
                          float* scores = ws.scores + buffer * slot_floats;
                          float* alpha = ws.alpha + buffer * p.padded_heads;
                          if (stage.stage == schedule::Stage::qk)
                            qk_stage<Arch>(p, q, rows_of(stage.block), ws, scores);
                          if (stage.stage == schedule::Stage::sm)
                            sm_stage<Arch>(p, rows_of(stage.block).tokens, ws, scores, alpha);
                          if (stage.stage == schedule::Stage::pv)
                            pv_up_stage<Arch>(p, rows_of(stage.block), scores, alpha, ws);
                        });
  const int group_width = kNopeDim / p.scale_groups;
  for (int h = 0; h < p.heads; ++h) {
    float* values = ws.out_acc + h * kNopeDim;
    for (int i = 0; i < kNopeDim; i += kLanes) {  // normalize by the group's sum of weights
      // A group whose key scales are all 0 (all-zero latents, as mla_fill_cache stores them)
      // has no weight and only zero values: its output is 0, not 0 / 0 (NaN still propagates).
      const float sum = ws.level_sum[i / group_width * p.padded_heads + h];
      const B inverse_sum(sum == 0.f ? 0.f : 1.f / sum);
      (B::load_aligned(values + i) * inverse_sum).store_aligned(values + i);
    }
    if (task.splits == 1) {
      if (p.out_bf16) {
        write_output<Arch, bf16>(p, task.sequence, h, values, 1.f);
      } else {
        write_output<Arch, float>(p, task.sequence, h, values, 1.f);
      }
    } else {
      float* partial = task.partial_out + h * kNopeDim;
      for (int i = 0; i < kNopeDim; i += kLanes) {
        B::load_aligned(values + i).store_unaligned(partial + i);
      }
      task.partial_lse[h] = ws.row_max[h] + std::log2(ws.row_sum[h]);
    }
  }
}

template <class Arch>
void mla_merge_splits(const MlaProblem& p, int sequence, int splits, const float* partial_out,
                      const float* partial_lse, int head_begin, int head_end) noexcept {
  alignas(64) float merged[kNopeDim];
  for (int h = head_begin; h < head_end; ++h) {
    const core::LseWeights w =
        core::merge_by_lse<Arch>(partial_out + static_cast<std::int64_t>(h) * kNopeDim,
                                 static_cast<std::int64_t>(p.heads) * kNopeDim, partial_lse + h,
                                 p.heads, splits, kNopeDim, merged);
    if (p.out_bf16) {
      write_output<Arch, bf16>(p, sequence, h, merged, 1.f / w.total);
    } else {
      write_output<Arch, float>(p, sequence, h, merged, 1.f / w.total);
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
