"""W8A8 models in PyTorch: `quantize(model, quant_des_path)` replaces, in place, every
nn.Linear whose name an msmodelslim description lists with a W8A8 algorithm by a ditops layer
built from the export's tensors (MindIE-SD's quantize). TimestepPolicyConfig picks the
denoising steps that use static activation parameters in W8A8_TIMESTEP layers, and
set_timestep(model, step) moves one model's step."""

import atexit

import torch

from . import _ditops
from ._op import Op, call
from ._arrays import forbid_grad, native

# The layers of the live QuantLinear modules, by id: a custom op takes the id (an int the graph
# can hold), not the C++ object. Emptied at exit, before the module's types go.
_LAYERS = {}
atexit.register(_LAYERS.clear)


def _linear_shape(x, layer_id, activation):
    return [(tuple(x.shape[:-1]) + (_LAYERS[layer_id].out_features,), None)]


_quant_linear = Op(
    "quant_linear",
    "(Tensor x, int layer_id, str activation) -> Tensor",
    _linear_shape,
    lambda x, layer_id, activation, y: _forward(_LAYERS[layer_id], x, y, activation),
)


# QuantLinear.forward(layer, x, y, activation), tensors passed as the other calls pass them.
_forward = native(_ditops.QuantLinear.forward)


class QuantLinear(torch.nn.Module):
    """One layer of a loaded export (static, dynamic or timestep W8A8, or FLOAT): y = x · Wᵀ + b
    on ditops' int8 GEMM, x float32 or bfloat16 [..., in_features] with a contiguous last
    dimension, y of x's dtype."""

    def __init__(self, layer, name=""):
        super().__init__()
        self.layer_id = id(layer)
        _LAYERS[self.layer_id] = layer
        self.layer = layer
        self.name = name
        self.in_features = layer.in_features
        self.out_features = layer.out_features

    def __del__(self):
        _LAYERS.pop(self.layer_id, None)

    def forward(self, x):
        forbid_grad("QuantLinear", x)
        return call(_quant_linear, x, self.layer_id, "none")

    def extra_repr(self):
        return (f"{self.name}: {self.layer.algo}, in_features={self.in_features}, "
                f"out_features={self.out_features}")


class TimestepPolicyConfig:
    """MindIE-SD's TimestepPolicyConfig: register(steps, "static" | "dynamic") with steps an
    int, a list or a range; later registrations override earlier ones; unregistered steps are
    dynamic."""

    def __init__(self):
        self.static_steps = set()

    def register(self, steps, mode):
        if mode not in ("static", "dynamic"):
            raise ValueError(f"TimestepPolicyConfig.register: mode \"{mode}\" is not static or "
                             "dynamic")
        steps = [steps] if isinstance(steps, int) else list(steps)
        for step in steps:
            if int(step) < 0:
                raise ValueError(f"TimestepPolicyConfig.register: step {step} < 0")
            (self.static_steps.add if mode == "static" else self.static_steps.discard)(int(step))
        return self


def quantize(model, quant_des_path, timestep_config=None, weights_path=""):
    """Replaces, in place, every nn.Linear of `model` that the description lists with a W8A8
    algorithm by a QuantLinear from the export (FLOAT entries keep the model's own layer).
    Returns the model. A listed layer whose shape differs from the module's is an Error."""
    static_steps = sorted(timestep_config.static_steps) if timestep_config else []
    export = _ditops.QuantModel.load(str(quant_des_path), str(weights_path), static_steps)
    listed = set(export.layer_names())
    # Every layer is built and checked before the first replacement: a refused export leaves
    # the model as it was.
    replacements = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name not in listed:
            continue
        if export.layer_algo(name) == "FLOAT":
            continue
        layer = export.linear(name)
        if (layer.in_features, layer.out_features) != (module.in_features, module.out_features):
            raise _ditops.Error(
                f"quantize: layer \"{name}\" of {quant_des_path} is [{layer.out_features}, "
                f"{layer.in_features}], the model's nn.Linear [{module.out_features}, "
                f"{module.in_features}]")
        replacements.append((name, layer))
    for name, layer in replacements:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantLinear(layer, name))
    replaced = len(replacements)
    model._ditops_quant_model = export
    model._ditops_quantized_layers = replaced
    return model


def set_timestep(model, step):
    """The denoising step of a model `quantize` converted (MindIE-SD's
    TimestepManager.set_timestep_idx, per model)."""
    export = getattr(model, "_ditops_quant_model", None)
    if export is None:
        raise ValueError("set_timestep: the model was not converted by ditops.quantize")
    export.set_timestep_step(int(step))
