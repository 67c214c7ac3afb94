"""optimize(): a diffusers pipeline's transformer(s) on ditops in one call: enable() (attention,
q/k norms, rotary embedding), every nn.Linear on ditops' GEMM (FLOAT or W8A8 dynamic layers) and,
optionally, step caching; an OptimizeReport of what runs where."""

import torch

from .. import _ditops, quant
from ..quant import KEEP_FLOAT
from ..quantization.utils import match_layer_pattern
from . import _internals
from .cache import apply_cache, cache_agent
from .enabling import enable, state_of

_QUANTIZE = (None, "w8a8_dynamic")


class OptimizeReport:
    """What optimize() did: `attention` (the backend), `on_ditops` (what now runs on ditops:
    "attention processors", "q/k norms", "rotary embedding", "float linears", "w8a8_dynamic
    linears", and with cache= "step cache": the blocks or attentions whose calls go through the
    CacheAgent; each a list of module names or a note), `on_torch` (module name -> why it stays
    on torch) and `cache` (the CacheConfig the agent reads, or None). str() gives a summary."""

    def __init__(self, attention):
        self.attention = attention
        self.on_ditops = {}
        self.on_torch = {}
        self.weight_bytes = 0
        self.cache = None

    def __str__(self):
        lines = [f"ditops.diffusers.optimize: attention backend {self.attention}"]
        for what, names in self.on_ditops.items():
            if what != "step cache":
                lines.append(f"  on ditops: {len(names)} {what}")
        if self.cache is not None:
            lines.append(f"  step cache: {len(self.on_ditops['step cache'])} call sites, "
                         f"{self.cache}")
        reasons = {}
        for name, why in self.on_torch.items():
            reasons.setdefault(why, []).append(name)
        for why, names in reasons.items():
            lines.append(f"  on torch: {len(names)} ({why}), e.g. {names[0]}")
        lines.append(f"  ditops linear weights: {self.weight_bytes / 2**20:.1f} MiB")
        return "\n".join(lines)

    __repr__ = __str__


def _transformers(pipe_or_transformer):
    """The diffusers transformers of a pipeline (transformer, and transformer_2 where a
    pipeline has two, as Wan 2.2's), or the model itself."""
    if isinstance(pipe_or_transformer, torch.nn.Module):
        return [pipe_or_transformer]
    models = [getattr(pipe_or_transformer, name, None) for name in ("transformer",
                                                                    "transformer_2")]
    models = [model for model in models if isinstance(model, torch.nn.Module)]
    if not models:
        raise ValueError("ditops.diffusers.optimize: expected a diffusers transformer or a "
                         f"pipeline with a transformer, got {type(pipe_or_transformer).__name__}")
    return models


_BF16_LINEARS = ("auto", "ditops", "torch")


def _bf16_on_torch(bf16_linears):
    """Whether optimize leaves FLOAT layers of bf16 weights to torch: "auto" where the CPU
    runs bf16 GEMMs at twice the fp32 rate or more (cpu_info's bf16_dot_full_rate: torch's bf16
    linears use those units, ditops' FLOAT layers widen bf16 to fp32)."""
    if bf16_linears not in _BF16_LINEARS:
        raise ValueError(f"ditops.diffusers.optimize: bf16_linears {bf16_linears!r} is not one "
                         f"of {_BF16_LINEARS}")
    if bf16_linears == "auto":
        return bool(_ditops.cpu_info()["bf16_dot_full_rate"])
    return bf16_linears == "torch"


def _linear_layer(name, linear, quantize, keep_float, bf16_on_torch):
    """The ditops layer for nn.Linear `linear` and its kind, or (None, why it stays)."""
    weight = linear.weight
    if weight.device.type != "cpu":
        return None, f"weights on {weight.device.type}"
    if quantize == "w8a8_dynamic" and not any(match_layer_pattern(name, pattern)
                                              for pattern in keep_float):
        return quant.w8a8_dynamic_layer(linear), "w8a8_dynamic linears"
    if weight.dtype == torch.bfloat16 and bf16_on_torch:
        return None, ("bf16 weights: torch's bf16 GEMM is faster on this CPU (full-rate bf16 "
                      "dot products or AMX), ditops' FLOAT layers widen them to fp32 "
                      "(bf16_linears=\"ditops\" puts them on ditops)")
    # FLOAT: float32 or bfloat16 weights as they are (bf16 widened to fp32 in the packed
    # panels); float16 weights in float32.
    weight = weight.detach()
    if weight.dtype not in (torch.float32, torch.bfloat16):
        weight = weight.float()
    bias = linear.bias
    bias = None if bias is None else bias.detach().float().contiguous()
    return _ditops.QuantLinear.float_linear(weight.contiguous(), bias), "float linears"


