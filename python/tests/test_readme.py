"""README.md's Python example run as written, with the one step a test cannot take replaced:
FluxPipeline.from_pretrained would download FLUX.1-dev; here it returns the small random
pipeline of the same class (models.flux_pipeline), at 64 x 64 pixels."""

import pathlib
import re

import pytest

import models

pytest.importorskip("transformers")
README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs(monkeypatch):
    import diffusers

    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    loaded = []

    def small_random_pipeline(name, **kwargs):
        pipe = models.flux_pipeline()
        pipe.default_sample_size = 8  # 8 latent pixels a side: 64 x 64 pixels
        pipe.set_progress_bar_config(disable=True)
        loaded.append(name)
        return pipe

    monkeypatch.setattr(diffusers.FluxPipeline, "from_pretrained", small_random_pipeline)
    names = {}
    exec(compile(block, str(README), "exec"), names)
    assert loaded == ["black-forest-labs/FLUX.1-dev"]
    assert names["image"].size == (64, 64)
    assert names["out"].shape == names["q"].shape and names["lse"].shape == (1, 24, 4608)
    assert names["report"]  # optimize() replaced modules and says which
