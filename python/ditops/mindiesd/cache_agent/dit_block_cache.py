"""MindIE-SD's DiT block cache: the blocks [block_start, block_end) are skipped on some steps,
their joint effect (the residual: what they added to hidden_states on the last refresh step)
added to hidden_states instead."""

from ..utils.exception import ModelExecError, ParametersInvalid
from .cache import CacheBase, CacheConfig


class DiTBlockCache(CacheBase):
    """Step s of a generation, with d = s - step_start:
    - s < step_start: every block computes;
    - d % step_interval == 0 (a refresh step): every block computes; the input of block_start
      and the output of block_end - 1 give the residual;
    - otherwise (a reuse step): blocks outside [block_start, block_end) compute; block_start
      returns its input plus the residual, the other blocks of the range return their input.
    step_end plays no part (as in MindIE-SD: caching runs to the last step).

    The block is called as func(hidden_states[, encoder_hidden_states], *args, **kwargs), both
    taken from the keywords of the agent's call. It returns hidden_states, or the pair
    (hidden_states, encoder_hidden_states) in that order, each with its own residual."""

    def __init__(self, config: CacheConfig):
        super().__init__(config)
        self._outputs = 1  # 1 or 2: how many tensors the blocks return
        self._start_inputs = None  # (hidden, encoder) entering block_start on the refresh step
        self._residuals = None  # (hidden, encoder or None), from the last refresh step

    def apply_imp(self, func, *args, **kwargs):
        if "hidden_states" not in kwargs:
            raise ParametersInvalid("[DiTBlockCache] the block's hidden_states must be passed "
                                    "as a keyword argument (hidden_states=...)")
        hidden = kwargs.pop("hidden_states")
        if hidden is None:
            raise ParametersInvalid("[DiTBlockCache] hidden_states is None")
        has_encoder = "encoder_hidden_states" in kwargs
        encoder = kwargs.pop("encoder_hidden_states", None)

        config, step, block = self._config, self._cur_step, self._cur_block
        if step < config.step_start:
            refresh = False
        else:
            refresh = (step - config.step_start) % config.step_interval == 0
            if not refresh and config.block_start <= block < config.block_end:
                return self._skip(block, hidden, encoder, has_encoder)

        leading = (hidden, encoder) if has_encoder else (hidden,)
        result = func(*leading, *args, **kwargs)
        if refresh:
            self._record(block, result, hidden, encoder)
        return result

    def _skip(self, block, hidden, encoder, has_encoder):
        if self._residuals is None:
            raise ModelExecError(f"[DiTBlockCache] step {self._cur_step} skips block {block} but "
                                 "no earlier step of this generation computed its residual")
        starts = block == self._config.block_start
        hidden_residual, encoder_residual = self._residuals
        if self._outputs == 1:
            return hidden + hidden_residual if starts else hidden
        if not has_encoder or encoder is None:
            raise ParametersInvalid("[DiTBlockCache] the blocks return (hidden_states, "
                                    "encoder_hidden_states): encoder_hidden_states is required")
        if starts:
            return hidden + hidden_residual, encoder + encoder_residual
        return hidden, encoder

    def _record(self, block, result, hidden, encoder):
        """On a refresh step: keeps block_start's inputs, and turns them into residuals with
        block_end - 1's outputs (the same block when the range has one)."""
        sequence = isinstance(result, (list, tuple))
        if sequence and len(result) != 2:
            raise ModelExecError("[DiTBlockCache] a cached block must return hidden_states or "
                                 "(hidden_states, encoder_hidden_states), not a sequence of "
                                 f"{len(result)}")
        self._outputs = 2 if sequence else 1
        if block == self._config.block_start:
            self._start_inputs = (hidden, encoder)
        if block != self._config.block_end - 1:
            return
        start_hidden, start_encoder = self._start_inputs
        if self._outputs == 1:
            if result is None:
                raise ModelExecError("[DiTBlockCache] the output of the block is None")
            self._residuals = (result - start_hidden, None)
        else:
            out_hidden, out_encoder = result
            if out_hidden is None or out_encoder is None:
                raise ModelExecError("[DiTBlockCache] the output of the block is None")
            if start_encoder is None:
                raise ParametersInvalid("[DiTBlockCache] the blocks return (hidden_states, "
                                        "encoder_hidden_states): encoder_hidden_states is "
                                        "required")
            self._residuals = (out_hidden - start_hidden, out_encoder - start_encoder)
        self._start_inputs = None

    def _release(self):
        self._start_inputs = None
        self._residuals = None
