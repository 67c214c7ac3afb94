"""mindiesd.layers.norm: MindIE-SD's RMSNorm module and fast_layernorm (ditops.layers)."""

from ...layers import RMSNorm, fast_layernorm

__all__ = ["RMSNorm", "fast_layernorm"]
