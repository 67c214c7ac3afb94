"""W8A8 linear layers in PyTorch models: QuantLinear (a torch module over a ditops layer), the
layers quantize() builds from an msmodelslim export or from a model's own weights, and the
denoising step of each converted model's W8A8_TIMESTEP layers (set_timestep: one model;
set_every_timestep: all of them, MindIE-SD's TimestepManager). quantize() and its
configurations, over this: ditops.quantization."""

import atexit
import weakref

import torch

from . import _ditops
from ._op import Op, call
from ._arrays import check_inputs, native

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
    """One ditops layer (static, dynamic or timestep W8A8, or FLOAT) as a drop-in nn.Linear:
    y = x · Wᵀ + b on ditops' int8 GEMM, x [..., in_features] of any float dtype, y of x's
    dtype (float16 is computed in float32: the kernels take float32 and bfloat16)."""

    def __init__(self, layer, name="", dtype=None):
        super().__init__()
        if dtype is not None:
            # A parameter without elements, of the replaced layer's dtype: code that reads a
            # module's dtype from its parameters (diffusers' Wan reads its time embedder's)
            # finds the model's.
            self.dtype_probe = torch.nn.Parameter(torch.empty(0, dtype=dtype),
                                                  requires_grad=False)
        self.layer_id = id(layer)
        _LAYERS[self.layer_id] = layer
        self.layer = layer
        self.name = name
        self.in_features = layer.in_features
        self.out_features = layer.out_features

    def __del__(self):
        _LAYERS.pop(self.layer_id, None)

    def forward(self, x):
        check_inputs("QuantLinear", x=x)
        if x.dtype == torch.float16:
            return self.forward(x.float()).half()
        if x.stride(-1) != 1:  # the kernels read rows with a contiguous last dimension
            x = x.contiguous()
        return call(_quant_linear, x, self.layer_id, "none")

    def extra_repr(self):
        return (f"{self.name}: {self.layer.algo}, in_features={self.in_features}, "
                f"out_features={self.out_features}")


def w8a8_dynamic_layer(linear):
    """A W8A8_DYNAMIC layer of nn.Linear `linear`'s own weights: per output channel,
    symmetric, scale_n = max_k |W[n, k]| / 127 (1 for an all-zero row) and W_q = round(W /
    scale_n) in [-127, 127], from the weights as they are (float32, bfloat16 or float16); the
    bias kept in float32. Activations are quantized per token at each forward. ditops.Error for
    weights that are not finite."""
    weight = linear.weight.detach().to("cpu", torch.float32)
    scale = weight.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    weight_q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    bias = linear.bias
    if bias is not None:
        bias = bias.detach().to("cpu", torch.float32).contiguous()
    return _ditops.QuantLinear.w8a8("W8A8_DYNAMIC", weight_q, weight_scale=scale, bias=bias)


def replace_layers(model, layers):
    """Puts QuantLinear(layer) at each (dotted name, ditops layer) of `layers` in `model`, and
    counts them in model._ditops_quantized_layers."""
    for name, layer in layers:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantLinear(layer, name))
    model._ditops_quantized_layers = getattr(model, "_ditops_quantized_layers", 0) + len(layers)


# Models whose nn.Linear layers an integration (ditops.diffusers.optimize) has replaced and will
# put back: quantize() refuses them, its layers would be lost when the originals return.
_HELD = weakref.WeakSet()


def hold_linears(model, held=True):
    """Marks `model`'s linear layers as replaced by an integration that restores them (held),
    or no longer (held=False)."""
    if held:
        _HELD.add(model)
    else:
        _HELD.discard(model)


def holds_linears(model):
    """Whether an integration holds `model`'s linear layers (hold_linears)."""
    return model in _HELD


# Linear layers ditops keeps in floating point when it quantizes a diffusers transformer
# (optimize(quantize="w8a8_dynamic"), Calibration.export): the embedders (patch, text,
# timestep), the modulation (the AdaLN linears that produce scale, shift and gate), the timestep
# projections and the final projection. Their inputs or outputs set every token's scale, and
# they cost little of the forward. fnmatch patterns over the layers' dotted names.
KEEP_FLOAT = ("*embed*", "*norm*.linear", "norm_out*", "*time_proj*", "proj_out")


# A step no policy makes static: what a converted model's timestep layers are at while no step
# is set (C++ steps are ints >= 0; the largest int32 is past every layer's steps).
UNSET_STEP = 2**31 - 1

# Every live ModelTimestep, for set_every_timestep.
_TIMESTEPS = weakref.WeakSet()
_current_step = [None]


class ModelTimestep:
    """The denoising step of one converted model. Its exports are loaded with every step
    static, so the step handed to each decides how its W8A8_TIMESTEP layers run: t itself
    where the export's is_static(t), UNSET_STEP (dynamic) elsewhere."""

    def __init__(self):
        self.exports = []  # (export, is_static)
        _TIMESTEPS.add(self)

    def add(self, export, is_static):
        self.exports.append((export, is_static))
        self.set(_current_step[0])

    def set(self, step):
        if step is not None and step < 0:
            raise _ditops.Error(f"set_timestep: step {step} < 0")
        for export, is_static in self.exports:
            static = step is not None and is_static(step)
            export.set_timestep_step(step if static else UNSET_STEP)


def model_timestep(model):
    """The ModelTimestep of `model`, made on first use (quantize() marks each model it
    converts with one)."""
    timestep = getattr(model, "_ditops_timestep", None)
    if timestep is None:
        timestep = ModelTimestep()
        model._ditops_timestep = timestep
    return timestep


def set_every_timestep(step):
    """Moves every converted model to denoising step `step` (None: no step), and the models
    converted later start there."""
    _current_step[0] = step
    for timestep in list(_TIMESTEPS):
        timestep.set(step)


def set_timestep(model, step):
    """The denoising step (an int >= 0) of one model quantize() converted, read by its
    W8A8_TIMESTEP layers under its timestep policy; other models keep theirs (MindIE-SD's
    TimestepManager.set_timestep_idx moves every model). ValueError for another model."""
    timestep = getattr(model, "_ditops_timestep", None)
    if timestep is None:
        raise ValueError("set_timestep: the model was not converted by ditops.quantize")
    timestep.set(int(step))
