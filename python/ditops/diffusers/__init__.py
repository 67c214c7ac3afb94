"""ditops inside diffusers: `enable(model)` routes every attention of a diffusers transformer
(FLUX, Wan 2.x, CogVideoX, HunyuanVideo, and any model whose processors call diffusers'
attention dispatcher) through ditops, and its q/k RMSNorms and rotary embeddings too;
`disable(model)` restores diffusers' own; `optimize(pipe)` adds the linear layers (FLOAT or W8A8)
and step caching; `is_optimized(model)` tells whether ditops is in effect on a model.

How: ditops registers attention backends in diffusers' dispatcher registry under the names
"ditops" (dense), "ditops_int8" and "ditops_rainfusion" and selects one on the model's
processors (model.set_attention_backend). CogVideoX's processors call torch's SDPA directly, so
they are replaced by one that calls the dispatcher. The q/k RMSNorm modules become ditops
RMSNorms over the same weights. diffusers' `apply_rotary_emb` (FLUX, HunyuanVideo, CogVideoX) is
replaced, while any model is enabled, by the same math on ditops' kernel (falling back to
diffusers' own for the forms the kernel does not take); Wan's self-attention processor, whose
rotary embedding is local to it, is replaced by one that applies it on ditops. In Wan's
self-attention and FLUX's attention, whose q/k RMSNorms come right before the rotary embedding,
both run as one fused ditops pass (rms_norm_rotary_position_embedding).

The package by concern: _internals (the one module that imports diffusers, and the private
names it uses), backends (the dispatcher's backends), models (one adapter per model family,
found by class), norms (q/k norms and the rotary embedding), enabling (enable, disable and the
state they keep), cache (step caching), optimize (the one call)."""

from ..quant import KEEP_FLOAT
from ._internals import SUPPORTED_DIFFUSERS, check_diffusers_version
from .enabling import disable, enable, enable_parallelism, enabled, is_optimized
from .optimize import OptimizeReport, optimize

__all__ = ["enable", "disable", "enabled", "enable_parallelism", "is_optimized", "optimize",
           "OptimizeReport", "KEEP_FLOAT", "check_diffusers_version", "SUPPORTED_DIFFUSERS"]
