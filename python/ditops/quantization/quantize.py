"""MindIE-SD's quantize(): a model's nn.Linear layers replaced, in place, by ditops W8A8 layers,
either from an msmodelslim export (quant_des_path, or quant_config's) or from the model's own
weights in memory (online_config). Every layer is built and checked before the first one is
replaced, so a refused call leaves the model as it was."""

import dataclasses
import json
import os

import torch

from .. import _ditops, quant
from ..errors import ConfigError, FeatureNotSupported, ParametersInvalid
from .config import OnlineQuantConfig, QuantConfig, TimestepPolicyConfig, timestep_argument
from .mode import RUNNABLE, QuantAlgorithm
from .utils import TimestepManager, match_layer_config

# The description's algorithms of layers kept in floating point and of FA quantization.
_FLOAT = "FLOAT"
_FA_ALGORITHMS = (QuantAlgorithm.FP8_DYNAMIC, QuantAlgorithm.MXFP8_DYNAMIC,
                  QuantAlgorithm.MXFP4_DYNAMIC)


def quantize(model, quant_des_path=None, online_config=None, **kwargs):
    """Quantizes `model` (an nn.Module) in place and returns it.

    online_config (an OnlineQuantConfig): every nn.Linear becomes a W8A8_DYNAMIC layer of its
    own weights (ditops.quant.w8a8_dynamic_layer), except those fallback_layers keeps
    (W16A16); a W8A8 fallback is the same dynamic layer. Other quant_type and fa_quant_type
    values raise FeatureNotSupported naming them. Not with quant_des_path or quant_config.

    Otherwise an msmodelslim export: quant_des_path or quant_config.quant_des_path names its
    description (a name ending in _<n> is this process's torch.distributed rank's file). Each
    nn.Linear the description (or quant_config's quantized_layers) gives W8A8, W8A8_DYNAMIC or
    W8A8_TIMESTEP becomes that layer of the export; FLOAT entries and exclude_layers keep the
    model's own. A description naming another algorithm raises FeatureNotSupported naming it.

    kwargs: quant_config (QuantConfig), timestep_config or timestep_policy
    (TimestepPolicyConfig: the steps W8A8_TIMESTEP layers run static), dtype (float16 or
    bfloat16, checked as MindIE-SD does: ditops' layers return x's dtype), use_nz (the NPU's
    weight layout: accepted, no meaning on the CPU); weights_path (ditops: the export's
    safetensors file when not beside the description). Bad arguments raise ParametersInvalid
    (ConfigError for a missing path, ModelInitError for a bad QuantConfig field)."""
    if not isinstance(model, torch.nn.Module):
        raise ParametersInvalid(f"The model must be the type of nn.Module, but currently got "
                                f"{type(model)}.")
    if quant.holds_linears(model):
        raise ParametersInvalid("quantize: ditops.diffusers.optimize already put this model's "
                                "linear layers on ditops; call ditops.diffusers.disable(model) "
                                "first, or optimize(model, quantize=\"w8a8_dynamic\")")
    if online_config is not None:
        if quant_des_path is not None or kwargs.get("quant_config") is not None:
            raise ParametersInvalid("online_config is mutually exclusive with quant_des_path "
                                    "and quant_config.")
        if not isinstance(online_config, OnlineQuantConfig):
            raise ParametersInvalid(f"online_config must be the type of OnlineQuantConfig, but "
                                    f"currently got {type(online_config)}.")
        _check_dtype(kwargs.get("dtype", torch.bfloat16))
        return _quantize_online(model, online_config)
    config = _export_config(quant_des_path, kwargs)
    return _quantize_export(model, config, kwargs.get("weights_path", ""))


def _check_dtype(dtype):
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float16, torch.bfloat16):
        raise ParametersInvalid(f"Dtype must be torch.float16 or torch.bfloat16, but currently "
                                f"got {dtype}.")


def _refuse(algorithm, where):
    raise FeatureNotSupported(f"quantize: {where} {algorithm} is not supported by ditops on the "
                              f"CPU (it computes {', '.join(RUNNABLE)} and FLOAT; see "
                              "docs/quantization.md)")


def _built(name, build):
    """build() (a ditops layer), its ditops.Error raised as ParametersInvalid naming `name`."""
    try:
        return build()
    except _ditops.Error as error:
        raise ParametersInvalid(f"quantize: layer \"{name}\": {error}") from None


def _quantize_online(model, config):
    if config.quant_type != QuantAlgorithm.W8A8_DYNAMIC:
        _refuse(config.quant_type, "online quant_type")
    if config.fa_quant_type is not None:
        _refuse(config.fa_quant_type, "online fa_quant_type")
    layers = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if match_layer_config(name, config.fallback_layers) == QuantAlgorithm.W16A16:
            continue
        layers.append((name, _built(name, lambda: quant.w8a8_dynamic_layer(module))))
    quant.replace_layers(model, layers)
    quant.model_timestep(model)  # ditops.set_timestep accepts every converted model
    return model


def _export_config(quant_des_path, kwargs):
    """The caller's QuantConfig (quant_config, or one of the keyword arguments) with the
    description's path, validated."""
    config = kwargs.get("quant_config")
    if config is not None and not isinstance(config, QuantConfig):
        raise ParametersInvalid(f"quant_config must be QuantConfig, but currently got "
                                f"{type(config)}.")
    for key in ("timestep_config", "timestep_policy"):
        value = kwargs.get(key)
        if value is not None and not isinstance(value, TimestepPolicyConfig):
            raise ParametersInvalid(f"{key} must be the type of TimestepPolicyConfig, but "
                                    f"currently got {type(value)}.")
    _check_dtype(kwargs.get("dtype", config.dtype if config is not None else torch.bfloat16))
    if config is None:
        config = QuantConfig.from_kwargs(kwargs)
    else:  # the caller's object is not modified
        policy = timestep_argument(kwargs)
        config = dataclasses.replace(
            config,
            timestep_config=(config.timestep_config if config.timestep_config is not None
                             else policy),
            use_nz=config.use_nz if config.use_nz is not None else kwargs.get("use_nz"))
    if quant_des_path is not None:
        config.quant_des_path = _path(quant_des_path)
    config.quant_des_path = _path(config.quant_des_path)
    return config


