"""MindIE-SD's attention_forward (see ditops.attention_forward), raising ParametersInvalid."""

from .... import ops
from ...utils.exception import raises_parameters_invalid

attention_forward = raises_parameters_invalid(ops.attention_forward)

__all__ = ["attention_forward"]
