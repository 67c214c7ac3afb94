"""mindiesd.layers.adalayernorm: MindIE-SD's layernorm_scale_shift and fast_layernorm
(ditops.layers)."""

from ...layers import fast_layernorm, layernorm_scale_shift

__all__ = ["layernorm_scale_shift", "fast_layernorm"]