def _path(path):
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise ConfigError("Invalid string path for quant_des_path.")
    return os.path.realpath(path)


def _rank_path(path):
    """A description named ..._<n>.json stands for one per rank: this process's rank's."""
    directory, name = os.path.split(path)
    stem, extension = os.path.splitext(name)
    head, _, tail = stem.rpartition("_")
    if not (head and tail.isdigit()):
        return path
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise ConfigError(f"must init distributed env if use distributed config {name}")
    return os.path.join(directory, f"{head}_{torch.distributed.get_rank()}{extension}")


def _description_config(path):
    """The QuantConfig a description says: its model_quant_type, quantized_layers (every key
    with an algorithm) and exclude_layers (the FLOAT keys). FeatureNotSupported for an
    algorithm ditops does not compute, ParametersInvalid for a file that is not one."""
    if not os.path.isfile(path):
        raise ParametersInvalid(f"The path:{path} doesn't exist or is not a file.")
    try:
        with open(path, encoding="utf-8") as file:
            description = json.load(file)
    except (OSError, ValueError) as error:
        raise ParametersInvalid(f"quantize: description {path}: {error}") from None
    if not isinstance(description, dict) or not description:
        raise ParametersInvalid(f"quantize: description {path} is not a non-empty JSON object")
    known = {algorithm.value for algorithm in QuantAlgorithm}
    layers = {}
    for key, value in description.items():
        if isinstance(value, str) and value.upper() in known:
            algorithm = QuantAlgorithm(value.upper())
            if algorithm not in RUNNABLE:
                _refuse(algorithm, f"description {path}: key \"{key}\" has algorithm")
            layers[key] = QuantConfig(quant_algo=algorithm)
    model_algorithm = description.get("model_quant_type")
    if not isinstance(model_algorithm, str) or model_algorithm.upper() not in known:
        raise ParametersInvalid(f"quantize: description {path} has no model_quant_type "
                                "naming a QuantAlgorithm")
    if QuantAlgorithm(model_algorithm.upper()) not in RUNNABLE:
        _refuse(model_algorithm, f"description {path}: model_quant_type")
    return QuantConfig(quant_des_path=path, quant_algo=model_algorithm, quantized_layers=layers,
                       exclude_layers=tuple(k for k, v in description.items() if v == _FLOAT))


def _keys(name):
    """The description keys that describe module `name`, in MindIE-SD's order."""
    return (f"{name}.linear.weight", f"{name}.weight", name, f"{name}.fa_q.scale",
            f"{name}.quant_type")


def _quantize_export(model, user_config, weights_path):
    path = _rank_path(user_config.quant_des_path)
    config = _description_config(path).merged_with_user(user_config)
    config.quant_des_path = path
    export = _built(path, lambda: _ditops.QuantModel.load(path, str(weights_path),
                                                          [(0, quant.UNSET_STEP - 1)]))
    excluded = set(config.exclude_layers or ())
    layers, steps = [], None
    for name, module in model.named_modules():
        keys = _keys(name)
        if excluded.intersection(keys):
            continue
        layer_config = next((config.quantized_layers[k] for k in keys
                             if k in (config.quantized_layers or {})), None)
        algorithm = layer_config.quant_algo if layer_config is not None else None
        if algorithm is None or not (isinstance(module, torch.nn.Linear)
                                     or algorithm in _FA_ALGORITHMS):
            continue
        if algorithm not in RUNNABLE:
            _refuse(algorithm, f"layer \"{name}\":")
        exported = _built(name, lambda: export.layer_algo(name))
        if exported != algorithm:
            raise ParametersInvalid(f"quantize: layer \"{name}\" is {exported} in {path}; "
                                    f"ditops cannot run it as {algorithm}")
        layer = _built(name, lambda: export.linear(name))
        if (layer.in_features, layer.out_features) != (module.in_features, module.out_features):
            raise ParametersInvalid(
                f"quantize: layer \"{name}\" of {path} is [{layer.out_features}, "
                f"{layer.in_features}], the model's nn.Linear [{module.out_features}, "
                f"{module.in_features}]")
        if algorithm == QuantAlgorithm.W8A8_TIMESTEP:
            steps = _step_count(export, name)
        layers.append((name, layer))
    quant.replace_layers(model, layers)
    policy = config.timestep_config or TimestepPolicyConfig()
    quant.model_timestep(model).add(
        export, lambda step: policy.get_strategy(step, target="w8a8_static_linear") == "static")
    if steps is not None:
        TimestepManager.set_timestep_idx_max(steps)
    return model


def _step_count(export, name):
    """How many steps W8A8_TIMESTEP layer `name` has parameters for (its input_scale's
    length; a SmoothQuant layer's tensors are under name.linear)."""
    for tensor in (f"{name}.input_scale", f"{name}.linear.input_scale"):
        try:
            return len(export.float_tensor(tensor))
        except _ditops.Error:
            continue
    raise ParametersInvalid(f"quantize: W8A8_TIMESTEP layer \"{name}\" has no input_scale")
