"""ditops.mindiesd's CacheConfig / CacheAgent (MindIE-SD's attention_cache and dit_block_cache)
against schedules written out by hand from MindIE-SD's definition: on toy blocks (which step
and block computes, what a skipped one returns), then on diffusers' FLUX and Wan transformers
(random weights, fp32 and bf16, torch.inference_mode) in a denoising loop, against the same
loop run by a reference that follows the hand-written schedule. Bad configurations and calls
raise MindIE-SD's error types.

The model harness (CachedCall, the call routes, denoise) is also what bench/python/cache_loop.py
runs."""

import gc
import weakref

import pytest
import torch

import ditops
import models
from ditops.mindiesd import CacheAgent, CacheConfig
from ditops.mindiesd.utils.exception import ConfigError, ModelExecError, ParametersInvalid

# ---- toy blocks: the schedule --------------------------------------------------------------


def attention_run(config, generations=2):
    """Calls the agent blocks_count times per step for `generations` generations; each call's
    function returns its own (generation, step, block). Returns {(generation, step, block):
    the triple the agent returned} and the set of triples that were computed."""
    agent = CacheAgent(config)
    returned, computed = {}, set()
    for generation in range(generations):
        for step in range(config.steps_count):
            for block in range(config.blocks_count):
                def attention(key):
                    computed.add(key)
                    return key
                key = (generation, step, block)
                returned[key] = agent.apply(attention, key)
    return returned, computed


# MindIE-SD's attention_cache: a step s reuses every block's attention when
# step_start < s <= step_end and (s - step_start) % step_interval != 0, from the last step that
# computed it. Each case: the config's fields and, written out by hand, {reusing step: the step
# whose attention it gets}.
ATTENTION_SCHEDULES = {
    "start2_interval3_end7": (dict(steps_count=10, blocks_count=3, step_start=2,
                                   step_interval=3, step_end=7),
                              {3: 2, 4: 2, 6: 5, 7: 5}),
    "defaults_interval2": (dict(steps_count=6, blocks_count=2, step_interval=2),
                           {1: 0, 3: 2, 5: 4}),
    "end_before_the_next_refresh": (dict(steps_count=8, blocks_count=2, step_start=1,
                                         step_interval=4, step_end=3),
                                    {2: 1, 3: 1}),
    "end_past_the_last_step": (dict(steps_count=5, blocks_count=1, step_start=3,
                                    step_interval=2, step_end=100),
                               {4: 3}),
    # block_start / block_end play no part in attention_cache (as in MindIE-SD)
    "block_range_ignored": (dict(steps_count=5, blocks_count=4, step_interval=2, block_start=2,
                                 block_end=3),
                            {1: 0, 3: 2}),
    "start_on_the_last_step": (dict(steps_count=6, blocks_count=2, step_start=5,
                                    step_interval=2), {}),
    # nothing to cache: every call computes and none is counted
    "interval_1": (dict(steps_count=6, blocks_count=2, step_start=1, step_interval=1), {}),
    "start_past_the_steps": (dict(steps_count=4, blocks_count=2, step_start=4,
                                  step_interval=2), {}),
    "end_equals_start": (dict(steps_count=6, blocks_count=2, step_start=2, step_end=2,
                              step_interval=2), {}),
    "block_start_past_the_blocks": (dict(steps_count=6, blocks_count=2, step_interval=2,
                                         block_start=2), {}),
    "empty_block_range": (dict(steps_count=6, blocks_count=2, step_interval=2, block_start=1,
                               block_end=1), {}),
}


@pytest.mark.parametrize("case", list(ATTENTION_SCHEDULES))
def test_attention_cache_schedule(case):
    fields, reused_from = ATTENTION_SCHEDULES[case]
    config = CacheConfig(method="attention_cache", **fields)
    returned, computed = attention_run(config)
    for (generation, step, block), got in returned.items():
        # the second generation reuses its own attentions: the cache restarts after steps_count
        assert got == (generation, reused_from.get(step, step), block), (generation, step, block)
        assert ((generation, step, block) in computed) == (step not in reused_from)


