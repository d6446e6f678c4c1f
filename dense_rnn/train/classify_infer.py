"""Classifying new text with a trained sentence classifier.

A workdir written by ``experiments.classify`` (one fold's, ``W/fold_K``, for MR and Subj)
holds all that is needed: ``run_identity.json`` (the config and dataset), ``vocab.json``
(the run's vocabulary) and ``best/<step>/`` (the parameters with the best dev accuracy).
Texts are tokenised (and cut to the run's ``--max_len``) as the dataset's training text
was; words without an id are dropped (or mapped to the unknown word) as in training.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from dense_rnn import files
from dense_rnn.configs.classifier import ClassifierConfig
from dense_rnn.data import text_classification as tc
from dense_rnn.errors import UserError
from dense_rnn.train import checkpoint, classify


@dataclasses.dataclass(frozen=True)
class TrainedClassifier:
    """A trained classifier, its parameters, vocabulary and dataset."""

    config: ClassifierConfig
    dataset: str
    model: Any
    params: Any
    vocab: tc.Vocab
    max_len: int = 0  # the run's --max_len: tokens kept of every text (0: all)
    keep: str = "first"  # the run's --keep: which of them (``tc.KEEP``)

    @property
    def class_names(self) -> tuple[str, ...]:
        """The name of each class id of the run's dataset (else the ids themselves)."""
        spec = tc.get_dataset(self.dataset)
        return spec.class_names or tuple(map(str, range(spec.num_classes)))


def _swept_rate(workdir: str) -> str | None:
    """``lr_RATE``, the run a finished learning-rate sweep in ``workdir`` chose, or None."""
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            rate = json.load(f).get("learning_rate_chosen")
    except (OSError, ValueError, AttributeError):  # none, unreadable, or not a dict
        return None
    return f"lr_{rate:g}" if isinstance(rate, int | float) else None


def load(workdir: str) -> TrainedClassifier:
    """The best-dev parameters of the run in ``workdir``."""
    if not os.path.isdir(workdir):
        raise UserError(f"--workdir={workdir} {files.not_a(workdir, directory=True)}; pass the "
                        "workdir of a finished experiments.classify run")
    identity = checkpoint.read_identity(workdir)
    if identity is None:
        runs = checkpoint.runs_below(workdir)
        chosen = _swept_rate(workdir)
        hint = ("pass one of its runs, e.g. --workdir="
                + (f"{os.path.join(workdir, chosen)} (the rate its sweep chose)"
                   if chosen in runs else os.path.join(workdir, runs[0]))
                if runs else "pass the --workdir of a finished experiments.classify run")
        raise UserError(f"no training run in {workdir} (no {checkpoint.IDENTITY_FILE}); {hint}")
    if "dataset" not in identity or "model_args" not in identity:
        raise UserError(f"{workdir} holds no experiments.classify run (a language model's?); "
                        "pass the --workdir of a classification run")
    known = {f.name for f in dataclasses.fields(ClassifierConfig)}
    fields = {k: v for k, v in identity.items() if k in known}
    fields["model_args"] = {k: tuple(v) if isinstance(v, list) else v
                            for k, v in fields.get("model_args", {}).items()}
    config = ClassifierConfig(**fields)
    vocab = tc.Vocab.load(os.path.join(workdir, tc.VOCAB_FILE))
    num_classes = tc.get_dataset(identity["dataset"]).num_classes
    model = classify.make_model(config, len(vocab.words), num_classes)
    params = checkpoint.load_best(workdir, identity, classify.param_shapes(model),
                                  "after the first epoch")
    return TrainedClassifier(config, identity["dataset"], model, params, vocab,
                             identity.get("max_len", 0), identity.get("keep", "first"))


@dataclasses.dataclass(frozen=True)
class Predictions:
    """What ``predict`` gives back for a list of texts."""

    probs: np.ndarray  # (texts, classes) class probabilities
    num_words: int  # words of the texts (max_len of each, where the run cut them)
    num_unknown: int  # of those, not in the vocabulary
    empty: np.ndarray  # (texts,) bool: left with no word the model reads (label = its prior)

    @property
    def labels(self) -> np.ndarray:
        """The most probable class of each text."""
        return self.probs.argmax(-1)


def predict(trained: TrainedClassifier, texts: Sequence[str], batch_size: int = 64) -> Predictions:
    """The class probabilities of ``texts``, tokenised as the run's training text was; as
    in training, a run with ``max_len`` sees (and counts) only the first (or last, as its
    ``keep``) ``max_len`` words of each text."""
    clean = tc.get_dataset(trained.dataset).clean
    tokens = [tc.cut(clean(t).split(), trained.max_len, trained.keep) for t in texts]
    index = trained.vocab.index
    unknown = sum(w not in index for s in tokens for w in s)
    ids = trained.vocab.encode(tokens)

    @jax.jit
    def probs(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        logits = trained.model.apply({"params": params}, batch["tokens"], batch["lengths"])
        return jax.nn.softmax(logits.astype(np.float32))

    result = np.empty((len(ids), trained.model.num_classes), np.float32)
    # each row's index rides in the batch's label slot, so rows land where they came from
    for b in tc.batches(ids, np.arange(len(ids), dtype=np.int32), batch_size):
        n = int(b["weights"].sum())
        result[b["labels"][:n]] = np.asarray(probs(trained.params, b))[:n]
    return Predictions(result, sum(len(s) for s in tokens), unknown,
                       np.array([len(s) == 0 for s in ids], bool))
