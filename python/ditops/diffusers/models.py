"""One adapter per diffusers model family, found by the model's class: which attention
processors ditops replaces (FLUX's and Wan's, to fuse the q/k RMSNorm with the rotary
embedding; CogVideoX's, which call torch's SDPA instead of diffusers' dispatcher), where a video
model's tokens lie (RainFusion's layout), and which blocks step caching wraps. A model of
another family runs on ditops through the dispatcher alone."""

import dataclasses
from typing import Callable, Optional

import torch

from .. import ops
from . import _internals
from .norms import norm_then_rope, rms_norm_weight_eps


@dataclasses.dataclass(frozen=True)
class CacheSites:
    """Where step caching hooks in: the block lists in the order the model's forward runs them
    (one sequence of blocks), the attribute of each block's self-attention (attention_cache
    wraps it), and whether the blocks return (encoder_hidden_states, hidden_states), the
    reverse of the order DiTBlockCache pairs with its inputs."""

    block_lists: tuple
    attention: str
    encoder_first: bool


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family: its diffusers class name; processors(fuse) -> {processor class: ditops
    processor factory} (what enable replaces; fuse: fuse_rope_and_norms); video_layout(config,
    hidden_states, encoder_hidden_states) -> the layout dict RainFusion reads, or None; its
    cache sites, or None."""

    class_name: str
    processors: Callable = lambda fuse: {}
    video_layout: Optional[Callable] = None
    cache_sites: Optional[CacheSites] = None


# ---- FLUX ----------------------------------------------------------------------------------------


def _flux_processors(fuse):
    if not fuse:
        return {}
    flux = _internals.transformer_module("flux")
    qkv_projections = _internals.qkv_projections("flux")
    dispatch = _internals.attention_dispatcher()

    def per_head_params(norm, x, head_dim):
        params = rms_norm_weight_eps(norm, x)
        if params is None or tuple(params[0].shape) != (head_dim,):
            return None
        return params

    class FluxDitopsAttnProcessor(flux.FluxAttnProcessor):
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
            query, key, value, encoder_query, encoder_key, encoder_value = (
                qkv_projections(attn, hidden_states, encoder_hidden_states))
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
            hidden_states = dispatch(self, query, key, value, attention_mask)
            hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
            if encoder_hidden_states is None:
                return hidden_states
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [text, hidden_states.shape[1] - text], dim=1)
            hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states.contiguous())
            return hidden_states, encoder_hidden_states

    return {flux.FluxAttnProcessor: FluxDitopsAttnProcessor}


# ---- Wan -----------------------------------------------------------------------------------------


def _wan_processors(fuse):
    if not fuse:
        return {}
    wan = _internals.transformer_module("wan")
    qkv_projections = _internals.qkv_projections("wan")
    dispatch = _internals.attention_dispatcher()

    class WanDitopsAttnProcessor(wan.WanAttnProcessor):
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
            query, key, value = qkv_projections(attn, hidden_states, None)
            value = value.unflatten(2, (attn.heads, -1))
            cos, sin = (f.reshape(f.shape[1], f.shape[3]) for f in rotary_emb)
            query = norm_then_rope(attn.norm_q, query, attn.heads, cos, sin)
            key = norm_then_rope(attn.norm_k, key, attn.heads, cos, sin)
            hidden_states = dispatch(self, query, key, value, attention_mask)
            hidden_states = hidden_states.flatten(2, 3).type_as(query)
            return attn.to_out[1](attn.to_out[0](hidden_states))

    return {wan.WanAttnProcessor: WanDitopsAttnProcessor}


def _wan_layout(config, hidden, text):
    (pt, ph, pw), (f, h, w) = config.patch_size, hidden.shape[2:]
    return dict(frames=f // pt, height=h // ph, width=w // pw, text=0, text_first=True)


# ---- CogVideoX and HunyuanVideo ------------------------------------------------------------------


def _cogvideox_processors(fuse):
    dispatch = _internals.attention_dispatcher()
    embeddings = _internals.embeddings_module()
    class CogVideoXDitopsAttnProcessor:
        """CogVideoX's joint attention (text first, rotary embedding on the video tokens)
        through diffusers' dispatcher, where the original calls torch's SDPA."""

        _attention_backend = None
        _parallel_config = None

        def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None,
                     image_rotary_emb=None):
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
            out = dispatch(self, query, key, value, attention_mask)
            out = attn.to_out[1](attn.to_out[0](out.flatten(2, 3).to(query.dtype)))
            encoder_hidden_states, hidden_states = out.split([text, out.size(1) - text], dim=1)
            return hidden_states, encoder_hidden_states

    return {_internals.attention_processor("CogVideoXAttnProcessor2_0"):
            CogVideoXDitopsAttnProcessor}


def _cogvideox_layout(config, hidden, text):
    f, (h, w) = hidden.shape[1], hidden.shape[3:]
    return dict(frames=f, height=h // config.patch_size, width=w // config.patch_size,
                text=text.shape[1] if text is not None else 0, text_first=True)


def _hunyuan_layout(config, hidden, text):
    pt, (f, h, w) = config.patch_size_t, hidden.shape[2:]
    return dict(frames=f // pt, height=h // config.patch_size, width=w // config.patch_size,
                text=text.shape[1] if text is not None else 0, text_first=False)


FAMILIES = (
    Family("FluxTransformer2DModel", _flux_processors,
           cache_sites=CacheSites(("transformer_blocks", "single_transformer_blocks"), "attn",
                                  True)),
    Family("WanTransformer3DModel", _wan_processors, _wan_layout,
           CacheSites(("blocks",), "attn1", False)),
    Family("CogVideoXTransformer3DModel", _cogvideox_processors, _cogvideox_layout),
    Family("HunyuanVideoTransformer3DModel", video_layout=_hunyuan_layout),
)

_OTHER = Family("")


def family_of(model):
    """The family of `model` (by its class: subclasses of a family's model included), or one
    that changes nothing but the attention backend."""
    for family in FAMILIES:
        cls = _internals.model_class(family.class_name)
        if cls is not None and isinstance(model, cls):
            return family
    return _OTHER


def ditops_processors(model, processors, fuse):
    """`processors` (the model's, by name) with those of a class its family replaces swapped
    for ditops' (one new processor each), or None when the family replaces none."""
    replace = family_of(model).processors(fuse)
    if not replace:
        return None
    swapped = {}
    for name, processor in processors.items():
        factory = next((new for old, new in replace.items() if isinstance(processor, old)), None)
        swapped[name] = processor if factory is None else factory()
    return swapped
