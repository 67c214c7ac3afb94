"""mindiesd.quantization.utils: MindIE-SD's TimestepManager (ditops.quantization.utils)."""

from ...quantization.utils import TimestepManager, match_layer_pattern

__all__ = ["TimestepManager", "match_layer_pattern"]
