"""README.md's code: its Python snippets run as written, its test command is CI's."""

import pathlib
import re

import jax
import jax.numpy as jnp
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def run_snippet(marker: str) -> dict:
    """Runs the one README snippet containing ``marker``; returns its names."""
    (snippet,) = [s for s in SNIPPETS if marker in s]
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
    return namespace


def test_language_model_snippet():
    names = run_snippet("LanguageModel(")
    assert names["nll"].shape == (20, 35)
    assert all(c.dtype == jnp.float32 for c in jax.tree.leaves(names["carries"]))


def test_stack_snippet():
    names = run_snippet("RecurrentStack(")
    assert [h.shape for h in names["features"][1:]] == [(4, 30, 128)] * 3
    assert names["top"].shape == (4, 30, 434)


@pytest.mark.slow  # two full-size classifiers, run eagerly: ~1.5 CPU minutes
def test_classifier_snippet():
    assert run_snippet("DCBiLSTM(")["logits"].shape == (4, 5)


def test_ci_runs_the_readme_test_command():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"\n    {command}\n" in README
