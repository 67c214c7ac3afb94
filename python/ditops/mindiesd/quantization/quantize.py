"""mindiesd.quantization.quantize: MindIE-SD's quantize() (ditops.quantization.quantize)."""

from ...quantization.quantize import quantize

__all__ = ["quantize"]
