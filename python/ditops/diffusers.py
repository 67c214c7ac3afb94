"""ditops inside diffusers: `enable(model)` routes every attention of a diffusers transformer
(FLUX, Wan 2.x, CogVideoX, HunyuanVideo, and any model whose processors call diffusers'
attention dispatcher) through ditops, and its q/k RMSNorms and rotary embeddings too;
`disable(model)` restores diffusers' own.

How: ditops registers attention backends in diffusers' dispatcher registry under the names
"ditops" (dense), "ditops_int8" and "ditops_rainfusion" and selects one on the model's
processors (model.set_attention_backend). CogVideoX's processors call torch's SDPA directly, so
they are replaced by one that calls the dispatcher. The q/k RMSNorm modules become ditops
RMSNorms over the same weights. diffusers' `apply_rotary_emb` (FLUX, HunyuanVideo, CogVideoX) is
replaced, while any model is enabled, by the same math on ditops' kernel (falling back to
diffusers' own for the forms the kernel does not take); Wan's self-attention processor, whose
rotary embedding is local to it, is replaced by one that applies it on ditops. In Wan's
self-attention and FLUX's attention, whose q/k RMSNorms come right before the rotary embedding,
both run as one fused ditops pass (rms_norm_rotary_position_embedding)."""

import contextlib
import dataclasses
import functools
import inspect
import os
import re

import torch

from . import _ditops, ops, quant
from .quantization.utils import match_layer_pattern
from .rainfusion_v2 import rainfusion_v2_attention
from .step_cache import CacheAgent, CacheConfig

_BACKENDS = {"dense": "ditops", "int8": "ditops_int8", "rainfusion": "ditops_rainfusion"}

# The RainFusion options and the video layout of the model running now, set by its forward
# pre-hook from its own options and input: the backend function sees only q, k and v.
_rainfusion = {"sparsity": 0.75, "block_size": 128, "keep_sink": True, "layout": None}


# The diffusers releases this integration supports, [lowest, first unsupported): it adds
# backends to diffusers' attention dispatcher, a private registry, so a release outside the range
# may differ where it matters. The tests run at both ends (the lowest, and the newest release
# below the bound).
SUPPORTED_DIFFUSERS = ((0, 37), (0, 43))


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


def _diffusers():
    import diffusers.models.attention_dispatch as dispatch
    import diffusers.models.embeddings as embeddings

    return dispatch, embeddings


# ---- attention backends ------------------------------------------------------------------------


def _key_padding(attn_mask, query, key):
    """diffusers passes a 2-D mask [B, S_kv] as key padding (as its native backend reads it)."""
    if attn_mask is not None and attn_mask.ndim == 2 and tuple(attn_mask.shape) == (
            query.shape[0], key.shape[1]):
        return attn_mask[:, None, None, :]
    return attn_mask


def _checked(dropout_p):
    if dropout_p:
        raise ValueError(f"ditops attention: dropout_p ({dropout_p}) must be 0 (inference)")


def _lse_for_diffusers(result, return_lse):
    if not return_lse:
        return result
    out, lse = result
    return out, lse.transpose(1, 2)  # diffusers' lse is [B, S, N]


def _context_parallel(query, key, value, attn_mask, is_causal, scale, return_lse,
                      parallel_config):
    """One attention of a model under diffusers' context parallelism (enable_parallelism with
    a ContextParallelConfig): Ulysses over the config's Ulysses mesh, ring over its ring mesh,
    on ditops.distributed (dense: the block-sparse and int8 backends run it dense)."""
    from . import distributed

    if attn_mask is not None:
        raise NotImplementedError("ditops attention: an attention mask under diffusers' context "
                                  "parallelism is not supported")
    config = parallel_config.context_parallel_config
    ring = config._ring_mesh.get_group() if config.ring_degree > 1 else None
    ulysses = config._ulysses_mesh.get_group() if config.ulysses_degree > 1 else None
    return distributed.context_parallel_attention(query, key, value, ring, ulysses,
                                                  causal=is_causal, scale=scale,
                                                  return_lse=return_lse,
                                                  group=config._flattened_mesh.get_group())