def dit_run(config, block_fn, generations=2, outputs=1, encoder_input=None):
    """Chains blocks_count toy blocks through the agent for `generations` generations from
    hidden 0 (and encoder 0 when the blocks take or return it); block_fn(step, block, hidden)
    is a block's hidden output, encoder's is hidden's plus 1000. Returns every call's result
    and the (generation, step, block) calls that computed."""
    agent = CacheAgent(config)
    results, computed = [], set()
    encoder_input = outputs == 2 if encoder_input is None else encoder_input
    for generation in range(generations):
        hidden, encoder = 0, 0
        for step in range(config.steps_count):
            for block in range(config.blocks_count):
                def run(hidden_states, encoder_hidden_states=None,
                        key=(generation, step, block)):
                    computed.add(key)
                    out = block_fn(key[1], key[2], hidden_states)
                    return (out, encoder_hidden_states + 1000 + out) if outputs == 2 else out
                extra = dict(encoder_hidden_states=encoder) if encoder_input else {}
                result = agent.apply(run, hidden_states=hidden, **extra)
                if outputs == 2:
                    hidden, encoder = result
                else:
                    hidden = result
                results.append(result)
    return results, computed


def dit_reference(steps, blocks, refresh, reuse, block_range, block_fn, generations=2,
                  outputs=1):
    """MindIE-SD's dit_block_cache with the schedule given by hand: on a `reuse` step the blocks
    of block_range are skipped, the first returning its input plus the residual (block_range's
    last output minus its first input on the last `refresh` step), the others their input."""
    results, computed = [], set()
    for generation in range(generations):
        hidden, encoder, residual = 0, 0, None
        for step in range(steps):
            for block in range(blocks):
                if step in reuse and block in block_range:
                    if block == block_range.start:
                        hidden = hidden + residual[0]
                        encoder = encoder + residual[1]
                else:
                    if step in refresh and block == block_range.start:
                        start = (hidden, encoder)
                    computed.add((generation, step, block))
                    out = block_fn(step, block, hidden)
                    hidden, encoder = out, encoder + 1000 + out
                    if step in refresh and block == block_range[-1]:
                        residual = (hidden - start[0], encoder - start[1])
                results.append((hidden, encoder) if outputs == 2 else hidden)
    return results, computed


def toy_block(step, block, hidden):
    # distinct, step-dependent and nonlinear in hidden, so that a wrong residual shows
    return hidden * (block + 2) // 2 + 10 ** block * (step + 1)


# MindIE-SD's dit_block_cache: from step_start on, every step_interval-th step computes every
# block (a refresh step), the steps between skip [block_start, block_end); step_end plays no
# part. Each case: the config's fields, and by hand the refresh steps, the reuse steps and the
# skipped blocks.
DIT_SCHEDULES = {
    "start1_interval2_blocks1to4": (dict(steps_count=6, blocks_count=5, step_start=1,
                                         step_interval=2, block_start=1, block_end=4),
                                    {1, 3, 5}, {2, 4}, range(1, 4)),
    "whole_stack": (dict(steps_count=8, blocks_count=4, step_interval=3, block_end=4),
                    {0, 3, 6}, {1, 2, 4, 5, 7}, range(0, 4)),
    # one block: its own output minus its input (MindIE-SD 3.1.0 adds the block's input
    # instead: that is a defect ditops does not reproduce)
    "one_block_range": (dict(steps_count=5, blocks_count=3, step_start=2, step_interval=2,
                             block_start=1, block_end=2),
                        {2, 4}, {3}, range(1, 2)),
    "step_end_ignored": (dict(steps_count=8, blocks_count=3, step_start=1, step_interval=2,
                              step_end=3, block_start=1, block_end=3),
                         {1, 3, 5, 7}, {2, 4, 6}, range(1, 3)),
    "start_on_the_last_step": (dict(steps_count=6, blocks_count=3, step_start=5,
                                    step_interval=2, block_start=0, block_end=2),
                               {5}, set(), range(0, 2)),
    # nothing to cache: every call computes and none is counted
    "interval_1": (dict(steps_count=5, blocks_count=3, block_end=2), set(), set(), range(0, 2)),
    "end_equals_start": (dict(steps_count=5, blocks_count=3, step_start=1, step_end=1,
                              step_interval=2, block_end=2), set(), set(), range(0, 2)),
    "empty_block_range": (dict(steps_count=5, blocks_count=3, step_interval=2, block_start=2,
                               block_end=2), set(), set(), range(2, 2)),
}


@pytest.mark.parametrize("outputs,encoder_input", [(1, False), (1, True), (2, True)],
                         ids=["hidden", "hidden_given_encoder", "hidden_and_encoder"])
