"""MindIE-SD's attention_forward_varlen (see ditops.attention_forward_varlen), raising
ParametersInvalid."""

from .... import ops
from ...utils.exception import raises_parameters_invalid

attention_forward_varlen = raises_parameters_invalid(ops.attention_forward_varlen)

__all__ = ["attention_forward_varlen"]
