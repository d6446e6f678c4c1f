"""notebooks/quickstart.ipynb runs top to bottom (quick settings, local data)."""

import os
import re

import pytest

from tests.conftest import REPO

NOTEBOOK = os.path.join(REPO, "notebooks", "quickstart.ipynb")


def test_quickstart_notebook_runs(data_dir, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    monkeypatch.setenv("DENSE_RNN_DATA_DIR", data_dir)  # the kernel inherits the environment
    monkeypatch.setenv("DENSE_RNN_NOTEBOOK_QUICK", "1")
    # 8 devices, as on a Colab TPU: every batch must split over them
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    monkeypatch.setenv("PYTHONPATH", REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "test perplexity" in outputs and "perplexity" in outputs
    assert "test_accuracy" in outputs
    assert "warning: sst2" not in outputs and "warning: PTB" not in outputs  # excerpts
    assert "IProgress" not in outputs  # tqdm's warning where ipywidgets is missing
    # the quick runs learn: the sentence outscores its scrambled words, and the classifier
    # beats the majority class of the test excerpt (104 of 200)
    scores = {text: float(v) for v, text in re.findall(r"^ *(-[\d.]+)  (.+)$", outputs, re.M)}
    assert (scores["the company said it expects higher earnings"]
            > scores["earnings company the it said higher"])
    assert float(re.search(r"'test_accuracy': ([\d.]+)", outputs).group(1)) > 0.6
    for run in ["lm", "dc_bilstm"]:  # TensorBoard event files from both trainers; each run
        # is named by the device count, whose batch it has
        assert os.listdir(tmp_path / "quickstart_work" / f"{run}_8_devices" / "tensorboard")


def test_install_cell_without_checkout_or_url_says_what_to_set(tmp_path, monkeypatch):
    """Outside a checkout, with no DENSE_RNN_REPO, the install cell stops with the fix
    instead of pip-installing a placeholder URL."""
    import importlib.util
    import json

    with open(NOTEBOOK, encoding="utf-8") as f:
        cell = "".join(json.load(f)["cells"][1]["source"])
    (tmp_path / "nb").mkdir()
    monkeypatch.chdir(tmp_path / "nb")  # ".." holds no pyproject.toml
    monkeypatch.delenv("DENSE_RNN_REPO", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(RuntimeError, match="set REPO_URL in this cell .*DENSE_RNN_REPO"):
        exec(cell, {})


@pytest.mark.parametrize("accelerator", [None, "tpu", "gpu"])
def test_install_cell_keeps_jaxs_plugin_matched_on_an_accelerator(tmp_path, monkeypatch,
                                                                 accelerator):
    """On a TPU runtime the install cell adds ``jax[tpu]``, on an NVIDIA GPU ``jax[cuda12]``,
    so libtpu or the CUDA plugin follows whatever jax the install leaves; on a CPU it
    installs the package alone."""
    import glob
    import importlib.util
    import json
    import subprocess

    with open(NOTEBOOK, encoding="utf-8") as f:
        cell = "".join(json.load(f)["cells"][1]["source"])
    (tmp_path / "nb").mkdir()
    monkeypatch.chdir(tmp_path / "nb")
    monkeypatch.setenv("DENSE_RNN_REPO", "git+https://example.invalid/dense_rnn.git")
    for var in ("TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR"):
        monkeypatch.delenv(var, raising=False)
    if accelerator == "tpu":
        monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/dev/nvidia0"] if (
        accelerator == "gpu" and pattern.startswith("/dev/nvidia")) else [])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    exec(cell, {})
    (cmd,) = calls
    assert cmd[-2 if accelerator else -1] == "git+https://example.invalid/dense_rnn.git"
    assert ("jax[tpu]" in cmd) == (accelerator == "tpu")
    assert ("jax[cuda12]" in cmd) == (accelerator == "gpu")