@pytest.mark.parametrize("case", list(DIT_SCHEDULES))
def test_dit_block_cache_schedule(case, outputs, encoder_input):
    fields, refresh, reuse, block_range = DIT_SCHEDULES[case]
    config = CacheConfig(method="dit_block_cache", **fields)
    got, computed = dit_run(config, toy_block, outputs=outputs, encoder_input=encoder_input)
    want, want_computed = dit_reference(config.steps_count, config.blocks_count, refresh, reuse,
                                        block_range, toy_block, outputs=outputs)
    assert computed == want_computed
    assert got == want


def test_dit_block_cache_matches_mindiesds_published_sequence():
    # The sequence MindIE-SD's own unit test expects for this config (blocks add step + 1).
    config = CacheConfig(method="dit_block_cache", blocks_count=7, steps_count=5, step_start=1,
                         step_interval=2, block_start=2, block_end=6)
    got, _ = dit_run(config, lambda step, block, hidden: hidden + step + 1, generations=3)
    sequence = [1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 15, 17, 19, 21, 24, 27, 35, 35, 35, 35, 38,
                42, 46, 50, 54, 58, 62, 66, 71, 76, 92, 92, 92, 92, 97]
    assert got == sequence * 3


def test_skipped_inner_blocks_return_their_input():
    config = CacheConfig(method="dit_block_cache", blocks_count=3, steps_count=2,
                         step_interval=2, block_start=0, block_end=3)
    agent = CacheAgent(config)
    hidden = torch.ones(2)
    for _ in range(3):  # step 0 computes
        hidden = agent.apply(lambda h: h * 2, hidden_states=hidden)
    first = agent.apply(lambda h: h * 2, hidden_states=hidden)
    assert torch.equal(first, hidden + 7)  # 1 -> 8 on step 0: residual 7
    assert agent.apply(lambda h: h * 2, hidden_states=first) is first


class Tracked:
    """A number whose every instance (results, inputs, residuals) is recorded weakly."""

    instances = []

    def __init__(self, value):
        self.value = value
        Tracked.instances.append(weakref.ref(self))

    def __add__(self, other):
        return Tracked(self.value + other.value)

    def __sub__(self, other):
        return Tracked(self.value - other.value)


@pytest.mark.parametrize("method", ["attention_cache", "dit_block_cache"])
def test_cache_is_released_after_the_last_step(method):
    config = CacheConfig(method=method, blocks_count=2, steps_count=3, step_interval=2,
                         block_end=2)
    agent = CacheAgent(config)
    Tracked.instances = []
    for step in range(config.steps_count):
        for _ in range(config.blocks_count):
            agent.apply(lambda hidden_states: hidden_states + Tracked(1),
                        hidden_states=Tracked(0))
        gc.collect()
        alive = sum(ref() is not None for ref in Tracked.instances)
        # held between steps: attention_cache both blocks' outputs, dit_block_cache a residual
        assert alive == (0 if step == config.steps_count - 1 else
                         2 if method == "attention_cache" else 1), step


def test_config_is_read_at_every_call():
    # MindIE-SD's agent reads its config at each call; tools that tune a schedule rely on it.
    config = CacheConfig(method="attention_cache", blocks_count=1, steps_count=4)
    agent = CacheAgent(config)
    assert agent.apply(lambda: "computed") == "computed"  # interval 1: not counted
    config.step_interval = 2
    assert [agent.apply(lambda s=s: s) for s in range(4)] == [0, 0, 2, 2]


def test_submodule_paths():
    from ditops.mindiesd.cache_agent import (attention_cache, cache, cache_agent,
                                             dit_block_cache)

    assert cache.CacheConfig is CacheConfig and cache_agent.CacheAgent is CacheAgent
    assert cache_agent.CACHE_METHOD == {"attention_cache": attention_cache.AttentionCache,
                                        "dit_block_cache": dit_block_cache.DiTBlockCache}
    assert issubclass(dit_block_cache.DiTBlockCache, cache.CacheBase)
    assert CacheConfig("attention_cache", 2, 3) == CacheConfig(
        method="attention_cache", blocks_count=2, steps_count=3, step_start=0,
        step_interval=1, step_end=10000, block_start=0, block_end=10000)


# ---- errors ---------------------------------------------------------------------------------

GOOD = dict(method="dit_block_cache", blocks_count=4, steps_count=10, step_start=1,
            step_interval=2, block_start=1, block_end=3)