def optimize(pipe_or_transformer, quantize=None, attention="dense", keep_float=KEEP_FLOAT,
             cache=None, bf16_linears="auto", **options):
    """Runs a diffusers pipeline's transformer(s) (or a transformer) on ditops in one call:
    enable(model, backend=attention, **options) (attention, q/k RMSNorms, rotary embeddings),
    then every nn.Linear on ditops' GEMM: with quantize=None as a FLOAT layer of its own
    weights (bf16 models stay bf16 at their interfaces), with quantize="w8a8_dynamic" as a W8A8
    dynamic layer, except the layers `keep_float` names (fnmatch patterns; default KEEP_FLOAT),
    which run as FLOAT layers. Returns an OptimizeReport; disable(model) undoes all of it (the
    original modules come back, bit for bit). The packed weights are held beside the model's
    own (fp32 panels: twice a bf16 model's weight memory, a quarter for w8a8).

    bf16_linears: where FLOAT layers of bf16 weights run. "auto" (default): on torch where the
    CPU runs bf16 GEMMs at twice its fp32 rate or more (ditops.cpu_info()["bf16_dot_full_rate"]:
    AMD Zen 4 and later, AMX-BF16), whose bf16 linears beat ditops' fp32 panels there; on ditops
    elsewhere. "ditops" or "torch" decide it; the report says which layers stay and why.

    cache: None, or a ditops.CacheConfig (MindIE-SD's step caching): one CacheAgent
    for the transformer, which "dit_block_cache" puts on every block's call (FLUX:
    transformer_blocks then single_transformer_blocks, one sequence; Wan: blocks) and
    "attention_cache" on every block's self-attention call (FLUX: attn; Wan: attn1). A step is
    one call of the transformer. cache.blocks_count must be the model's block count, or 0 for
    optimize to fill it in (in a copy: report.cache is the config the agent reads); any other
    value raises ValueError. A pipeline with two transformers is refused with cache= (each runs
    part of the steps: optimize each with its own steps_count). disable(model) restores the
    forwards the cache replaced."""
    if quantize not in _QUANTIZE:
        raise ValueError(f"ditops.diffusers.optimize: quantize {quantize!r} is not one of "
                         f"{list(_QUANTIZE)}")
    if isinstance(keep_float, str):
        keep_float = (keep_float,)
    bf16_on_torch = _bf16_on_torch(bf16_linears)
    models = _transformers(pipe_or_transformer)
    _internals.check_diffusers_version()
    agent = None
    if cache is not None:
        if len(models) > 1:
            raise ValueError("ditops.diffusers.optimize: cache= with a pipeline of two "
                             "transformers (transformer, transformer_2): each runs only part "
                             "of the steps, so optimize each with a CacheConfig of its own "
                             "steps_count (optimize(pipe.transformer, cache=...))")
        agent, config = cache_agent(models[0], cache)
    report = OptimizeReport(attention)
    for model in models:
        enable(model, backend=attention, **options)
        state = state_of(model)
        prefix = type(model).__name__ + "." if len(models) > 1 else ""
        report.on_ditops.setdefault("attention processors", []).extend(
            prefix + name for name in state.processors)
        if state.norms:
            report.on_ditops.setdefault("q/k norms", []).extend(
                f"{prefix}{type(module).__name__}.{attribute}"
                for module, attribute, _ in state.norms)
        if state.rope:
            report.on_ditops["rotary embedding"] = ["diffusers.models.embeddings."
                                                    "apply_rotary_emb (while enabled)"]
        linears = [(name, module) for name, module in model.named_modules()
                   if type(module) is torch.nn.Linear]
        for name, linear in linears:
            layer, kind = _linear_layer(name, linear, quantize, keep_float, bf16_on_torch)
            if layer is None:
                report.on_torch[prefix + name] = kind
                continue
            parent_name, _, attribute = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            state.linears.append((parent, attribute, linear))
            quant.hold_linears(model)
            setattr(parent, attribute, quant.QuantLinear(layer, name, linear.weight.dtype))
            report.on_ditops.setdefault(kind, []).append(prefix + name)
            report.weight_bytes += layer.weight_bytes
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and type(module) is not torch.nn.Linear:
                report.on_torch[prefix + name] = f"a {type(module).__name__}, not an nn.Linear"
        if agent is not None:
            report.cache = config
            report.on_ditops["step cache"] = apply_cache(model, state, agent, config.method)
    return report
