"""MindIE-SD's quantization configurations: TimestepPolicyConfig (which strategy a denoising
step uses, per kind of layer), QuantConfig (an msmodelslim export and what to override in it)
and OnlineQuantConfig (quantizing a floating-point model's own weights in memory). Same fields,
defaults, validation and error types as mindiesd 3.1.0; what ditops computes of them is
decided by quantize() (docs/quantization.md)."""

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch

from ..errors import ModelInitError, ParametersInvalid
from .mode import QuantAlgorithm

# The strategies each kind of layer ("target") can be given per step.
W8A8_STATIC_LINEAR_STRATEGIES = ("dynamic", "static")
W4A4_LINEAR_STRATEGIES = ("W4A4", "W4A8")
FA_STRATEGIES = ("MXFP4", "FP8", "FLOAT")
VALID_STRATEGIES = {
    "w8a8_static_linear": W8A8_STATIC_LINEAR_STRATEGIES,
    "w4a4_linear": W4A4_LINEAR_STRATEGIES,
    "fa": FA_STRATEGIES,
}


class TimestepPolicyConfig:
    """Per denoising step, the strategy of each target: "w8a8_static_linear" (W8A8_TIMESTEP
    layers: "dynamic" or "static" activation parameters), "w4a4_linear" ("W4A4" or "W4A8") and
    "fa" ("MXFP4", "FP8" or "FLOAT"). Steps never registered use the target's default."""

    def __init__(self, default_strategy="dynamic", w4a4_default_strategy="W4A4",
                 fa_default_strategy="MXFP4"):
        defaults = {"w8a8_static_linear": default_strategy,
                    "w4a4_linear": w4a4_default_strategy, "fa": fa_default_strategy}
        for target, strategy in defaults.items():
            _check_strategy(strategy, target)
        self._defaults = defaults
        self._registered = {target: {} for target in VALID_STRATEGIES}

    def register(self, step_range, strategy, target="w4a4_linear"):
        """Steps `step_range` (an int, a list of ints or a range) use `strategy` for `target`;
        a later registration of a step replaces an earlier one. target "linear" means
        w8a8_static_linear or w4a4_linear, whichever `strategy` belongs to. TypeError for an
        argument of the wrong type, ParametersInvalid (a ValueError) for an unknown target or
        a strategy the target does not have."""
        target = _target(target, strategy)
        _check_strategy(strategy, target)
        for step in _steps(step_range):
            self._registered[target][step] = strategy

    def get_strategy(self, step, target="w4a4_linear"):
        """The strategy of `step` (an int, or None for no step set: the default) for
        `target`."""
        target = _target(target)
        if step is not None and not isinstance(step, int):
            raise ParametersInvalid(f"step must be the type of int, but currently got "
                                    f"{type(step)}.")
        return self._registered[target].get(step, self._defaults[target])


def _target(target, strategy=None):
    if not isinstance(target, str):
        raise TypeError(f"target must be a str, got {type(target)}")
    if target == "linear":  # the older name: the linear target `strategy` is one of
        target = next((name for name in ("w8a8_static_linear", "w4a4_linear")
                       if strategy in VALID_STRATEGIES[name]), target)
    if target not in VALID_STRATEGIES:
        raise ParametersInvalid(f"target \"{target}\" is not one of {tuple(VALID_STRATEGIES)}")
    return target


def _check_strategy(strategy, target):
    if not isinstance(strategy, str):
        raise TypeError(f"strategy must be a str, got {type(strategy)}")
    if strategy not in VALID_STRATEGIES[target]:
        raise ParametersInvalid(f"strategy \"{strategy}\" is not one of "
                                f"{VALID_STRATEGIES[target]} (target {target})")


def _steps(step_range):
    if isinstance(step_range, int):
        return [step_range]
    if not isinstance(step_range, (list, range)):
        raise TypeError(f"step_range must be an int, a list or a range, got {type(step_range)}")
    if not all(isinstance(step, int) for step in step_range):
        raise TypeError("step_range must hold ints")
    return step_range


def _algorithm(value, field):
    """A QuantAlgorithm from itself or its name (any case); None stays None."""
    if value is None or isinstance(value, QuantAlgorithm):
        return value
    if isinstance(value, str):
        try:
            return QuantAlgorithm(value.upper())
        except ValueError:
            raise ModelInitError(f"{field} \"{value}\" is not a QuantAlgorithm (one of "
                                 f"{[a.value for a in QuantAlgorithm]})") from None
    raise ModelInitError(f"{field} must be a QuantAlgorithm, got {type(value)}")


def _check_mxfp4(config):
    if config.mxfp4_scale_alg is not None and not isinstance(config.mxfp4_scale_alg, int):
        raise ModelInitError("mxfp4_scale_alg must be an int or None")
    value = config.mxfp4_dst_type_max
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelInitError("mxfp4_dst_type_max must be a float")
    config.mxfp4_dst_type_max = float(value)


def _check_timestep_config(config):
    if config.timestep_config is not None and not isinstance(config.timestep_config,
                                                              TimestepPolicyConfig):
        raise ModelInitError("timestep_config must be a TimestepPolicyConfig")


