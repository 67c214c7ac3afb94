"""mindiesd.cache_agent.cache: MindIE-SD's CacheConfig and CacheBase (ditops.step_cache)."""

from ...step_cache import CacheBase, CacheConfig

__all__ = ["CacheConfig", "CacheBase"]
