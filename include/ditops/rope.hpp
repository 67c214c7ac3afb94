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

}  // namespace ditops
