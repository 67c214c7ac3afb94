"""Step caching for diffusion transformers, with MindIE-SD's schedule and names: CacheConfig says
what to cache and when, CacheAgent runs a model's blocks (or attentions) through the cache
method CacheConfig.method chooses (AttentionCache: an attention's output reused on later
steps; DiTBlockCache: a range of blocks skipped, their residual reused). Pure Python over torch
(any device, any dtype); the step and the block are known by counting calls."""

import abc
import dataclasses
import operator

from .errors import ConfigError, ModelExecError, ParametersInvalid


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


__all__ = ["CacheConfig", "CacheAgent", "CacheBase", "AttentionCache", "DiTBlockCache"]