def _parallel(parallel_config):
    return (parallel_config is not None
            and parallel_config.context_parallel_config is not None
            and parallel_config.context_parallel_config._world_size > 1)


def _flash_backend(backend):
    """The dispatcher's backend function for ditops' attention_forward with `backend`."""

    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, return_lse=False, _parallel_config=None):
        _checked(dropout_p)
        mask = _key_padding(attn_mask, query, key)
        if _parallel(_parallel_config):
            return _lse_for_diffusers(_context_parallel(query, key, value, mask, is_causal, scale,
                                                        return_lse, _parallel_config),
                                      return_lse)
        # torch's mask meaning (boolean keep or additive float): ditops' own attention call.
        return _lse_for_diffusers(ops._attention(query, key, value, mask, scale, is_causal, False,
                                                 backend, return_lse, None, 2), return_lse)

    return attention


_dense = _flash_backend("automatic")
_int8 = _flash_backend("int8")


def _rainfusion_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                          scale=None, enable_gqa=False, return_lse=False, _parallel_config=None):
    """RainFusion's adaptive blocks on self-attention over the model's whole token layout;
    every other attention (cross-attention, masked, causal) is dense."""
    _checked(dropout_p)
    layout = _rainfusion["layout"]
    tokens = None if layout is None else (
        layout["frames"] * layout["height"] * layout["width"] + layout["text"])
    if (tokens is None or attn_mask is not None or is_causal or return_lse
            or _parallel(_parallel_config) or query.shape[1] != tokens
            or not query.shape == key.shape == value.shape):
        return _dense(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                      return_lse, _parallel_config)
    # MindIE-SD's rf_v2 block choice (sparse_attention's) per batch entry, with the text on
    # the side the model puts it and keep_sink deciding whether the first frame is kept whole.
    return rainfusion_v2_attention(
        query, key, value, [layout["frames"], layout["height"], layout["width"]],
        layout["text"], layout["text_first"], _rainfusion["sparsity"],
        _rainfusion["block_size"], scale, head_first=False,
        protect_first_frame=_rainfusion["keep_sink"])


_FUNCTIONS = {"ditops": _dense, "ditops_int8": _int8, "ditops_rainfusion": _rainfusion_attention}


def _backend_member(name):
    """The dispatcher's AttentionBackendName member `name`, added to the enum (whose members
    set_attention_backend accepts) and registered on first use."""
    dispatch, _ = _diffusers()
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
                          supports_context_parallel=True)(_FUNCTIONS[name])
    return member


# ---- q/k RMSNorm ---------------------------------------------------------------------------------


class _RMSNorm(torch.nn.Module):
    """A model's torch.nn.RMSNorm or diffusers RMSNorm, on ditops: the same weight (shared,
    not copied) and eps."""

    def __init__(self, original):
        super().__init__()
        self.original = [original]  # not a submodule: state_dict keeps the model's own names
        self.weight = original.weight
        self.eps = original.eps  # None: torch.nn.RMSNorm's default, the input dtype's epsilon

    def forward(self, x):
        weight = self.weight
        if weight.dtype not in (x.dtype, torch.float32):
            weight = weight.to(x.dtype)
        eps = torch.finfo(x.dtype).eps if self.eps is None else float(self.eps)
        return ops.rms_norm(x, weight, eps)


def _is_rms_norm(module):
    from diffusers.models.normalization import RMSNorm

    return isinstance(module, (torch.nn.RMSNorm, RMSNorm)) and getattr(
        module, "weight", None) is not None


_QK_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")


# ---- rotary embeddings ---------------------------------------------------------------------------

_rope_users = 0
_original_rope = {}


