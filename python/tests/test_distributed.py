"""ditops.distributed on 2 and 4 processes of this machine (gloo over loopback), each rank
checking its shard against fp64 (the cases are in distributed_cases.py); a diffusers model
sequence-parallel through diffusers' own configuration; peers that die or stall."""

import pytest
import torch.multiprocessing as mp

import distributed_cases


def spawn(function, world, tmp_path, *args):
    mp.spawn(function, args=(world, str(tmp_path / "store"), *args), nprocs=world, join=True)


@pytest.mark.parametrize("world", [2, 4])
def test_ring_ulysses_and_hybrid_equal_one_attention(world, tmp_path):
    spawn(distributed_cases.attention_cases, world, tmp_path)


@pytest.mark.parametrize("model, ring, ulysses", [("flux", 2, 1), ("wan", 1, 2)])
def test_diffusers_model_sequence_parallel_equals_one_process(model, ring, ulysses, tmp_path):
    spawn(distributed_cases.diffusers_case, 2, tmp_path, model, ring, ulysses)


@pytest.mark.parametrize("mode", ["ring-dead", "ring-stuck", "ulysses-dead", "ulysses-stuck"])
def test_a_lost_peer_raises_within_the_timeout(mode, tmp_path):
    result = tmp_path / "result"
    spawn(distributed_cases.failure_case, 2, tmp_path, mode, str(result))
    seconds, message = result.read_text().split("\n", 1)
    assert float(seconds) < 10, message  # the timeout is 3 s
    assert "ditops.distributed" in message and "died or is stuck" in message, message