@pytest.mark.parametrize("change", [
    dict(method="cache"), dict(method=None), dict(blocks_count=0), dict(steps_count=0),
    dict(step_start=-1), dict(step_interval=0), dict(block_start=-1),
    dict(step_start=5, step_end=4), dict(block_start=2, block_end=1),
    dict(block_end=5),  # past blocks_count (dit_block_cache)
    dict(block_end=10000), dict(blocks_count=2.0), dict(step_interval="2"),
    dict(step_end=None),
], ids=lambda change: "-".join(f"{k}={v!r}" for k, v in change.items()))
def test_bad_config_raises_config_error(change):
    with pytest.raises(ConfigError, match=r"^\[MIE06E000002\]"):
        CacheAgent(CacheConfig(**{**GOOD, **change}))


def test_attention_cache_accepts_the_default_block_end():
    CacheAgent(CacheConfig(method="attention_cache", blocks_count=4, steps_count=10))


def test_error_types():
    assert issubclass(ConfigError, ParametersInvalid)
    assert issubclass(ParametersInvalid, ditops.Error) and issubclass(ditops.Error, ValueError)
    with pytest.raises(ParametersInvalid, match="CacheConfig"):
        CacheAgent(dict(GOOD))
    with pytest.raises(ParametersInvalid, match="callable"):
        CacheAgent(CacheConfig(**GOOD)).apply(None, hidden_states=0)


def calls_until(agent, step, block, blocks_count, **kwargs):
    """Drives agent to (step, block) with computing toy blocks (one output)."""
    for _ in range(step * blocks_count + block):
        agent.apply(lambda h, *_: h + 1, hidden_states=0, **kwargs)


@pytest.mark.parametrize("call,error,message", [
    (lambda agent: agent.apply(lambda h: h, 0), ParametersInvalid, "keyword"),
    (lambda agent: agent.apply(lambda h: h, hidden_states=None), ParametersInvalid, "None"),
    (lambda agent: agent.apply(lambda h, e: (h, e, h), hidden_states=0,
                               encoder_hidden_states=0), ModelExecError, "sequence of 3"),
], ids=["positional_hidden_states", "hidden_states_none", "three_outputs"])
def test_bad_block_call_raises_and_counts_nothing(call, error, message):
    agent = CacheAgent(CacheConfig(**GOOD))
    calls_until(agent, step=1, block=0, blocks_count=4)  # a refresh step
    with pytest.raises(error, match=message):
        call(agent)
    # the failed call did not count: the step continues from block 0 and the schedule holds
    hidden = 0
    for step in (1, 2):
        for block in range(4):
            hidden = agent.apply(lambda h, s=step, b=block: toy_block(s, b, h),
                                 hidden_states=hidden)
    start = toy_block(1, 0, 0)  # block 1's input on refresh step 1
    residual = toy_block(1, 2, toy_block(1, 1, start)) - start
    reused = toy_block(2, 0, toy_block(1, 3, start + residual))
    assert hidden == toy_block(2, 3, reused + residual)


def test_block_returning_none_raises_model_exec_error():
    agent = CacheAgent(CacheConfig(**GOOD))
    calls_until(agent, step=1, block=2, blocks_count=4)  # block_end - 1 on a refresh step
    with pytest.raises(ModelExecError, match="None"):
        agent.apply(lambda h: None, hidden_states=0)
    with pytest.raises(ModelExecError, match="None"):
        agent.apply(lambda h, e: (h, None), hidden_states=0, encoder_hidden_states=0)


def test_two_outputs_need_encoder_hidden_states():
    agent = CacheAgent(CacheConfig(**GOOD))
    calls_until(agent, step=1, block=0, blocks_count=4)
    for _ in range(2):  # blocks 0 and 1 (block_start) of refresh step 1
        agent.apply(lambda h: (h, h), hidden_states=0)
    with pytest.raises(ParametersInvalid, match="encoder_hidden_states is required"):
        agent.apply(lambda h: (h, h), hidden_states=0)  # block_end - 1: no encoder input
    # a reuse step whose blocks return pairs, called without encoder_hidden_states
    agent = CacheAgent(CacheConfig(**GOOD))
    calls_until(agent, step=1, block=0, blocks_count=4, encoder_hidden_states=0)
    for _ in range(5):  # step 1, then block 0 of step 2
        agent.apply(lambda h, e: (h, e), hidden_states=0, encoder_hidden_states=0)
    with pytest.raises(ParametersInvalid, match="encoder_hidden_states is required"):
        agent.apply(lambda h: (h, h), hidden_states=0)


# ---- diffusers transformers ----------------------------------------------------------------


