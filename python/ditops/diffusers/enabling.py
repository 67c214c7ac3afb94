"""enable / disable: a diffusers transformer's attention, q/k norms and rotary embedding on
ditops, and back. What was replaced is kept in the model's State (in this module, by model:
is_optimized tells whether one exists), so disable restores the same objects."""

import contextlib
import dataclasses
import functools
import weakref

import torch

from .. import quant
from . import _internals, backends, models, norms


@dataclasses.dataclass
class State:
    """What enable (and optimize) replaced on one model: its processors by name and each one's
    backend, the dispatcher's active backend, the q/k norms [(module, attribute, original)],
    the linear layers likewise, forward pre-hooks, instance forwards [(module, forward or
    None)] and whether diffusers' rotary embedding is patched for it."""

    processors: dict
    backends: dict
    active: object
    norms: list = dataclasses.field(default_factory=list)
    linears: list = dataclasses.field(default_factory=list)
    hooks: list = dataclasses.field(default_factory=list)
    forwards: list = dataclasses.field(default_factory=list)
    rope: bool = False


_STATES = weakref.WeakKeyDictionary()


def is_optimized(model):
    """Whether enable() or optimize() is in effect on `model` (until disable(model))."""
    return model in _STATES


def state_of(model):
    """The State enable() keeps for `model` (which must be enabled)."""
    return _STATES[model]


def enable(model, backend="dense", sparsity=0.75, block_size=128, keep_sink=True,
           fuse_rope_and_norms=True):
    """Routes every attention of the diffusers transformer `model` through ditops: backend
    "dense" (flash attention), "int8" or "rainfusion" (the rf_v2 block choice at `sparsity` on
    the self-attention of video models, the first latent frame's blocks kept whole unless
    keep_sink=False; dense elsewhere). With fuse_rope_and_norms the q/k RMSNorms and rotary
    embeddings run on ditops too. Returns the model; disable(model) restores diffusers' own.
    Raises RuntimeError for a diffusers release outside SUPPORTED_DIFFUSERS
    (check_diffusers_version)."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "attn_processors"):
        raise TypeError(f"ditops.diffusers.enable: model must be a diffusers transformer, got "
                        f"{type(model).__name__}")
    if backend not in backends.BACKENDS:
        raise ValueError(f"ditops.diffusers.enable: backend \"{backend}\" is not one of "
                         f"{sorted(backends.BACKENDS)}")
    _internals.check_diffusers_version()
    if is_optimized(model):
        disable(model)
    name = backends.BACKENDS[backend]
    backends.register(name)
    processors = dict(model.attn_processors)
    state = State(processors, {id(p): _internals.processor_backend(p)
                               for p in processors.values()}, _internals.active_backend())
    swapped = models.ditops_processors(model, processors, fuse_rope_and_norms)
    if swapped is not None:
        model.set_attn_processor(swapped)
    model.set_attention_backend(name)
    # set_attention_backend also makes the backend every other model's default: only this
    # model's processors (which now name it) are to use ditops.
    _internals.set_active_backend(state.active)
    if fuse_rope_and_norms:
        state.norms = norms.swap_qk_norms(model)
        norms.patch_rope(True)
        state.rope = True
    if backend == "rainfusion":
        options = dict(sparsity=float(sparsity), block_size=int(block_size),
                       keep_sink=bool(keep_sink))
        layout = models.family_of(model).video_layout
        layout = (lambda hidden, text: None) if layout is None else functools.partial(
            layout, model.config)
        state.hooks.append(backends.rainfusion_hook(model, options, layout))
    _STATES[model] = state
    return model


def disable(model):
    """Restores diffusers' processors, attention backend, norms and rotary embedding, and the
    nn.Linear modules and the block / attention forwards optimize() replaced (the same objects:
    bit for bit)."""
    state = _STATES.pop(model, None)
    if state is None:
        return model
    for hook in state.hooks:
        hook.remove()
    for module, forward in reversed(state.forwards):
        if forward is None:
            vars(module).pop("forward", None)  # the class's forward again
        else:
            module.forward = forward
    for module, attribute, original in state.norms + state.linears:
        setattr(module, attribute, original)
    quant.hold_linears(model, False)
    if state.rope:
        norms.patch_rope(False)
    model.set_attn_processor(state.processors)
    for processor in model.attn_processors.values():
        if id(processor) in state.backends:
            _internals.set_processor_backend(processor, state.backends[id(processor)])
    _internals.set_active_backend(state.active)
    return model


@contextlib.contextmanager
def enabled(model, **options):
    """`with ditops.diffusers.enabled(model): ...` enables ditops for the block."""
    enable(model, **options)
    try:
        yield model
    finally:
        disable(model)


def enable_parallelism(model, ring_degree=1, ulysses_degree=1):
    """diffusers' context parallelism on the CPU: `model.enable_parallelism` with a
    ContextParallelConfig of these degrees (their product the world size of the initialized
    torch.distributed), after enable(model) so that every attention runs on
    ditops.distributed. diffusers picks the mesh's device from the accelerator count, which is 0
    on a CPU-only machine: during the call the CPU counts as one device. Returns the model."""
    if not is_optimized(model):
        raise ValueError("ditops.diffusers.enable_parallelism: call ditops.diffusers.enable(model) "
                         "first (the attention must run on ditops)")
    config = _internals.context_parallel_config(ring_degree, ulysses_degree)
    count = torch.accelerator.device_count
    if count() == 0:
        torch.accelerator.device_count = lambda: 1
    try:
        model.enable_parallelism(config=config)
    finally:
        torch.accelerator.device_count = count
    return model
