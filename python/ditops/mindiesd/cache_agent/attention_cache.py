"""mindiesd.cache_agent.attention_cache: MindIE-SD's AttentionCache (ditops.step_cache)."""

from ...step_cache import AttentionCache

__all__ = ["AttentionCache"]