class CachedCall(torch.nn.Module):
    """Stands in for a module of a model (a block, an attention): its calls go through
    route(inner, *args, **kwargs), which a test or a benchmark sets."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.route = direct

    def forward(self, *args, **kwargs):
        return self.route(self.inner, *args, **kwargs)


def direct(inner, *args, **kwargs):
    return inner(*args, **kwargs)


def flux_blocks(model):
    return [*model.transformer_blocks, *model.single_transformer_blocks]


def wrap_blocks(model):
    """Every transformer block of a FLUX or Wan model wrapped in a CachedCall, in call order."""
    lists = ([model.transformer_blocks, model.single_transformer_blocks]
             if hasattr(model, "single_transformer_blocks") else [model.blocks])
    for blocks in lists:
        for index, block in enumerate(blocks):
            blocks[index] = CachedCall(block)
    return [block for blocks in lists for block in blocks]


def wrap_attentions(model):
    """The attention every block calls first (FLUX: attn; Wan: its self-attention attn1)
    wrapped in a CachedCall, in call order."""
    blocks = (flux_blocks(model) if hasattr(model, "single_transformer_blocks")
              else list(model.blocks))
    name = "attn" if hasattr(blocks[0], "attn") else "attn1"
    wrapped = []
    for block in blocks:
        setattr(block, name, CachedCall(getattr(block, name)))
        wrapped.append(getattr(block, name))
    return wrapped


def agent_block_route(agent):
    """A block's call through agent (dit_block_cache), as MindIE-SD's models make it: every
    argument by keyword. FLUX's blocks return (encoder_hidden_states, hidden_states): the agent
    pairs outputs with inputs in order, so it sees them swapped."""

    def route(block, hidden_states, encoder_hidden_states, *args, **kwargs):
        if isinstance(block, torch.nn.Module) and _returns_encoder_first(block):
            def hidden_first(hidden_states, encoder_hidden_states, **rest):
                encoder, hidden = block(hidden_states=hidden_states,
                                        encoder_hidden_states=encoder_hidden_states, **rest)
                return hidden, encoder
            hidden, encoder = agent.apply(hidden_first, hidden_states=hidden_states,
                                          encoder_hidden_states=encoder_hidden_states, **kwargs)
            return encoder, hidden
        names = ("temb", "rotary_emb")  # Wan's blocks are called positionally
        return agent.apply(block, hidden_states=hidden_states,
                           encoder_hidden_states=encoder_hidden_states,
                           **dict(zip(names, args)), **kwargs)

    return route


def _returns_encoder_first(block):
    return type(block).__name__ in ("FluxTransformerBlock", "FluxSingleTransformerBlock")


def agent_attention_route(agent):
    """An attention's call through agent (attention_cache), its arguments as given."""
    return lambda attention, *args, **kwargs: agent.apply(attention, *args, **kwargs)


TIMESTEP_SCALE = {"flux": 1.0, "wan": 1000.0}


def denoise(model, inputs, steps, timestep_scale, before_step=None):
    """A flow-matching Euler loop: `steps` calls of the model from t = 1 down, each velocity
    moving the latent by dt = 1 / steps. before_step(step) runs before each call."""
    latent = inputs["hidden_states"]
    for step in range(steps):
        if before_step:
            before_step(step)
        timestep = torch.full(inputs["timestep"].shape, (1 - step / steps) * timestep_scale,
                              dtype=latent.dtype)
        velocity = model(**{**inputs, "hidden_states": latent, "timestep": timestep})[0]
        latent = latent - velocity / steps
    return latent


class Reference:
    """The schedule written by hand, applied to a wrapped model without an agent: the loop
    tells the step, each call site knows its block."""

    def __init__(self):
        self.step = 0
        self.calls = 0  # calls of the wrapped modules that computed

    def block_route(self, index, refresh, reuse, block_range):
        def route(block, hidden_states, encoder_hidden_states, *args, **kwargs):
            encoder_first = _returns_encoder_first(block)
            if self.step in reuse and index in block_range:
                if index == block_range.start:
                    hidden_states = hidden_states + self.residual[0]
                    if encoder_first:
                        encoder_hidden_states = encoder_hidden_states + self.residual[1]
                return ((encoder_hidden_states, hidden_states) if encoder_first
                        else hidden_states)
            if self.step in refresh and index == block_range.start:
                self.start = (hidden_states, encoder_hidden_states)
            self.calls += 1
            out = block(hidden_states, encoder_hidden_states, *args, **kwargs)
            if self.step in refresh and index == block_range[-1]:
                if encoder_first:
                    self.residual = (out[1] - self.start[0], out[0] - self.start[1])
                else:
                    self.residual = (out - self.start[0], None)
            return out
        return route

    def attention_route(self, index, reused_from):
        stored = {}

        def route(attention, *args, **kwargs):
            if self.step in reused_from:
                assert stored[index][0] == reused_from[self.step]
                return stored[index][1]
            self.calls += 1
            stored[index] = (self.step, attention(*args, **kwargs))
            return stored[index][1]
        return route


