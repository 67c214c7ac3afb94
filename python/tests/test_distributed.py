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


def test_the_torchrun_example_matches_one_process():
    """examples/python/context_parallel.py as docs/distributed.md launches it (hybrid: ring 2 x
    Ulysses 2 on 4 processes), with its own comparison against one process."""
    import os
    import pathlib
    import subprocess
    import sys

    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / \
        "context_parallel.py"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
         str(example), "--model", "wan", "--ulysses", "2", "--check"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "largest difference from one process" in result.stdout, result.stdout