def _ditops_apply_rotary_emb(x, freqs_cis, use_real=True, use_real_unbind_dim=-1,
                             sequence_dim=2):
    """diffusers' apply_rotary_emb on ditops for its common form (real cos/sin [S, D],
    interleaved pairs, sequence dim 1 or 2): the same fp32 math, rounded once."""
    original = _original_rope["function"]
    if (not use_real or use_real_unbind_dim != -1 or sequence_dim not in (1, 2)
            or not isinstance(freqs_cis, (tuple, list)) or x.ndim != 4
            or x.dtype not in (torch.float32, torch.bfloat16, torch.float16)):
        return original(x, freqs_cis, use_real, use_real_unbind_dim, sequence_dim)
    cos, sin = freqs_cis
    if cos.ndim != 2 or cos.dtype not in (torch.float32, x.dtype):
        return original(x, freqs_cis, use_real, use_real_unbind_dim, sequence_dim)
    return ops.rotary_position_embedding(x, cos, sin, rotated_mode="rotated_interleaved",
                                         head_first=sequence_dim == 2)


def _rope_modules():
    import diffusers.models.attention_processor as processors
    import diffusers.models.transformers.transformer_flux as flux

    _, embeddings = _diffusers()
    return [embeddings, flux, processors]


def _patch_rope(enable):
    global _rope_users
    _rope_users += 1 if enable else -1
    modules = _rope_modules()
    if enable and _rope_users == 1:
        _original_rope["function"] = modules[0].apply_rotary_emb
        for module in modules:
            module.apply_rotary_emb = _ditops_apply_rotary_emb
    elif not enable and _rope_users == 0:
        for module in modules:
            module.apply_rotary_emb = _original_rope["function"]


def _rms_norm_weight_eps(norm, x):
    """(weight, eps) of a q/k norm that is an RMSNorm with a weight (a model's own, or the
    ditops _RMSNorm over it) as ops take them for x, else None."""
    if not isinstance(norm, _RMSNorm) and not _is_rms_norm(norm):
        return None
    weight = norm.weight
    if weight.dtype not in (x.dtype, torch.float32):
        weight = weight.to(x.dtype)
    eps = torch.finfo(x.dtype).eps if norm.eps is None else float(norm.eps)
    return weight, eps


