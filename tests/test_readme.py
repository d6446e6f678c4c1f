"""README.md's code: its Python snippets run as written, its test command is CI's."""

import pathlib
import re

import jax
import jax.numpy as jnp
import pytest

from tests.test_ptb_lm_binary import corpus_dir, tiny  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def run_snippet(marker: str, **names) -> dict:
    """Runs the one README snippet containing ``marker``, with ``names`` defined; returns
    its names."""
    (snippet,) = [s for s in SNIPPETS if marker in s]
    namespace: dict = dict(names)
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
    names = run_snippet("DCBiLSTM(")
    assert names["logits"].shape == (4, 5)
    assert names["sentence"].shape == (4, 200)  # DC-Bi-LSTM's pooled top Bi-LSTM, 2 x 100


def test_trained_run_snippet(corpus_dir, tmp_path, monkeypatch):  # noqa: F811
    from dense_rnn.train import lm

    workdir = str(tmp_path / "run")
    lm.train_and_evaluate(tiny(max_steps=5), corpus_dir, workdir, log=lambda s: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sentences.txt").write_text("the company said\nno it was n't\n")
    names = run_snippet("lm_infer.load(", workdir=workdir)
    assert names["logits"].shape == (1, 3, names["trained"].config.vocab_size)
    assert len(names["scores"].log_probs) == 2


def test_ci_runs_the_readme_test_command():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"\n    {command}\n" in README
