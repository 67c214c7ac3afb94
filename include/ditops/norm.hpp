#pragma once
// RMSNorm, fused residual-add RMSNorm, and LayerNorm with DiT's AdaLN scale and shift.

#include <ditops/tensor.hpp>

namespace ditops {

/// y = x * rsqrt(mean(x^2) + eps) * weight over the last dim, normalized in fp32.
/// x, out: [..., D] (rank >= 1), f32, bf16 or f16, the same shape; leading dims may have any
/// non-negative strides, the last dim must be contiguous. weight: [D] in f32 or the dtype of x,
/// or empty (no weight). out may be x itself (in place); no other overlap is allowed.
void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out);

/// h = x + residual; sum_out = h; out = rms_norm(h) * weight, in one pass over memory.
/// sum_out may alias x or residual; out may alias x or residual but not sum_out.
void add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView& weight,
                  float eps, const TensorView& out, const TensorView& sum_out);

/// y = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim (mean and biased
/// variance of each row), normalized in fp32. x, out: [..., D] (rank >= 1), f32, bf16 or f16, the
/// same shape; leading dims may have any non-negative strides, the last dim must be contiguous.
/// weight, bias: [D] in f32 or the dtype of x, each may be empty (1 and 0). out may be x itself
/// (in place); no other overlap is allowed.
void layer_norm(const TensorView& x, const TensorView& weight, const TensorView& bias, float eps,
                const TensorView& out);

/// AdaLN: y = layer_norm(x, weight, bias, eps) * (1 + scale) + shift, in one pass over memory
/// (one rounding, of y). scale, shift: x's rank, each leading extent x's or 1 (broadcast: [B, 1,
/// D] for x [B, S, D] modulates every token of a batch element alike, [B, S, D] each token), last
/// extent D; both f32 or both the dtype of x. Both empty: layer_norm. Otherwise as layer_norm.
void layer_norm_scale_shift(const TensorView& x, const TensorView& weight, const TensorView& bias,
                            const TensorView& scale, const TensorView& shift, float eps,
                            const TensorView& out);

}  // namespace ditops
