#pragma once
// Rotary position embedding.

#include <ditops/tensor.hpp>

namespace ditops {

enum class RotatedMode {
  rotated_half,         ///< rot(x) = cat(-x[D/2:], x[:D/2]); cos/sin laid out cat(f, f)
  rotated_interleaved,  ///< rot(x) = [-x1, x0, -x3, x2, ...]; cos/sin laid out c0,c0,c1,c1,...
};

/// out = x * cos + rot(x) * sin, computed in fp32.
/// x, out: [B,S,N,D] (head_first=false) or [B,N,S,D] (head_first=true); f32, bf16 or f16; D even;
/// leading dims may have any non-negative strides, the last dim must be contiguous.
/// cos, sin: [S,D], or 4-D broadcastable to x; f32 or the dtype of x.
/// out may be x (in place); no other overlap is allowed.
void rotary_position_embedding(const TensorView& x, const TensorView& cos, const TensorView& sin,
                               const TensorView& out, RotatedMode mode = RotatedMode::rotated_half,
                               bool head_first = false);

/// out = rope(rms_norm(x)): the q/k RMSNorm of DiT attention and the rotary embedding after it in
/// one pass over memory, computed in fp32 and rounded once to x's dtype (the unfused pair rounds
/// the normalized values too, so the two differ by at most that one rounding, carried through the
/// rotation). The norm group is given by weight's length: [D] normalizes each head's D values
/// (FLUX's per-head q/k norm); [N * D] normalizes each token's N heads together (Wan's q/k norm
/// over the whole inner dim), which needs head_first = false and each token's heads contiguous
/// (x's and out's head stride == D). weight: f32 or the dtype of x, or empty (no weight; each
/// head is normalized alone). eps: finite, >= 0. x, out, cos, sin, mode, head_first and in-place
/// use exactly as rotary_position_embedding.
void rms_norm_rotary_position_embedding(const TensorView& x, const TensorView& weight, float eps,
                                        const TensorView& cos, const TensorView& sin,
                                        const TensorView& out,
                                        RotatedMode mode = RotatedMode::rotated_half,
                                        bool head_first = false);

}  // namespace ditops
