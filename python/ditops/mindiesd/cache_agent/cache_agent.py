"""mindiesd.cache_agent.cache_agent: MindIE-SD's CacheAgent (ditops.step_cache)."""

from ...step_cache import CACHE_METHOD, CacheAgent

__all__ = ["CacheAgent", "CACHE_METHOD"]
