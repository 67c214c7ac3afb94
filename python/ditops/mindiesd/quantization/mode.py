"""mindiesd.quantization.mode: MindIE-SD's QuantAlgorithm (ditops.quantization.mode)."""

from ...quantization.mode import QuantAlgorithm

__all__ = ["QuantAlgorithm"]
