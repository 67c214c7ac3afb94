"""MindIE-SD's NPU-only custom operators: frequency_regulator sets the NPU's clock, which has
no meaning on a CPU."""

from .._unsupported import refusing

frequency_regulator = refusing("frequency_regulator", "setting the NPU's frequency")

__all__ = ["frequency_regulator"]
