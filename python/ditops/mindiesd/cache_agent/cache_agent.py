"""MindIE-SD's CacheAgent: runs a model's blocks (or attentions) through a cache method chosen
by CacheConfig.method. Pure Python over torch (any device, any dtype)."""

import operator

from ..utils.exception import ConfigError, ParametersInvalid
from .attention_cache import AttentionCache
from .cache import CacheConfig
from .dit_block_cache import DiTBlockCache

# CacheConfig.method -> the CacheBase subclass that implements it.
CACHE_METHOD = {
    "attention_cache": AttentionCache,
    "dit_block_cache": DiTBlockCache,
}

_INTEGER_FIELDS = ("blocks_count", "steps_count", "step_start", "step_interval", "step_end",
                   "block_start", "block_end")


class CacheAgent:
    """One agent per cached call site of a model, called blocks_count times per denoising step
    (agent.apply(block, hidden_states=..., ...) in the blocks loop, or
    agent.apply(self.attn, ...) in every block, the blocks sharing one agent); it counts the
    calls to know the step and the block. The config is checked here (ConfigError) and read at
    every call, as MindIE-SD does."""

    def __init__(self, config: CacheConfig):
        if not isinstance(config, CacheConfig):
            raise ParametersInvalid(f"CacheAgent: config must be a CacheConfig, not "
                                    f"{type(config).__name__}")
        _check(config)
        self._config = config
        self._cache_method = CACHE_METHOD[config.method](config)

    def apply(self, function, *args, **kwargs):
        """function(*args, **kwargs), or what the cache method returns in its place. With
        nothing to cache (step_interval 1, step_start >= steps_count, step_end == step_start,
        block_start >= blocks_count or block_end == block_start) it is always called as given
        and the calls are not counted."""
        if not callable(function):
            raise ParametersInvalid(f"CacheAgent.apply: function must be callable, not "
                                    f"{type(function).__name__}")
        if _caches_nothing(self._config):
            return function(*args, **kwargs)
        return self._cache_method.apply(function, *args, **kwargs)


def _caches_nothing(config):
    return (config.step_interval == 1
            or config.step_start >= config.steps_count or config.step_end == config.step_start
            or config.block_start >= config.blocks_count
            or config.block_end == config.block_start)


def _check(config):
    if not isinstance(config.method, str) or config.method not in CACHE_METHOD:
        raise ConfigError(f"CacheConfig.method {config.method!r} is not one of "
                          f"{sorted(CACHE_METHOD)}")
    for name in _INTEGER_FIELDS:
        value = getattr(config, name)
        try:
            operator.index(value)
        except TypeError:
            raise ConfigError(f"CacheConfig.{name} must be an integer, not "
                              f"{type(value).__name__}") from None
    at_least = {"blocks_count": 1, "steps_count": 1, "step_start": 0, "step_interval": 1,
                "block_start": 0}
    for name, low in at_least.items():
        if getattr(config, name) < low:
            raise ConfigError(f"CacheConfig.{name} must be >= {low}, got "
                              f"{getattr(config, name)}")
    if config.step_end < config.step_start:
        raise ConfigError(f"CacheConfig.step_end ({config.step_end}) must be >= step_start "
                          f"({config.step_start})")
    if config.block_end < config.block_start:
        raise ConfigError(f"CacheConfig.block_end ({config.block_end}) must be >= block_start "
                          f"({config.block_start})")
    if config.method == "dit_block_cache" and config.block_end > config.blocks_count:
        raise ConfigError(f"CacheConfig.block_end ({config.block_end}) must be <= blocks_count "
                          f"({config.blocks_count}) for dit_block_cache")
