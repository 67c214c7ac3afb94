"""MindIE-SD's cache configuration, and the step/block counter every cache method shares."""

import abc
import dataclasses


@dataclasses.dataclass
class CacheConfig:
    """What to cache and when. Nothing is checked here: CacheAgent(config) checks it.

    method: "attention_cache" (an attention call's output reused on later steps) or
        "dit_block_cache" (a range of blocks skipped, their residual reused).
    blocks_count: calls of the agent per denoising step (blocks, or attentions).
    steps_count: denoising steps per generation; the counters and the cache restart after it.
    step_start, step_interval, step_end: from step_start on, every step_interval-th step
        computes and refreshes the cache, the steps between reuse it (attention_cache up to
        step_end included; dit_block_cache ignores step_end, as MindIE-SD does).
    block_start, block_end: the blocks [block_start, block_end) dit_block_cache skips
        (attention_cache reuses every block's attention and ignores them).
    """

    method: str
    blocks_count: int
    steps_count: int
    step_start: int = 0
    step_interval: int = 1
    step_end: int = 10000
    block_start: int = 0
    block_end: int = 10000


class CacheBase(abc.ABC):
    """A cache method driven by call counting: the n-th call of a step is block n. Subclasses
    implement apply_imp (one call, knowing the current step and block) and _release (drop
    what is cached when a generation ends)."""

    def __init__(self, config: CacheConfig):
        super().__init__()
        self._config = config
        self._cur_step = 0
        self._cur_block = 0

    def apply(self, func, *args, **kwargs):
        """func's result (computed or from the cache) for the current block, which then
        advances; a call that raises does not advance."""
        result = self.apply_imp(func, *args, **kwargs)
        self._advance()
        return result

    @abc.abstractmethod
    def apply_imp(self, func, *args, **kwargs):
        """The result of the current (step, block) call."""

    @abc.abstractmethod
    def _release(self):
        """Forgets everything cached (the end of a generation)."""

    def _advance(self):
        self._cur_block += 1
        if self._cur_block < self._config.blocks_count:
            return
        self._cur_block = 0
        self._cur_step += 1
        if self._cur_step == self._config.steps_count:
            self._cur_step = 0
            self._release()