def small_model(name, dtype):
    if name == "flux":
        # 2 double- + 2 single-stream blocks, 64 image tokens
        return models.flux(dtype, layers=2, height=8, width=8)
    return models.wan(dtype, layers=3, frames=2)


# (model, method): the config's fields; by hand: dit_block_cache's refresh steps, reuse steps
# and skipped blocks, or attention_cache's {reusing step: source step}.
MODEL_CASES = {
    ("flux", "dit_block_cache"): (dict(steps_count=6, blocks_count=4, step_start=1,
                                       step_interval=2, block_start=1, block_end=3),
                                  ({1, 3, 5}, {2, 4}, range(1, 3))),
    ("wan", "dit_block_cache"): (dict(steps_count=6, blocks_count=3, step_start=2,
                                      step_interval=3, block_start=1, block_end=3),
                                 ({2, 5}, {3, 4}, range(1, 3))),
    ("flux", "attention_cache"): (dict(steps_count=6, blocks_count=4, step_start=1,
                                       step_interval=2, step_end=4), {2: 1, 4: 3}),
    ("wan", "attention_cache"): (dict(steps_count=6, blocks_count=3, step_interval=3),
                                 {1: 0, 2: 0, 4: 3, 5: 3}),
}


def wrap(model, method):
    return wrap_blocks(model) if method == "dit_block_cache" else wrap_attentions(model)


# Exact equality: the agent and the reference run the same modules on the same tensors and add
# or subtract the same residuals, in the same order and dtype, so no rounding differs.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name,method", list(MODEL_CASES),
                         ids=[f"{name}-{method}" for name, method in MODEL_CASES])
def test_cached_denoising_loop_follows_the_schedule(name, method, dtype):
    fields, schedule = MODEL_CASES[(name, method)]
    config = CacheConfig(method=method, **fields)
    steps, blocks = config.steps_count, config.blocks_count
    with torch.inference_mode():
        model, inputs = small_model(name, dtype)
        sites = wrap(model, method)
        assert len(sites) == blocks

        agent, calls = CacheAgent(config), [0]
        route = agent_block_route(agent) if method == "dit_block_cache" else \
            agent_attention_route(agent)
        for site in sites:
            site.route = route
            site.inner.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        got = denoise(model, inputs, steps, TIMESTEP_SCALE[name])
        agent_calls = calls[0]

        reference = Reference()
        for index, site in enumerate(sites):
            site.route = (reference.block_route(index, *schedule)
                          if method == "dit_block_cache"
                          else reference.attention_route(index, schedule))
        want = denoise(model, inputs, steps, TIMESTEP_SCALE[name],
                       before_step=lambda step: setattr(reference, "step", step))

    reused = (len(schedule[1]) * len(schedule[2]) if method == "dit_block_cache"
              else len(schedule) * blocks)
    assert agent_calls == reference.calls == steps * blocks - reused
    assert torch.equal(got, want)


# Configs under which the schedule computes every step (caching on, or nothing to cache): the
# loop's output equals the uncached loop's exactly (the same modules on the same tensors).
ALL_COMPUTE = {
    "dit_block_cache": [dict(step_start=5, step_interval=2, block_start=1, block_end=2),
                        dict(step_interval=1, block_end=2)],
    "attention_cache": [dict(step_start=5, step_interval=3), dict(step_interval=1)],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("method", list(ALL_COMPUTE))
@pytest.mark.parametrize("name", ["flux", "wan"])
def test_loop_that_computes_every_step_equals_the_uncached_loop(name, method, dtype):
    with torch.inference_mode():
        model, inputs = small_model(name, dtype)
        sites = wrap(model, method)
        uncached = denoise(model, inputs, 6, TIMESTEP_SCALE[name])
        for fields in ALL_COMPUTE[method]:
            agent = CacheAgent(CacheConfig(method=method, steps_count=6,
                                           blocks_count=len(sites), **fields))
            for site in sites:
                site.route = (agent_block_route(agent) if method == "dit_block_cache"
                              else agent_attention_route(agent))
            assert torch.equal(denoise(model, inputs, 6, TIMESTEP_SCALE[name]), uncached)
