#pragma once
// RMSNorm and fused residual-add RMSNorm.

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

}  // namespace ditops
