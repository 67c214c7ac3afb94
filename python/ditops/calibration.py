"""Calibration of a torch model for static W8A8 from real runs: hooks record each nn.Linear's
input range per channel and per denoising step while the model runs (a few steps of a real
pipeline), then export() writes msmodelslim's file pair (W8A8 static, W8A8_TIMESTEP or
W8A8_DYNAMIC, with optional SmoothQuant), which quantize(model, quant_des_path=...) loads. The
arithmetic is ditops-quantize's (docs/quantization.md), run by the same C++ code."""

import os

import torch

from . import _ditops, quant


class ExportReport:
    """What Calibration.export() wrote: `description_path`, `weights_path`,
    `quantized_layers` (sorted) and `float_layers` (name -> why it stays in floating point)."""

    def __init__(self, description_path, weights_path, quantized_layers, float_layers):
        self.description_path = description_path
        self.weights_path = weights_path
        self.quantized_layers = quantized_layers
        self.float_layers = float_layers

    def __repr__(self):
        return (f"ExportReport({self.description_path!r}, {len(self.quantized_layers)} "
                f"quantized, {len(self.float_layers)} float)")


class Calibration:
    """Each nn.Linear's input range, per input channel and per denoising step, recorded while
    `model` runs (made by calibrate()). A step is one value of the model's `timestep` argument:
    calls with the same value (classifier-free guidance's two passes) share a step, a smaller
    value is the next step, a larger one starts a new generation at step 0 (its ranges widen
    the first run's). A model called without `timestep` counts one step per call; restart()
    goes back to step 0. close() (or leaving the `with` block) removes the hooks and keeps the
    ranges."""

    def __init__(self, model):
        self.model = model
        self._linears = {name: module for name, module in model.named_modules()
                         if isinstance(module, torch.nn.Linear)}
        self._ranges = {name: [] for name in self._linears}  # name -> per step [2, in] or None
        self._step = -1
        self._steps = 0
        self._last_timestep = None
        self._hooks = [model.register_forward_pre_hook(self._on_model_call, with_kwargs=True)]
        for name, module in self._linears.items():
            self._hooks.append(module.register_forward_pre_hook(self._recorder(name)))

    @property
    def steps(self):
        """The number of steps recorded (the longest generation's)."""
        return self._steps

    def restart(self):
        """The next call of the model is step 0 again."""
        self._step = -1
        self._last_timestep = None

    def _on_model_call(self, module, args, kwargs):
        timestep = kwargs.get("timestep")
        if timestep is None:
            self._step += 1
            return
        value = torch.as_tensor(timestep).detach().to("cpu", torch.float64).flatten()
        last = self._last_timestep
        if last is None or last.shape != value.shape or bool((value > last).any()):
            self._step = 0
        elif not torch.equal(value, last):
            self._step += 1
        self._last_timestep = value

    def _recorder(self, name):
        def record(module, args):
            if self._step < 0:
                raise RuntimeError("Calibration: a layer ran outside a call of the model")
            x = args[0].detach()
            x = x.reshape(-1, x.shape[-1])
            if x.shape[0] == 0:
                return
            seen = torch.stack([x.amax(dim=0), x.amin(dim=0)]).to(torch.float32)
            self._steps = max(self._steps, self._step + 1)
            steps = self._ranges[name]
            steps.extend([None] * (self._step + 1 - len(steps)))
            old = steps[self._step]
            steps[self._step] = seen if old is None else torch.stack(
                [torch.maximum(old[0], seen[0]), torch.minimum(old[1], seen[1])])
        return record

    def close(self):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def layers(self):
        """The names of the layers that ran, sorted."""
        return sorted(name for name, steps in self._ranges.items()
                      if any(r is not None for r in steps))

    def ranges(self, name):
        """Layer `name`'s recorded ranges, float32 [steps, 2, in]: per step, each input
        channel's maximum, then its minimum. A step the layer did not run in (a cached step)
        holds its range over the steps it ran in. KeyError for a layer that never ran."""
        steps = self._ranges[name]
        seen = [r for r in steps if r is not None]
        if not seen:
            raise KeyError(f"Calibration: layer {name!r} never ran")
        overall = torch.stack([torch.stack([r[0] for r in seen]).amax(0),
                               torch.stack([r[1] for r in seen]).amin(0)])
        steps = steps + [None] * (self.steps - len(steps))
        return torch.stack([overall if r is None else r for r in steps])

    def export(self, out_dir, algo="W8A8_TIMESTEP", smooth=None, keep_float=None, rank=None):
        """Writes `model`'s msmodelslim export into the existing directory `out_dir`:
        quant_model_description_{algo}[_{rank}].json and quant_model_weight_...safetensors,
        every tensor of the model's state dict in it. algo: "W8A8_TIMESTEP" (static
        parameters per recorded step, dynamic after the last), "W8A8" (static, from the range
        over all steps) or "W8A8_DYNAMIC" (per token; the ranges serve SmoothQuant only).
        smooth: SmoothQuant's alpha in [0, 1] (0.5 is usual) or None. keep_float: shell
        patterns of layers kept in floating point (default ditops.quant.KEEP_FLOAT:
        embedders, modulation, the final projection). Layers that never ran are kept too (they
        cannot be calibrated), as are rank-2 weights of modules that are not nn.Linear. Returns
        an ExportReport. ditops.Error naming the layer for bad input; nothing is written
        then."""
        if keep_float is None:
            keep_float = quant.KEEP_FLOAT
        if isinstance(keep_float, str):
            keep_float = (keep_float,)
        if not os.path.isdir(out_dir):
            raise _ditops.Error(f"Calibration.export: out_dir {str(out_dir)!r} is not an "
                                "existing directory")
        if self.steps == 0 and (algo != "W8A8_DYNAMIC" or smooth is not None):
            raise _ditops.Error("Calibration.export: no step was recorded: run the model "
                                "first (or export W8A8_DYNAMIC without smooth)")
        reasons = {}
        ran = set(self.layers())
        for name in self._linears:
            if name not in ran and (algo != "W8A8_DYNAMIC" or smooth is not None):
                reasons[name] = "never ran while calibrating"
        state = self.model.state_dict()
        linear_weights = {f"{name}.weight" for name in self._linears}
        for key, tensor in state.items():
            if key.endswith(".weight") and tensor.dim() == 2 and key not in linear_weights:
                reasons[key[:-len(".weight")]] = "not an nn.Linear"
        weights = []
        for key, tensor in state.items():
            tensor = tensor.detach().to("cpu")
            if tensor.dtype == torch.float64:
                tensor = tensor.float()
            weights.append((key, tensor.contiguous()))
        calibration = []
        if algo != "W8A8_DYNAMIC" or smooth is not None:
            calibration = [(f"{name}.input_range", self.ranges(name)) for name in ran]
        # fnmatch patterns: module names hold no *, ? or [ of their own.
        patterns = list(keep_float) + sorted(reasons)
        description, weights_path, quantized, kept = _ditops.quantize_export(
            weights, calibration, os.fspath(out_dir), algo, patterns, smooth,
            -1 if rank is None else int(rank))
        float_layers = {name: reasons.get(name, "keep_float") for name in kept}
        for name, why in reasons.items():
            float_layers.setdefault(name, why)
        return ExportReport(description, weights_path, quantized, float_layers)


def calibrate(model):
    """Starts recording `model`'s nn.Linear input ranges (a Calibration; use it as a context
    manager, run the model or its pipeline for a few steps inside, then export())."""
    return Calibration(model)
