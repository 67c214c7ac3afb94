"""mindiesd.cache_agent: step caching for diffusion transformers (attention_cache,
dit_block_cache), in pure Python over torch, with MindIE-SD's schedule."""

from .cache import CacheConfig
from .cache_agent import CacheAgent

__all__ = ["CacheConfig", "CacheAgent"]
