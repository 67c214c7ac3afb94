"""Step caching on a diffusers transformer: one CacheAgent (ditops.step_cache, MindIE-SD's
schedule) on every block's call (dit_block_cache) or every block's self-attention call
(attention_cache), at the sites the model's family names. diffusers 0.37 to 0.42 call FLUX's
blocks by keyword and Wan's by position (and both by position under gradient checkpointing,
with gradients on)."""

import dataclasses
import functools
import inspect

from ..step_cache import CacheAgent, CacheConfig
from . import models


def _cache_sites(model):
    """[(name, block)] of `model` in call order, and its family's CacheSites; ValueError for
    a model cache= does not know."""
    sites = models.family_of(model).cache_sites
    if sites is None:
        known = sorted(f.class_name for f in models.FAMILIES if f.cache_sites is not None)
        raise ValueError(f"ditops.diffusers.optimize: cache= supports {known}, not "
                         f"{type(model).__name__}")
    blocks = [(f"{attribute}.{index}", block) for attribute in sites.block_lists
              for index, block in enumerate(getattr(model, attribute))]
    return blocks, sites


def _cache_config(cache, model, blocks_count):
    """The CacheConfig optimize's agent reads: `cache` itself, or a copy with the model's
    blocks_count where cache gives 0. Any other blocks_count than the model's raises."""
    if not isinstance(cache, CacheConfig):
        raise ValueError("ditops.diffusers.optimize: cache must be None or a "
                         f"ditops.CacheConfig, not {type(cache).__name__}")
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


def cache_agent(model, cache):
    """(the CacheAgent optimize puts on `model` for `cache`, the config it reads), built and
    checked before anything of the model changes."""
    blocks, _ = _cache_sites(model)
    config = _cache_config(cache, model, len(blocks))
    return CacheAgent(config), config  # the agent checks the rest (ConfigError, a ValueError)


def apply_cache(model, state, agent, method):
    """Routes every block's call (dit_block_cache) or every block's self-attention call
    (attention_cache) of `model` through `agent`, keeping each instance forward it replaces
    (None: the class's) in the model's state for disable. Returns the wrapped modules' names."""
    blocks, sites = _cache_sites(model)
    names = []
    for name, block in blocks:
        if method == "dit_block_cache":
            module = block
            forward = _cached_block_forward(agent, block, block.forward, sites.encoder_first)
        else:
            name, module = f"{name}.{sites.attention}", getattr(block, sites.attention)
            forward = _cached_attention_forward(agent, module.forward)
        state.forwards.append((module, module.__dict__.get("forward")))
        module.forward = forward
        names.append(name)
    return names
