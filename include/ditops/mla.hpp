#pragma once
// DeepSeek-style MLA decode over an int8 latent cache, paged through a block table, and
// the helper that fills such a cache.
//
// Cache format per token (FlashMLA's layout with int8 in place of fp8): 512 int8 "nope" values,
// G = 1 or 4 fp32 scales (scale g covers the 512/G consecutive values g*512/G ...; value =
// int8 * scale) and 64 "rope" values kept in f32 or bf16. K is the whole 576-d row, V its 512
// nope values, so each row is read once per decode step for all query heads.

#include <cstdint>
#include <ditops/tensor.hpp>
#include <optional>
#include <span>

namespace ditops {

inline constexpr int kMlaNopeDim = 512;  ///< latent (nope) values per token, also Dv
inline constexpr int kMlaRopeDim = 64;   ///< rope values per token

struct MlaPagedCache {
  TensorView nope;        // i8  [num_blocks, block_size, 512], block_size 64 or 128
  TensorView nope_scale;  // f32 [num_blocks, block_size, G], G = 1 or 4: scale g covers the
                          // 512/G consecutive nope values g*512/G ...; value = int8 * scale
  TensorView rope;        // f32 or bf16 [num_blocks, block_size, 64]
};

struct MlaDecodeOptions {
  std::optional<float> scale;  // default 1/sqrt(576); finite, > 0 and <= 65536
  int chunk = 2;               // 1, 2 or 4: QK blocks run ahead of their PV
  int num_splits = 0;          // KV splits per sequence; 0 = automatic
};

// q_nope: [B,H,512], q_rope: [B,H,64] (f32 or bf16); block_table: i32 [B, max_blocks];
// seq_lens: B entries; token t of sequence b lives in block block_table[b][t / block_size],
// slot t % block_size. out: [B,H,512] f32 or bf16 = softmax(scale*(q_nope·nope + q_rope·rope)) ·
// nope.
//
// Numerics: q_nope is quantized per (sequence, head) to symmetric int8 exactly as the cache is
// (scale = max|q|/127, round to nearest even), and S_nope is the exact int32 dot product times
// both scales; S_rope and the softmax are fp32. P·V is int8, as on the NPU kernel this models:
// per paged block, head and scale group, the weights p_t * scale_t are rounded to u8 levels of
// their maximum / 255 (/ 127 on the SSE4.2 and AVX2 ISA levels, where pmaddubsw multiplies
// them), multiplied with the int8 nope values exactly, and the output is divided
// by the sum of the weights as rounded (so it stays a convex combination of the values; on
// unit-variance latents this adds ~0.2-0.7 % relative L2 error to the fp32-P·V result with
// 255 levels; each weight's rounding error doubles with 127). A sequence with seq_len 0 gives
// zeros, and so does a scale group whose cached values are all zero (scale 0, as mla_fill_cache
// stores an all-zero group).
// Only the first ceil(seq_len / block_size) entries of a block_table row are read (and checked).
// Non-finite inputs propagate within their sequence (README). out must not overlap any input.
void mla_decode_paged(const TensorView& q_nope, const TensorView& q_rope,
                      const MlaPagedCache& cache, const TensorView& block_table,
                      std::span<const std::int32_t> seq_lens, const TensorView& out,
                      const MlaDecodeOptions& options = {});

// Fills cache slots from full-precision latents: latent is [T, 576] f32 or bf16 (512 nope values
// then 64 rope values per token); slots is i32 [T], the flat slot of token i being
// slots[i] = block * block_size + position (each slot at most once). For every token the 512
// nope values are quantized to symmetric int8 per group of 512/G values (G from
// cache.nope_scale.shape[2]): scale = max|x| / 127 (0 for an all-zero group), value =
// clamp(round_to_nearest_even(x / scale), -127, 127); the 64 rope values are stored in the
// cache's rope dtype (bf16 rounded to nearest even). Latent values must be finite (else Error).
// Everything is validated before the first write; slots not named are left untouched.
void mla_fill_cache(const TensorView& latent, const TensorView& slots, const MlaPagedCache& cache);

}  // namespace ditops