def _algorithm_value(algorithm):
    return algorithm.value if isinstance(algorithm, QuantAlgorithm) else algorithm


@dataclasses.dataclass
class QuantConfig:
    """What quantize() loads: the export's description (quant_des_path) and, overriding what it
    says where set, the algorithm of every layer (quant_algo), the quantized layers and their
    algorithms (quantized_layers), the layers to keep in floating point (exclude_layers), the
    timestep policy; dtype, use_nz and the MXFP4 settings as MindIE-SD has them. Invalid
    values raise ModelInitError."""

    quant_des_path: Optional[str] = None
    quant_algo: Optional[QuantAlgorithm] = None
    quantized_layers: Optional[Dict[str, "QuantConfig"]] = None
    exclude_layers: Optional[Tuple[str, ...]] = None

    dtype: torch.dtype = torch.bfloat16
    use_nz: Optional[bool] = None
    timestep_config: Optional[TimestepPolicyConfig] = None

    mxfp4_scale_alg: Optional[int] = None
    mxfp4_dst_type_max: float = 7.25

    def __post_init__(self):
        self.quant_algo = _algorithm(self.quant_algo, "quant_algo")
        if self.exclude_layers is not None:
            if isinstance(self.exclude_layers, list):
                self.exclude_layers = tuple(self.exclude_layers)
            if not isinstance(self.exclude_layers, tuple):
                raise ModelInitError("exclude_layers must be a tuple of layer names")
            if not all(isinstance(name, str) for name in self.exclude_layers):
                raise ModelInitError("exclude_layers must hold strings")
        if self.quantized_layers is not None:
            if not isinstance(self.quantized_layers, dict):
                raise ModelInitError("quantized_layers must be a dict of layer name to "
                                     "QuantConfig")
            layers = {}
            for name, layer in self.quantized_layers.items():
                if not isinstance(name, str):
                    raise ModelInitError("quantized_layers' keys must be strings")
                if isinstance(layer, dict):
                    layer = QuantConfig.parse_from_dict(layer)
                if not isinstance(layer, QuantConfig):
                    raise ModelInitError("quantized_layers' values must be QuantConfig")
                layers[name] = layer
            self.quantized_layers = layers
        if self.quant_des_path is not None and not isinstance(self.quant_des_path, str):
            raise ModelInitError("quant_des_path must be a str or None")
        if not isinstance(self.dtype, torch.dtype) or self.dtype not in (torch.float16,
                                                                         torch.bfloat16):
            raise ModelInitError("dtype must be torch.float16 or torch.bfloat16")
        _check_timestep_config(self)
        if self.use_nz is not None and not isinstance(self.use_nz, bool):
            raise ModelInitError("use_nz must be a bool")
        _check_mxfp4(self)

    @classmethod
    def parse_from_dict(cls, config):
        return cls(**dict(config))

    @classmethod
    def from_kwargs(cls, kwargs):
        """The QuantConfig of quantize()'s keyword arguments (timestep_policy is another name
        of timestep_config; ParametersInvalid if both are set to different objects)."""
        fields = {name: kwargs[name] for name in (
            "quant_des_path", "quant_algo", "quantized_layers", "exclude_layers", "dtype",
            "use_nz", "mxfp4_scale_alg", "mxfp4_dst_type_max") if name in kwargs}
        return cls(**fields, timestep_config=timestep_argument(kwargs))

    def merged_with_user(self, user_config):
        """A copy of this configuration with every field `user_config` sets; a user quant_algo
        without user quantized_layers becomes the algorithm of every quantized layer."""
        if user_config is None:
            return self
        merged = dataclasses.replace(self)
        for field in dataclasses.fields(QuantConfig):
            value = getattr(user_config, field.name)
            if value is not None:
                setattr(merged, field.name, value)
        if (user_config.quant_algo is not None and user_config.quantized_layers is None
                and merged.quantized_layers):
            merged.quantized_layers = {
                name: dataclasses.replace(layer, quant_algo=user_config.quant_algo)
                for name, layer in merged.quantized_layers.items()}
        return merged

    def to_kwargs(self):
        kwargs = {"dtype": self.dtype, "quant_config": self}
        if self.use_nz is not None:
            kwargs["use_nz"] = self.use_nz
        if self.timestep_config is not None:
            kwargs["timestep_config"] = self.timestep_config
        return kwargs

    @property
    def quant_algorithms_list(self):
        """The distinct algorithms of quantized_layers."""
        if not self.quantized_layers:
            return []
        return list({layer.quant_algo for layer in self.quantized_layers.values()})

    def serialize_to_dict(self):
        return dataclasses.asdict(self)


def timestep_argument(kwargs):
    """quantize()'s timestep_config keyword, or its other name timestep_policy."""
    config, policy = kwargs.get("timestep_config"), kwargs.get("timestep_policy")
    if config is not None and policy is not None and config is not policy:
        raise ParametersInvalid("timestep_config and timestep_policy cannot both be set to "
                                "different objects.")
    return config if config is not None else policy