def _norm_then_rope(norm, x, heads, cos, sin):
    """norm(x) unflattened to [B, S, heads, D], then Wan's (interleaved) rotary embedding: one
    fused ditops pass when norm is an RMSNorm with a weight (over each head or, as in Wan, over
    the whole inner dimension), else the norm module then ditops' rotary embedding."""
    params = _rms_norm_weight_eps(norm, x)
    if (params is None or params[0].ndim != 1
            or params[0].shape[0] not in (x.shape[-1], x.shape[-1] // heads)):
        x = norm(x).unflatten(2, (heads, -1))
        return ops.rotary_position_embedding(x, cos, sin, "rotated_interleaved")
    weight, eps = params
    return ops.rms_norm_rotary_position_embedding(x.unflatten(2, (heads, -1)), weight, cos, sin,
                                                  eps, "rotated_interleaved")


def _wan_processor_class():
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    class WanDitopsAttnProcessor(WanAttnProcessor):
        """Wan's self-attention processor with its rotary embedding on ditops (freqs laid out
        c0, c0, c1, c1, ...: interleaved pairs, computed in fp32), fused with the q/k RMSNorm
        before it where that is an RMSNorm with a weight. Cross-attention and image (I2V)
        attention go to Wan's own processor."""

        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                     rotary_emb=None):
            if (encoder_hidden_states is not None or rotary_emb is None
                    or attn.add_k_proj is not None):
                return super().__call__(attn, hidden_states, encoder_hidden_states,
                                        attention_mask, rotary_emb)
            from diffusers.models.transformers.transformer_wan import _get_qkv_projections

            query, key, value = _get_qkv_projections(attn, hidden_states, None)
            value = value.unflatten(2, (attn.heads, -1))
            cos, sin = (f.reshape(f.shape[1], f.shape[3]) for f in rotary_emb)
            query = _norm_then_rope(attn.norm_q, query, attn.heads, cos, sin)
            key = _norm_then_rope(attn.norm_k, key, attn.heads, cos, sin)
            dispatch, _ = _diffusers()
            hidden_states = dispatch.dispatch_attention_fn(
                query, key, value, attn_mask=attention_mask, backend=self._attention_backend,
                parallel_config=self._parallel_config)
            hidden_states = hidden_states.flatten(2, 3).type_as(query)
            return attn.to_out[1](attn.to_out[0](hidden_states))

    return WanDitopsAttnProcessor


def _flux_processor_class():
    from diffusers.models.transformers.transformer_flux import (
        FluxAttnProcessor,
        _get_qkv_projections,
    )

    def per_head_params(norm, x, head_dim):
        params = _rms_norm_weight_eps(norm, x)
        if params is None or tuple(params[0].shape) != (head_dim,):
            return None
        return params

    class FluxDitopsAttnProcessor(FluxAttnProcessor):
        """FLUX's attention processor with each q/k RMSNorm (per head) and the rotary embedding
        after it in one fused ditops pass per segment: the text tokens (norm_added_q/k, the
        first rows of the tables) and the image tokens (norm_q/k, the rest), written into the
        concatenated q and k. Forms the fused op does not take (no rotary embedding, norms that
        are not RMSNorms with a [head_dim] weight, tables that are not real [S, D] pairs) go to
        FLUX's own processor."""

        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                     image_rotary_emb=None):
            original = super().__call__
            if (image_rotary_emb is None or not isinstance(image_rotary_emb, (tuple, list))
                    or image_rotary_emb[0].ndim != 2 or hidden_states.dtype not in (
                        torch.float32, torch.bfloat16, torch.float16)):
                return original(attn, hidden_states, encoder_hidden_states, attention_mask,
                                image_rotary_emb)
            joint = attn.added_kv_proj_dim is not None
            norms = [attn.norm_q, attn.norm_k] + (
                [attn.norm_added_q, attn.norm_added_k] if joint else [])
            params = [per_head_params(norm, hidden_states, attn.head_dim) for norm in norms]
            if any(p is None for p in params) or (joint and encoder_hidden_states is None):
                return original(attn, hidden_states, encoder_hidden_states, attention_mask,
                                image_rotary_emb)
            dispatch, _ = _diffusers()
            query, key, value, encoder_query, encoder_key, encoder_value = (
                _get_qkv_projections(attn, hidden_states, encoder_hidden_states))
            cos, sin = image_rotary_emb

            def fused(x, index, rows, out=None):
                weight, eps = params[index]
                return ops.rms_norm_rotary_position_embedding(
                    x.unflatten(-1, (-1, attn.head_dim)), weight, cos[rows], sin[rows], eps,
                    "rotated_interleaved", out=out)

            value = value.unflatten(-1, (-1, attn.head_dim))
            if joint:
                text = encoder_query.shape[1]
                batch, tokens = query.shape[0], text + query.shape[1]
                heads = query.shape[-1] // attn.head_dim
                joined = []
                for image, encoder, index in ((query, encoder_query, 0), (key, encoder_key, 1)):
                    both = image.new_empty(batch, tokens, heads, attn.head_dim)
                    fused(encoder, index + 2, slice(0, text), out=both[:, :text])
                    fused(image, index, slice(text, tokens), out=both[:, text:])
                    joined.append(both)
                query, key = joined
                value = torch.cat([encoder_value.unflatten(-1, (-1, attn.head_dim)), value], 1)
            else:
                rows = slice(0, query.shape[1])
                query, key = fused(query, 0, rows), fused(key, 1, rows)
            hidden_states = dispatch.dispatch_attention_fn(
                query, key, value, attn_mask=attention_mask, backend=self._attention_backend,
                parallel_config=self._parallel_config)
            hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
            if encoder_hidden_states is None:
                return hidden_states
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [text, hidden_states.shape[1] - text], dim=1)
            hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states.contiguous())
            return hidden_states, encoder_hidden_states

    return FluxDitopsAttnProcessor


