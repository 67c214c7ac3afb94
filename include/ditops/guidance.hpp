#pragma once
// Classifier-free guidance: the combine that ends a denoising step run on a batch of two
// (the conditional and the unconditional prompt side by side, CFG fusion).

#include <ditops/tensor.hpp>

namespace ditops {

/// out = uncond + scale · (cond - uncond), element by element, computed in fp32.
/// cond, uncond, out: [..., D], the same shape and dtype (f32, bf16 or f16); leading dims may
/// have any strides, the last dim must be contiguous. out may be cond or uncond itself (in
/// place); no other overlap. scale must be finite.
void cfg_combine(const TensorView& cond, const TensorView& uncond, float scale,
                 const TensorView& out);

}  // namespace ditops
