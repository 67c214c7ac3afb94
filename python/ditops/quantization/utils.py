"""MindIE-SD's TimestepManager (the current denoising step that timestep-aware layers read) and
the layer-name patterns of OnlineQuantConfig."""

import contextvars
import fnmatch
from typing import Optional

from .. import quant
from ..errors import ParametersInvalid


class TimestepManager:
    """The current denoising step and the largest step the loaded W8A8_TIMESTEP layers have
    parameters for. The values are context variables, as in MindIE-SD (a new thread starts
    with none set); set_timestep_idx also moves the step of every model ditops' quantize()
    converted, which their W8A8_TIMESTEP layers read (ditops.set_timestep moves one model)."""

    _timestep_var = contextvars.ContextVar("timestep_idx", default=None)
    _timestep_var_max = contextvars.ContextVar("timestep_idx_max", default=None)

    @classmethod
    def set_timestep_idx(cls, cur_timestep: int) -> None:
        """Sets the current step (an int >= 0, at most get_timestep_idx_max() when that is
        set; None: no step, every timestep layer dynamic). ParametersInvalid otherwise."""
        if cur_timestep is not None and not isinstance(cur_timestep, int):
            raise ParametersInvalid(f"cur_timestep must be the type of int, but currently got "
                                    f"{type(cur_timestep)}.")
        if cur_timestep is not None and cur_timestep < 0:
            # MindIE-SD would index its per-step parameters from the end; ditops refuses.
            raise ParametersInvalid(f"cur_timestep must be >= 0, got {cur_timestep}.")
        largest = cls._timestep_var_max.get()
        if cur_timestep is not None and largest is not None and cur_timestep > largest:
            raise ParametersInvalid(f"cur_timestep {cur_timestep} is past the max timestep set "
                                    f"in quant weight: {largest}.")
        cls._timestep_var.set(cur_timestep)
        quant.set_every_timestep(cur_timestep)

    @classmethod
    def get_timestep_idx(cls) -> Optional[int]:
        """The current step, or None if none was set."""
        return cls._timestep_var.get()

    @classmethod
    def set_timestep_idx_max(cls, t_idx: int) -> None:
        """Sets the largest step set_timestep_idx accepts (None: no limit); quantize() sets it
        to the step count of the W8A8_TIMESTEP layers it loads."""
        if t_idx is not None and not isinstance(t_idx, int):
            raise ParametersInvalid(f"t_idx must be the type of int, but currently got "
                                    f"{type(t_idx)}.")
        cls._timestep_var_max.set(t_idx)

    @classmethod
    def get_timestep_idx_max(cls) -> Optional[int]:
        """The largest step set_timestep_idx accepts, or None if none was set."""
        return cls._timestep_var_max.get()


def _expand_braces(pattern):
    """The patterns `pattern` stands for with each {a,b,...} group replaced by one of its
    items: "blocks.{0,1}.ff" -> ["blocks.0.ff", "blocks.1.ff"]."""
    start = pattern.find("{")
    end = pattern.find("}", start + 1)
    if start < 0 or end < 0:
        return [pattern]
    tails = _expand_braces(pattern[end + 1:])
    return [pattern[:start] + item + tail
            for item in pattern[start + 1:end].split(",") for tail in tails]


def match_layer_pattern(layer_name, pattern):
    """Whether `layer_name` is `pattern` or matches it as a case-sensitive shell pattern
    (*, ?, [...], and {a,b} alternatives)."""
    return layer_name == pattern or any(
        fnmatch.fnmatchcase(layer_name, expanded) for expanded in _expand_braces(pattern))


def match_layer_config(layer_name, layer_config):
    """The value of `layer_config` (pattern -> value) for `layer_name`: its own entry if it has
    one, else the first pattern it matches, else None."""
    if not layer_config:
        return None
    if layer_name in layer_config:
        return layer_config[layer_name]
    return next((value for pattern, value in layer_config.items()
                 if match_layer_pattern(layer_name, pattern)), None)
