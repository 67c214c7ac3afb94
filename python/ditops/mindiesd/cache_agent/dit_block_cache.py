"""mindiesd.cache_agent.dit_block_cache: MindIE-SD's DiTBlockCache (ditops.step_cache)."""

from ...step_cache import DiTBlockCache

__all__ = ["DiTBlockCache"]
