"""mindiesd.layers.activation: MindIE-SD's get_activation_layer (ditops.layers)."""

from ...layers import GELU, get_activation_layer

__all__ = ["get_activation_layer", "GELU"]