def _cogvideox_processor_class():
    _, embeddings = _diffusers()

    class CogVideoXDitopsAttnProcessor:
        """CogVideoX's joint attention (text first, rotary embedding on the video tokens)
        through diffusers' dispatcher, where the original calls torch's SDPA."""

        _attention_backend = None
        _parallel_config = None

        def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None,
                     image_rotary_emb=None):
            dispatch, embeddings = _diffusers()
            text = encoder_hidden_states.size(1)
            hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
            batch, tokens, _ = hidden_states.shape
            if attention_mask is not None:
                attention_mask = attn.prepare_attention_mask(attention_mask, tokens, batch)
                attention_mask = attention_mask.view(batch, attn.heads, -1,
                                                     attention_mask.shape[-1])
            query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
            key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
            value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            if image_rotary_emb is not None:
                rope = embeddings.apply_rotary_emb
                query = torch.cat([query[:, :text],
                                   rope(query[:, text:], image_rotary_emb, sequence_dim=1)], 1)
                if not attn.is_cross_attention:
                    key = torch.cat([key[:, :text],
                                     rope(key[:, text:], image_rotary_emb, sequence_dim=1)], 1)
            out = dispatch.dispatch_attention_fn(query, key, value, attn_mask=attention_mask,
                                                 backend=self._attention_backend,
                                                 parallel_config=self._parallel_config)
            out = attn.to_out[1](attn.to_out[0](out.flatten(2, 3).to(query.dtype)))
            encoder_hidden_states, hidden_states = out.split([text, out.size(1) - text], dim=1)
            return hidden_states, encoder_hidden_states

    return CogVideoXDitopsAttnProcessor


# ---- the video layout RainFusion needs ------------------------------------------------------------


