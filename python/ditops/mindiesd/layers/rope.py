"""MindIE-SD's rotary_position_embedding (see ditops.rotary_position_embedding)."""

from ... import ops
from ..utils.exception import raises_parameters_invalid

rotary_position_embedding = raises_parameters_invalid(ops.rotary_position_embedding)

__all__ = ["rotary_position_embedding"]
