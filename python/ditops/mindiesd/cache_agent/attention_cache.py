"""MindIE-SD's attention cache: each block's attention output, computed on a refresh step, is
returned again on the steps that follow it instead of being computed."""

from ..utils.exception import ModelExecError
from .cache import CacheBase, CacheConfig


class AttentionCache(CacheBase):
    """Step s of a generation, for every block:
    - reuses the block's stored result when step_start < s <= step_end and
      (s - step_start) % step_interval != 0;
    - otherwise calls func, and stores its result when step_start <= s < step_end.
    block_start and block_end play no part (as in MindIE-SD). The result is stored as returned
    (a tensor, a tuple, anything), by reference."""

    def __init__(self, config: CacheConfig):
        super().__init__(config)
        self._stored = {}

    def apply_imp(self, func, *args, **kwargs):
        config, step, block = self._config, self._cur_step, self._cur_block
        since_start = step - config.step_start
        if config.step_start < step <= config.step_end and since_start % config.step_interval:
            if block not in self._stored:
                raise ModelExecError(f"[AttentionCache] step {step} block {block} reuses an "
                                     "attention no earlier step of this generation computed")
            return self._stored[block]
        result = func(*args, **kwargs)
        if config.step_start <= step < config.step_end:
            self._stored[block] = result
        return result

    def _release(self):
        self._stored = {}
