"""Every name of diffusers this integration uses, and the only module of ditops.diffusers that
imports diffusers. Imports are made on first use: `import ditops.diffusers` does not import
diffusers. diffusers' private names (underscored: its attention dispatcher's registry, the
processors' backend and parallel settings, the context-parallel meshes, the models' q/k/v
projection helpers) are listed in PRIVATE_NAMES and reached only through the functions here;
the tests check that each resolves at both ends of SUPPORTED_DIFFUSERS."""

import importlib
import os
import re

# The diffusers releases this integration supports, [lowest, first unsupported): it adds
# backends to diffusers' attention dispatcher, a private registry, so a release outside the range
# may differ where it matters. The tests run at both ends (the lowest, and the newest release
# below the bound).
SUPPORTED_DIFFUSERS = ((0, 37), (0, 43))

# (module, dotted name) of each private name used below; a processor's or a config's private
# attributes are named with their class.
PRIVATE_NAMES = (
    ("diffusers.models.attention_dispatch", "_AttentionBackendRegistry._active_backend"),
    ("diffusers.models.attention_dispatch", "_AttentionBackendRegistry._backends"),
    ("diffusers.models.attention_dispatch", "_check_device"),
    ("diffusers.models.attention_dispatch", "_check_shape"),
    ("diffusers.models.transformers.transformer_flux", "_get_qkv_projections"),
    ("diffusers.models.transformers.transformer_wan", "_get_qkv_projections"),
    ("diffusers.models.transformers.transformer_flux", "FluxAttnProcessor._attention_backend"),
    ("diffusers.models.transformers.transformer_flux", "FluxAttnProcessor._parallel_config"),
    ("diffusers", "ContextParallelConfig._ring_mesh"),
    ("diffusers", "ContextParallelConfig._ulysses_mesh"),
    ("diffusers", "ContextParallelConfig._flattened_mesh"),
    ("diffusers", "ContextParallelConfig._world_size"),
)


def _range_text():
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_DIFFUSERS
    return f">={low_major}.{low_minor},<{high_major}.{high_minor}"


def check_diffusers_version(version=None):
    """Raises RuntimeError naming the supported range unless `version` (default: the installed
    diffusers') is inside it. DITOPS_ANY_DIFFUSERS=1 in the environment skips the check, for
    trying a release the integration has not been tested with."""
    if version is None:
        import diffusers

        version = diffusers.__version__
    if os.environ.get("DITOPS_ANY_DIFFUSERS") == "1":
        return
    match = re.match(r"(\d+)\.(\d+)", str(version))
    release = (int(match.group(1)), int(match.group(2))) if match else None
    low, high = SUPPORTED_DIFFUSERS
    if release is None or not low <= release < high:
        raise RuntimeError(
            f"ditops.diffusers: diffusers {version} is outside the supported range "
            f"{_range_text()} (pip install 'diffusers{_range_text()}'); "
            "DITOPS_ANY_DIFFUSERS=1 tries it anyway")


def _dispatch():
    return importlib.import_module("diffusers.models.attention_dispatch")


def model_class(name):
    """diffusers' model class `name` (FluxTransformer2DModel, WanTransformer3DModel, ...), or
    None where this release has none."""
    import diffusers

    return getattr(diffusers, name, None)


def transformer_module(family):
    """diffusers.models.transformers.transformer_<family>."""
    return importlib.import_module(f"diffusers.models.transformers.transformer_{family}")


def attention_processor(name):
    """diffusers.models.attention_processor's processor class `name`."""
    return getattr(importlib.import_module("diffusers.models.attention_processor"), name)


def qkv_projections(family):
    """FLUX's or Wan's q, k, v projection helper f(attn, hidden_states,
    encoder_hidden_states) (fused or separate projection weights; the encoder's too where the
    model has them). Resolved once, by the processor class: torch.compile does not trace
    imports."""
    return transformer_module(family)._get_qkv_projections


def rms_norm_classes():
    """The RMSNorm module classes whose weight and eps ditops' RMSNorm takes over."""
    import torch
    from diffusers.models.normalization import RMSNorm

    return (torch.nn.RMSNorm, RMSNorm)


def rope_modules():
    """The modules whose `apply_rotary_emb` the models' processors call (embeddings first: its
    function is the original)."""
    return [importlib.import_module(name) for name in (
        "diffusers.models.embeddings", "diffusers.models.transformers.transformer_flux",
        "diffusers.models.attention_processor")]


def embeddings_module():
    """diffusers.models.embeddings, whose apply_rotary_emb the models call (ditops' while a
    model is enabled: read it at each call)."""
    return importlib.import_module("diffusers.models.embeddings")


def attention_dispatcher():
    """f(processor, q, k, v, attention_mask): diffusers' dispatcher on q, k, v [B, S, N, D]
    with the backend and the parallel config `processor` was given (model.set_attention_backend,
    enable_parallelism). Resolved once, by the processor class."""
    dispatch_attention_fn = _dispatch().dispatch_attention_fn

    def dispatch(processor, query, key, value, attention_mask):
        return dispatch_attention_fn(query, key, value, attn_mask=attention_mask,
                                     backend=processor._attention_backend,
                                     parallel_config=processor._parallel_config)

    return dispatch


def processor_backend(processor):
    return getattr(processor, "_attention_backend", None)


def set_processor_backend(processor, backend):
    processor._attention_backend = backend


def active_backend():
    return _dispatch()._AttentionBackendRegistry._active_backend


def set_active_backend(backend):
    _dispatch()._AttentionBackendRegistry.set_active_backend(backend)


def register_backend(name, function):
    """The dispatcher's AttentionBackendName member `name`, added to the enum (whose members
    set_attention_backend accepts) and registered with `function` on first use."""
    dispatch = _dispatch()
    names = dispatch.AttentionBackendName
    if name not in names._value2member_map_:
        member = str.__new__(names, name)
        member._name_, member._value_ = name.upper(), name
        setattr(names, name.upper(), member)
        names._member_map_[name.upper()] = member
        names._member_names_.append(name.upper())
        names._value2member_map_[name] = member
    member = names(name)
    registry = dispatch._AttentionBackendRegistry
    if member not in registry._backends:
        registry.register(member, constraints=[dispatch._check_device, dispatch._check_shape],
                          supports_context_parallel=True)(function)
    return member


def context_parallel_groups(parallel_config):
    """(ring group or None, Ulysses group or None, the whole group) of diffusers'
    ParallelConfig, or None when it does not parallelize the context (world size 1)."""
    config = None if parallel_config is None else parallel_config.context_parallel_config
    if config is None or config._world_size <= 1:
        return None
    ring = config._ring_mesh.get_group() if config.ring_degree > 1 else None
    ulysses = config._ulysses_mesh.get_group() if config.ulysses_degree > 1 else None
    return ring, ulysses, config._flattened_mesh.get_group()


def context_parallel_config(ring_degree, ulysses_degree):
    import diffusers

    return diffusers.ContextParallelConfig(ring_degree=ring_degree,
                                           ulysses_degree=ulysses_degree)
