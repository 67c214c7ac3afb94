"""MindIE-SD's fused_moe (mixture-of-experts over NPU expert parallelism): not provided."""

from .._unsupported import refusing

fused_moe = refusing("fused_moe", "the fused mixture-of-experts layer")

__all__ = ["fused_moe"]