# What OnlineQuantConfig accepts, as MindIE-SD does (ditops computes W8A8_DYNAMIC and the
# W8A8 / W16A16 fallbacks of it; quantize() refuses the others by name).
SUPPORTED_ONLINE_QUANT_TYPES = (QuantAlgorithm.W8A8_DYNAMIC, QuantAlgorithm.W8A8_MXFP8,
                                QuantAlgorithm.W4A4_MXFP4_DYNAMIC,
                                QuantAlgorithm.W4A4_MXFP4_DUALSCALE)
SUPPORTED_ONLINE_FALLBACK_TYPES = (QuantAlgorithm.W8A8, QuantAlgorithm.W16A16)
SUPPORTED_ONLINE_FA_TYPES = (QuantAlgorithm.FP8_DYNAMIC, QuantAlgorithm.MXFP4_DYNAMIC)


@dataclasses.dataclass
class OnlineQuantConfig:
    """Quantizing a floating-point model's nn.Linear layers from their own weights, in memory:
    quant_type for every layer except those fallback_layers (layer name or fnmatch pattern,
    braces {a,b} allowed) gives W8A8 or W16A16 (kept in floating point); FA quantization of
    the attention modules fa_layers names (fa_quant_type); the timestep policy and MXFP4
    settings of W4A4 layers. Invalid values raise ModelInitError."""

    quant_type: QuantAlgorithm = QuantAlgorithm.W8A8_DYNAMIC
    fallback_layers: Optional[Dict[str, QuantAlgorithm]] = None
    fa_layers: Optional[Tuple[str, ...]] = None
    fa_quant_type: Optional[QuantAlgorithm] = None
    timestep_config: Optional[TimestepPolicyConfig] = None
    mxfp4_scale_alg: Optional[int] = None
    mxfp4_dst_type_max: float = 7.25
    fallback_timesteps: dataclasses.InitVar[Optional[List[int]]] = None

    def __post_init__(self, fallback_timesteps):
        if fallback_timesteps is not None:
            raise ModelInitError("fallback_timesteps is no longer supported: use "
                                 "timestep_config")
        self.quant_type = _algorithm(self.quant_type, "quant_type")
        if self.quant_type not in SUPPORTED_ONLINE_QUANT_TYPES:
            raise ModelInitError(f"quant_type {self.quant_type} is not one of "
                                 f"{[a.value for a in SUPPORTED_ONLINE_QUANT_TYPES]}")
        if self.fa_layers is None:
            self.fa_layers = ()
        elif isinstance(self.fa_layers, str):
            self.fa_layers = (self.fa_layers,)
        elif isinstance(self.fa_layers, (list, tuple)):
            self.fa_layers = tuple(self.fa_layers)
            if not all(isinstance(pattern, str) for pattern in self.fa_layers):
                raise ModelInitError("fa_layers must hold strings")
        else:
            raise ModelInitError("fa_layers must be a list or tuple of layer or class name "
                                 "patterns")
        self.fa_quant_type = _algorithm(self.fa_quant_type, "fa_quant_type")
        if self.fa_quant_type is not None:
            if self.fa_quant_type not in SUPPORTED_ONLINE_FA_TYPES:
                raise ModelInitError(f"fa_quant_type {self.fa_quant_type} is not one of "
                                     f"{[a.value for a in SUPPORTED_ONLINE_FA_TYPES]}")
            if not self.fa_layers:
                raise ModelInitError("fa_layers must be set when fa_quant_type is")
        _check_timestep_config(self)
        _check_mxfp4(self)
        if self.fallback_layers is None:
            self.fallback_layers = {}
        if not isinstance(self.fallback_layers, dict):
            raise ModelInitError("fallback_layers must be a dict of layer name pattern to "
                                 "QuantAlgorithm")
        fallback = {}
        for pattern, algorithm in self.fallback_layers.items():
            if not isinstance(pattern, str):
                raise ModelInitError("fallback_layers' keys must be strings")
            algorithm = _algorithm(algorithm, f"fallback_layers[\"{pattern}\"]")
            if algorithm not in SUPPORTED_ONLINE_FALLBACK_TYPES:
                raise ModelInitError(
                    f"fallback_layers[\"{pattern}\"] = {algorithm} is not one of "
                    f"{[a.value for a in SUPPORTED_ONLINE_FALLBACK_TYPES]}")
            fallback[pattern] = algorithm
        self.fallback_layers = fallback

    @classmethod
    def parse_from_dict(cls, config):
        return cls(**dict(config))

    def serialize_to_dict(self):
        result = {"quant_type": _algorithm_value(self.quant_type),
                  "fallback_layers": {pattern: _algorithm_value(algorithm)
                                      for pattern, algorithm in self.fallback_layers.items()}}
        if self.fa_quant_type is not None:
            result["fa_quant_type"] = _algorithm_value(self.fa_quant_type)
            result["fa_layers"] = list(self.fa_layers)
        if self.timestep_config is not None:
            result["timestep_config"] = self.timestep_config
        if self.mxfp4_scale_alg is not None:
            result["mxfp4_scale_alg"] = self.mxfp4_scale_alg
            result["mxfp4_dst_type_max"] = self.mxfp4_dst_type_max
        return result
