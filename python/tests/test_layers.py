"""The import-layers contract of the package (tools/check_python_layers.py): the sources as they
are keep it, and each kind of violation is caught."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = ROOT / "tools" / "check_python_layers.py"
PACKAGE = ROOT / "python" / "ditops"


def check(package_dir):
    result = subprocess.run([sys.executable, str(CHECK), str(package_dir)], capture_output=True,
                            text=True, check=False)
    return result.returncode, result.stdout


def test_the_package_keeps_its_layers():
    assert check(PACKAGE) == (0, "")


@pytest.mark.parametrize("path, line, message", [
    ("ops.py", "from .mindiesd import install", "ditops.ops (core) imports ditops.mindiesd"),
    ("quant.py", "    from . import diffusers", "ditops.quant (core) imports ditops.diffusers"),
    ("__init__.py", "import ditops.mindiesd.layers", "ditops (core) imports ditops.mindiesd"),
    ("mindiesd/layers/rope.py", "from ...diffusers import enable",
     "ditops.mindiesd.layers.rope (mindiesd) imports ditops.diffusers"),
    ("diffusers/cache.py", "from ..mindiesd import CacheConfig",
     "ditops.diffusers.cache (diffusers) imports ditops.mindiesd"),
    ("diffusers/models.py", "import diffusers.models.attention_dispatch",
     "only ditops.diffusers._internals imports diffusers"),
    ("layers.py", "from diffusers import FluxTransformer2DModel",
     "only ditops.diffusers uses diffusers"),
])
def test_each_kind_of_violation_is_reported(tmp_path, path, line, message):
    copy = tmp_path / "ditops"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / path
    target.write_text(target.read_text() + "\n\ndef _late():\n" + "    " + line.strip() + "\n"
                      if line.startswith("    ") else target.read_text() + "\n" + line + "\n")
    code, out = check(copy)
    assert code == 1 and message in out, out
    assert out.count("\n") == 1, out  # that import alone

