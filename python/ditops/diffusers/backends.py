"""ditops' attention backends in diffusers' dispatcher: "ditops" (dense flash attention),
"ditops_int8" and "ditops_rainfusion" (the rf_v2 block choice on video models' self-attention,
dense elsewhere). A backend function sees only q, k, v and the dispatcher's arguments: the
RainFusion options and video layout of the model running now are set by that model's forward
pre-hook (rainfusion_hook)."""

from .. import distributed, ops
from ..rainfusion_v2 import rainfusion_v2_attention
from . import _internals

# enable()'s backend argument -> the dispatcher's backend name.
BACKENDS = {"dense": "ditops", "int8": "ditops_int8", "rainfusion": "ditops_rainfusion"}

# The RainFusion options and the video layout of the model running now (rainfusion_hook).
_rainfusion = {"sparsity": 0.75, "block_size": 128, "keep_sink": True, "layout": None}


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


def _context_parallel(query, key, value, attn_mask, is_causal, scale, return_lse, groups):
    """One attention of a model under diffusers' context parallelism (enable_parallelism with
    a ContextParallelConfig): Ulysses over the config's Ulysses mesh, ring over its ring mesh,
    on ditops.distributed (dense: the block-sparse and int8 backends run it dense)."""
    if attn_mask is not None:
        raise NotImplementedError("ditops attention: an attention mask under diffusers' context "
                                  "parallelism is not supported")
    ring, ulysses, whole = groups
    return distributed.context_parallel_attention(query, key, value, ring, ulysses,
                                                  causal=is_causal, scale=scale,
                                                  return_lse=return_lse, group=whole)


def _flash_backend(backend):
    """The dispatcher's backend function for ditops' attention with `backend`."""

    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, return_lse=False, _parallel_config=None):
        _checked(dropout_p)
        mask = _key_padding(attn_mask, query, key)
        groups = _internals.context_parallel_groups(_parallel_config)
        if groups is not None:
            return _lse_for_diffusers(_context_parallel(query, key, value, mask, is_causal, scale,
                                                        return_lse, groups), return_lse)
        # torch's mask meaning (boolean keep or additive float): ditops' own attention call.
        return _lse_for_diffusers(ops._attention(query, key, value, mask, scale, is_causal, False,
                                                 backend, return_lse, None, 2), return_lse)

    return attention


_dense = _flash_backend("automatic")
_int8 = _flash_backend("int8")


def _rainfusion_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                          scale=None, enable_gqa=False, return_lse=False, _parallel_config=None):
    """The rf_v2 block choice on self-attention over the model's whole token layout; every
    other attention (cross-attention, masked, causal) is dense."""
    _checked(dropout_p)
    layout = _rainfusion["layout"]
    tokens = None if layout is None else (
        layout["frames"] * layout["height"] * layout["width"] + layout["text"])
    if (tokens is None or attn_mask is not None or is_causal or return_lse
            or _internals.context_parallel_groups(_parallel_config) is not None
            or query.shape[1] != tokens or not query.shape == key.shape == value.shape):
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


def register(name):
    """The dispatcher's member for ditops' backend `name`, registered on first use."""
    return _internals.register_backend(name, _FUNCTIONS[name])


def rainfusion_hook(model, options, video_layout):
    """A forward pre-hook that sets the RainFusion options of `model` and the token layout of
    its self-attention from its input: video_layout(hidden_states, encoder_hidden_states) gives
    dict(frames, height, width, text, text_first) or None."""

    def hook(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        text = kwargs.get("encoder_hidden_states")
        layout = None
        if hidden is not None and hidden.ndim == 5:
            layout = video_layout(hidden, text)
        _rainfusion.update(options, layout=layout)

    return model.register_forward_pre_hook(hook, with_kwargs=True)
