"""What the install puts on ``sys.path``: the library, and not the checkout's binaries."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO


def test_only_the_library_is_importable_outside_the_checkout(tmp_path):
    """``experiments`` and ``benchmarks`` run from the checkout's root (``python -m
    experiments.ptb_lm``); installed, such generic names would shadow a user's own."""
    code = ("import importlib.util, json\n"
            "specs = {n: importlib.util.find_spec(n) for n in "
            "('dense_rnn', 'experiments', 'benchmarks', 'tests')}\n"
            "print(json.dumps({n: s and s.origin for n, s in specs.items()}))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True).stdout
    origins = json.loads(out)
    assert origins.pop("dense_rnn").startswith(os.path.join(REPO, "dense_rnn"))
    assert not [o for o in origins.values() if o and o.startswith(REPO)], origins


def test_the_wheel_carries_the_kernels_sources(tmp_path):
    """A non-editable install must ship every source and header of ``csrc/``, which
    ``dense_rnn.native`` compiles on first use."""
    pytest.importorskip("setuptools", minversion="70.1")  # builds wheels without `wheel`

    src = tmp_path / "src"  # a copy: setuptools writes build/ and egg-info/ beside the source
    shutil.copytree(os.path.join(REPO, "dense_rnn"), src / "dense_rnn",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path)], check=True,
                   capture_output=True)
    (wheel,) = tmp_path.glob("dense_rnn-*.whl")
    csrc = {f"dense_rnn/csrc/{f}" for f in os.listdir(os.path.join(REPO, "dense_rnn", "csrc"))}
    assert {"dense_rnn/csrc/blas_gemm.cc", "dense_rnn/csrc/scan_kernel.h"} <= csrc
    assert csrc <= set(zipfile.ZipFile(wheel).namelist())