def _layout_hook(model, options):
    """A forward pre-hook that sets the model's RainFusion options and the token layout of its
    self-attention from its input (video models: hidden_states [B, C, F, H, W] or CogVideoX's
    [B, F, C, H, W])."""
    name = type(model).__name__
    config = model.config

    def hook(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        text = kwargs.get("encoder_hidden_states")
        layout = None
        if hidden is not None and hidden.ndim == 5:
            patch = config.patch_size
            if name == "WanTransformer3DModel":
                (pt, ph, pw), (f, h, w) = patch, hidden.shape[2:]
                layout = dict(frames=f // pt, height=h // ph, width=w // pw, text=0,
                              text_first=True)
            elif name == "HunyuanVideoTransformer3DModel":
                pt, (f, h, w) = config.patch_size_t, hidden.shape[2:]
                layout = dict(frames=f // pt, height=h // patch, width=w // patch,
                              text=text.shape[1] if text is not None else 0, text_first=False)
            elif name == "CogVideoXTransformer3DModel":
                f, (h, w) = hidden.shape[1], hidden.shape[3:]
                layout = dict(frames=f, height=h // patch, width=w // patch,
                              text=text.shape[1] if text is not None else 0, text_first=True)
        _rainfusion.update(options, layout=layout)

    return model.register_forward_pre_hook(hook, with_kwargs=True)


# ---- enable / disable ------------------------------------------------------------------------------


def enable(model, backend="dense", sparsity=0.75, block_size=128, keep_sink=True,
           fuse_rope_and_norms=True):
    """Routes every attention of the diffusers transformer `model` through ditops: backend
    "dense" (flash attention), "int8" or "rainfusion" (RainFusion's adaptive blocks at
    `sparsity` on the self-attention of video models, the first latent frame's blocks kept
    whole unless keep_sink=False; dense elsewhere). With
    fuse_rope_and_norms the q/k RMSNorms and rotary embeddings run on ditops too. Returns the
    model; disable(model) restores diffusers' own. Raises RuntimeError for a diffusers release
    outside SUPPORTED_DIFFUSERS (check_diffusers_version)."""
    if backend not in _BACKENDS:
        raise ValueError(f"ditops.diffusers.enable: backend \"{backend}\" is not one of "
                         f"{sorted(_BACKENDS)}")
    check_diffusers_version()
    if getattr(model, "_ditops_state", None) is not None:
        disable(model)
    dispatch, _ = _diffusers()
    name = _BACKENDS[backend]
    _backend_member(name)
    processors = dict(model.attn_processors)
    state = {"processors": processors,
             "active": dispatch._AttentionBackendRegistry._active_backend,
             "backends": {id(p): getattr(p, "_attention_backend", None)
                          for p in processors.values()},
             "norms": [], "linears": [], "hooks": [], "rope": False, "forwards": []}
    if type(model).__name__ == "CogVideoXTransformer3DModel":
        model.set_attn_processor(_cogvideox_processor_class()())
    if fuse_rope_and_norms and type(model).__name__ == "WanTransformer3DModel":
        processor_class = _wan_processor_class()
        model.set_attn_processor({key: processor_class() if key.endswith("attn1.processor")
                                  else value for key, value in state["processors"].items()})
    if fuse_rope_and_norms and type(model).__name__ == "FluxTransformer2DModel":
        processor_class = _flux_processor_class()
        model.set_attn_processor({key: processor_class() for key in state["processors"]})
    model.set_attention_backend(name)
    # set_attention_backend also makes the backend every other model's default: only this
    # model's processors (which now name it) are to use ditops.
    dispatch._AttentionBackendRegistry.set_active_backend(state["active"])
    if fuse_rope_and_norms:
        for module in model.modules():
            for attribute in _QK_NORMS:
                norm = getattr(module, attribute, None)
                if norm is not None and _is_rms_norm(norm):
                    setattr(module, attribute, _RMSNorm(norm))
                    state["norms"].append((module, attribute, norm))
        _patch_rope(True)
        state["rope"] = True
    if backend == "rainfusion":
        options = dict(sparsity=float(sparsity), block_size=int(block_size),
                       keep_sink=bool(keep_sink))
        state["hooks"].append(_layout_hook(model, options))
    model._ditops_state = state
    return model


def disable(model):
    """Restores diffusers' processors, attention backend, norms and rotary embedding, and the
    nn.Linear modules and the block / attention forwards optimize() replaced (the same objects:
    bit for bit)."""
    state = getattr(model, "_ditops_state", None)
    if state is None:
        return model
    dispatch, _ = _diffusers()
    for hook in state["hooks"]:
        hook.remove()
    for module, forward in reversed(state["forwards"]):
        if forward is None:
            vars(module).pop("forward", None)  # the class's forward again
        else:
            module.forward = forward
    for module, attribute, norm in state["norms"]:
        setattr(module, attribute, norm)
    for module, attribute, linear in state["linears"]:
        setattr(module, attribute, linear)
    quant.hold_linears(model, False)
    if state["rope"]:
        _patch_rope(False)
    model.set_attn_processor(state["processors"])
    for processor in model.attn_processors.values():
        if id(processor) in state["backends"]:
            processor._attention_backend = state["backends"][id(processor)]
    dispatch._AttentionBackendRegistry.set_active_backend(state["active"])
    model._ditops_state = None
    return model


def enable_parallelism(model, ring_degree=1, ulysses_degree=1):
    """diffusers' context parallelism on the CPU: `model.enable_parallelism` with a
    ContextParallelConfig of these degrees (their product the world size of the initialized
    torch.distributed), after enable(model) so that every attention runs on
    ditops.distributed. diffusers picks the mesh's device from the accelerator count, which is 0
    on a CPU-only machine: during the call the CPU counts as one device. Returns the model."""
    import diffusers

    if getattr(model, "_ditops_state", None) is None:
        raise ValueError("ditops.diffusers.enable_parallelism: call ditops.diffusers.enable(model) "
                         "first (the attention must run on ditops)")
    config = diffusers.ContextParallelConfig(ring_degree=ring_degree,
                                             ulysses_degree=ulysses_degree)
    count = torch.accelerator.device_count
    if count() == 0:
        torch.accelerator.device_count = lambda: 1
    try:
        model.enable_parallelism(config=config)
    finally:
        torch.accelerator.device_count = count
    return model


# ---- step caching: MindIE-SD's CacheAgent on a model's blocks ------------------------------------

# The transformers cache= knows: (the block lists in the order the model's forward runs them,
# one sequence of blocks; the attribute of each block's self-attention, which attention_cache
# wraps; whether the blocks return (encoder_hidden_states, hidden_states), the reverse of the
# order DiTBlockCache pairs with its inputs). diffusers 0.37 to 0.42 call FLUX's blocks by keyword
# and Wan's by position (and both by position under gradient checkpointing, with gradients on).
_CACHE_SITES = {
    "FluxTransformer2DModel": (("transformer_blocks", "single_transformer_blocks"), "attn",
                               True),
    "WanTransformer3DModel": (("blocks",), "attn1", False),
}


def _cache_sites(model):
    """[(name, block)] of `model` in call order, its self-attention attribute and whether its
    blocks return the encoder stream first; ValueError for a model cache= does not know."""
    name = type(model).__name__
    if name not in _CACHE_SITES:
        raise ValueError(f"ditops.diffusers.optimize: cache= supports {sorted(_CACHE_SITES)}, "
                         f"not {name}")
    lists, attention, encoder_first = _CACHE_SITES[name]
    blocks = [(f"{attribute}.{index}", block) for attribute in lists
              for index, block in enumerate(getattr(model, attribute))]
    return blocks, attention, encoder_first


def _cache_config(cache, model, blocks_count):
    """The CacheConfig optimize's agent reads: `cache` itself, or a copy with the model's
    blocks_count where cache gives 0. Any other blocks_count than the model's raises."""
    if not isinstance(cache, CacheConfig):
        raise ValueError("ditops.diffusers.optimize: cache must be None or a "
                         f"ditops.mindiesd.CacheConfig, not {type(cache).__name__}")
    if isinstance(cache.blocks_count, int) and cache.blocks_count == 0:
        return dataclasses.replace(cache, blocks_count=blocks_count)
    if cache.blocks_count != blocks_count:
        raise ValueError(f"ditops.diffusers.optimize: cache.blocks_count is "
                         f"{cache.blocks_count!r}, but {type(model).__name__} runs "
                         f"{blocks_count} blocks per call (one agent call each): give "
                         f"{blocks_count}, or 0 to have optimize fill it in")
    return cache


def _positional_names(module):
    """The names of the leading parameters of module's class forward that a caller can pass by
    position (Wan's model loop passes its blocks' arguments so)."""
    parameters = list(inspect.signature(type(module).forward).parameters.values())[1:]
    names = []
    for parameter in parameters:
        if parameter.kind is not parameter.POSITIONAL_OR_KEYWORD:
            break
        names.append(parameter.name)
    return names


def _cached_block_forward(agent, block, forward, encoder_first):
    """block's forward through agent (dit_block_cache): every argument by keyword, as
    DiTBlockCache takes hidden_states and encoder_hidden_states; a block returning
    (encoder_hidden_states, hidden_states) is seen by the agent as (hidden_states,
    encoder_hidden_states), and its callers get their order back."""
    names = _positional_names(block)

    def run(*leading, **kwargs):  # DiTBlockCache passes the two streams by position
        kwargs.update(zip(("hidden_states", "encoder_hidden_states"), leading))
        out = forward(**kwargs)
        return (out[1], out[0]) if encoder_first else out

    @functools.wraps(forward)
    def cached_forward(*args, **kwargs):
        if len(args) > len(names):
            raise TypeError(f"{type(block).__name__}.forward takes {len(names)} positional "
                            f"arguments, {len(args)} given")
        for name, value in zip(names, args):
            if name in kwargs:
                raise TypeError(f"{type(block).__name__}.forward got multiple values for "
                                f"argument {name!r}")
            kwargs[name] = value
        out = agent.apply(run, **kwargs)
        return (out[1], out[0]) if encoder_first else out

    return cached_forward


def _cached_attention_forward(agent, forward):
    """An attention's forward through agent (attention_cache), its arguments as given."""

    @functools.wraps(forward)
    def cached_forward(*args, **kwargs):
        return agent.apply(forward, *args, **kwargs)

    return cached_forward


def _cache_agent(model, cache):
    """(the CacheAgent optimize puts on `model` for `cache`, the config it reads), built and
    checked before anything of the model changes."""
    blocks, _, _ = _cache_sites(model)
    config = _cache_config(cache, model, len(blocks))
    return CacheAgent(config), config  # the agent checks the rest (ConfigError, a ValueError)


def _apply_cache(model, state, agent, method):
    """Routes every block's call (dit_block_cache) or every block's self-attention call
    (attention_cache) of `model` through `agent`, keeping each instance forward it replaces
    (None: the class's) in the model's state for disable. Returns the wrapped modules' names."""
    blocks, attention, encoder_first = _cache_sites(model)
    names = []
    for name, block in blocks:
        if method == "dit_block_cache":
            module = block
            forward = _cached_block_forward(agent, block, block.forward, encoder_first)
        else:
            name, module = f"{name}.{attention}", getattr(block, attention)
            forward = _cached_attention_forward(agent, module.forward)
        state["forwards"].append((module, module.__dict__.get("forward")))
        module.forward = forward
        names.append(name)
    return names


# ---- one call for a model or a pipeline ------------------------------------------------------

# Linear layers quantize="w8a8_dynamic" keeps in floating point (they still run on ditops):
# the embedders (patch, text, timestep), the modulation (the AdaLN linears that produce scale,
# shift and gate), the timestep projections and the final projection. Their inputs or outputs
# set every token's scale, and they cost little of the forward.
KEEP_FLOAT = quant.KEEP_FLOAT

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

    cache: None, or a ditops.mindiesd.CacheConfig (MindIE-SD's step caching): one CacheAgent
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
    check_diffusers_version()
    agent = None
    if cache is not None:
        if len(models) > 1:
            raise ValueError("ditops.diffusers.optimize: cache= with a pipeline of two "
                             "transformers (transformer, transformer_2): each runs only part "
                             "of the steps, so optimize each with a CacheConfig of its own "
                             "steps_count (optimize(pipe.transformer, cache=...))")
        agent, config = _cache_agent(models[0], cache)
    report = OptimizeReport(attention)
    for model in models:
        enable(model, backend=attention, **options)
        state = model._ditops_state
        prefix = type(model).__name__ + "." if len(models) > 1 else ""
        report.on_ditops.setdefault("attention processors", []).extend(
            prefix + name for name in state["processors"])
        if state["norms"]:
            report.on_ditops.setdefault("q/k norms", []).extend(
                f"{prefix}{type(module).__name__}.{attribute}"
                for module, attribute, _ in state["norms"])
        if state["rope"]:
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
            state["linears"].append((parent, attribute, linear))
            quant.hold_linears(model)
            setattr(parent, attribute, quant.QuantLinear(layer, name, linear.weight.dtype))
            report.on_ditops.setdefault(kind, []).append(prefix + name)
            report.weight_bytes += layer.weight_bytes
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and type(module) is not torch.nn.Linear:
                report.on_torch[prefix + name] = f"a {type(module).__name__}, not an nn.Linear"
        if agent is not None:
            report.cache = config
            report.on_ditops["step cache"] = _apply_cache(model, state, agent, config.method)
    return report


@contextlib.contextmanager
def enabled(model, **options):
    """`with ditops.diffusers.enabled(model): ...` enables ditops for the block."""
    enable(model, **options)
    try:
        yield model
    finally:
        disable(model)


__all__ = ["enable", "disable", "enabled", "enable_parallelism", "optimize", "OptimizeReport",
           "KEEP_FLOAT", "check_diffusers_version", "SUPPORTED_DIFFUSERS"]
