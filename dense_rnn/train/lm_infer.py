"""Sampling from and scoring with a trained PTB language model.

A workdir written by ``experiments.ptb_lm`` holds all that is needed: ``run_identity.json``
(the model's config), ``vocab.txt`` (the training vocabulary) and ``best/<step>/`` (the
parameters with the best validation perplexity).

Every scored sentence starts from a zero state after ``<eos>`` (PTB's sentence separator)
and ends with ``<eos>``, which is scored too, as in PTB perplexities. Sampling starts the
same way and carries its state across the ``<eos>`` it draws, as training does. Words
outside the vocabulary are mapped to ``<unk>``. Log-probabilities are natural logarithms
(nats).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dense_rnn.configs.ptb import LMConfig
from dense_rnn.data import ptb
from dense_rnn.errors import UserError
from dense_rnn.files import not_a
from dense_rnn.models.lm import LanguageModel
from dense_rnn.train import checkpoint, lm

# Scoring pads sentences to a multiple of this length (fewer recompilations), and runs one
# longer than SCORE_WINDOW tokens in windows of that length, carrying the state.
LENGTH_BUCKET = 16
SCORE_WINDOW = 512


@dataclasses.dataclass(frozen=True)
class TrainedLM:
    """A trained model, its parameters and its vocabulary."""

    config: LMConfig
    model: LanguageModel
    params: Any
    vocab: list[str]
    word_to_id: dict[str, int] = dataclasses.field(init=False, repr=False)  # from vocab
    eos: int = dataclasses.field(init=False)  # the id of <eos>, the sentence separator

    def __post_init__(self) -> None:
        """Indexes the vocabulary once."""
        word_to_id = {w: i for i, w in enumerate(self.vocab)}
        object.__setattr__(self, "word_to_id", word_to_id)
        object.__setattr__(self, "eos", word_to_id[ptb.EOS])


def load(workdir: str) -> TrainedLM:
    """The best-validation parameters of the run in ``workdir``."""
    identity = checkpoint.read_identity(workdir)
    if identity is None:
        raise UserError(f"no training run in {workdir} (no {checkpoint.IDENTITY_FILE}); pass "
                        "the --workdir of a finished experiments.ptb_lm run")
    fields = dataclasses.fields(LMConfig)
    if any(f.default is dataclasses.MISSING and f.name not in identity for f in fields):
        raise UserError(f"{workdir} holds no experiments.ptb_lm run (a classifier's?); pass "
                        "the --workdir of a language-model run")
    known = {f.name for f in fields}
    config = LMConfig(**{k: v for k, v in identity.items() if k in known})
    vocab_path = os.path.join(workdir, ptb.VOCAB_FILE)
    if not os.path.isfile(vocab_path):
        raise UserError(f"{workdir} has no {ptb.VOCAB_FILE} (not a run of this version); "
                        "rerun its training with this version to write it")
    vocab = ptb.read_vocab(vocab_path)
    if len(vocab) > config.vocab_size or ptb.EOS not in vocab:
        raise UserError(f"{workdir}/{ptb.VOCAB_FILE} does not fit the run's config "
                        f"({len(vocab)} words, vocab_size {config.vocab_size})")
    params = checkpoint.load_best(workdir, identity, lm.param_shapes(config),
                                  "after the first validation")
    return TrainedLM(config, lm.make_model(config), params, vocab)


def encode_words(words: Iterable[str], word_to_id: dict[str, int]) -> tuple[list[int], int]:
    """Word ids, unknown words mapped to ``<unk>``; also returns how many were unknown."""
    unk = word_to_id.get(ptb.UNK)
    ids, unknown = [], 0
    for w in words:
        i = word_to_id.get(w)
        if i is None:
            if unk is None:
                raise UserError(f"word {w!r} is not in the vocabulary, which has no {ptb.UNK}")
            i, unknown = unk, unknown + 1
        ids.append(i)
    return ids, unknown


def make_step(model: LanguageModel) -> Callable:
    """Jitted ``(params, carries, tokens (batch,)) -> (log_probs (batch, vocab), carries)``:
    one time step with the state carried."""

    def step(params: Any, carries: tuple, tokens: jax.Array) -> tuple[jax.Array, tuple]:
        logits, carries = model.apply({"params": params}, tokens[:, None], carries)
        return jax.nn.log_softmax(logits[:, 0].astype(jnp.float32)), carries

    return jax.jit(step)


def _draw(key: jax.Array, log_probs: jax.Array, temperature: jax.Array) -> jax.Array:
    """A token from ``softmax(log_probs / temperature)``; the argmax when temperature is 0."""
    sampled = jax.random.categorical(key, log_probs / jnp.maximum(temperature, 1e-6))
    return jnp.where(temperature > 0, sampled, jnp.argmax(log_probs, -1))


def generate(trained: TrainedLM, prompt: str = "", num_words: int = 50,
             temperature: float = 1.0, seed: int = 0) -> Iterator[str]:
    """``num_words`` words drawn one at a time after ``<eos>`` and the ``prompt``, each
    yielded as soon as it is drawn.

    The same ``seed`` gives the same words. ``temperature`` 0 is greedy decoding. Bad
    arguments are refused here, before the first word.
    """
    if not 0 <= temperature < float("inf") or num_words < 0:  # also refuses a NaN one
        raise UserError(f"temperature ({temperature}) must be finite and >= 0, and num_words "
                        f"({num_words}) >= 0")
    prompt_ids, _ = encode_words(prompt.split(), trained.word_to_id)

    def words() -> Iterator[str]:
        step = make_step(trained.model)
        n = len(trained.vocab)  # ids past the vocabulary (vocab_size > n) are never drawn
        draw = jax.jit(lambda key, log_probs, temp: _draw(key, log_probs[:, :n], temp))
        carries = trained.model.zero_carries(1)
        for token in [trained.eos, *prompt_ids]:
            log_probs, carries = step(trained.params, carries, jnp.asarray([token], jnp.int32))
        key, temp = jax.random.key(seed), jnp.float32(temperature)
        for i in range(num_words):
            token = draw(jax.random.fold_in(key, i), log_probs, temp)
            yield trained.vocab[int(token[0])]
            if i + 1 < num_words:
                log_probs, carries = step(trained.params, carries, token)

    return words()


def sample(trained: TrainedLM, prompt: str = "", num_words: int = 50,
           temperature: float = 1.0, seed: int = 0) -> list[str]:
    """The words of ``generate``, as a list."""
    return list(generate(trained, prompt, num_words, temperature, seed))


def stream_text(words: Iterable[str]) -> Iterator[str]:
    """Words as pieces of text, one sentence a line (``<eos>`` ends a line); empty sentences
    before the first word and after the last are dropped (no leading or trailing newline),
    one between two words is an empty line."""
    newlines, line_open = 0, False
    for w in words:
        if w == ptb.EOS:
            newlines, line_open = newlines + line_open + (newlines > 0), False
            continue
        yield "\n" * newlines + (" " if line_open else "") + w
        newlines, line_open = 0, True


def render(words: Iterable[str]) -> str:
    """Words as text, one sentence a line (``stream_text`` joined)."""
    return "".join(stream_text(words))


def make_window_log_probs(model: LanguageModel) -> Callable:
    """Jitted ``(params, carries, inputs, targets, mask) -> ((batch,), carries)``: summed
    target log-probs of every row over one window, from and to a carried state."""

    def fn(params: Any, carries: tuple, inputs: jax.Array, targets: jax.Array,
           mask: jax.Array) -> tuple[jax.Array, tuple]:
        nll, carries = model.apply({"params": params}, inputs, carries, targets)
        return -jnp.sum(nll * mask, -1), carries

    return jax.jit(fn)


def sentence_log_probs(trained: TrainedLM, sentences: list[list[int]], batch_size: int = 32,
                       window: int = SCORE_WINDOW) -> np.ndarray:
    """``log p(w_1 .. w_n <eos> | <eos>)`` of every sentence of word ids, in batches; a
    sentence longer than ``window`` tokens runs in windows of that length, the state carried
    from one to the next (memory bounded by the window, not the sentence)."""
    fn = make_window_log_probs(trained.model)
    out = []
    for start in range(0, len(sentences), batch_size):
        chunk = [s + [trained.eos] for s in sentences[start:start + batch_size]]
        longest = max(map(len, chunk))
        bucket = window if longest > window else LENGTH_BUCKET  # few shapes, little padding
        length = -(-longest // bucket) * bucket
        rows = min(batch_size, 1 << (len(chunk) - 1).bit_length())
        targets = np.full((rows, length), trained.eos, np.int32)
        mask = np.zeros((rows, length), np.float32)
        for r, s in enumerate(chunk):
            targets[r, :len(s)], mask[r, :len(s)] = s, 1.0
        inputs = np.concatenate([np.full((rows, 1), trained.eos, np.int32),
                                 targets[:, :-1]], axis=1)
        carries, total = trained.model.zero_carries(rows), np.zeros(rows)
        for w in range(0, length, window):
            part = slice(w, w + window)
            log_probs, carries = fn(trained.params, carries, inputs[:, part], targets[:, part],
                                    mask[:, part])
            total += np.asarray(log_probs)
        out.append(total[:len(chunk)])
    return np.concatenate(out) if out else np.zeros((0,))


@dataclasses.dataclass(frozen=True)
class Scores:
    """Per-sentence log-probabilities of a text and its perplexity."""

    sentences: list[str]
    log_probs: np.ndarray  # nats, one per sentence
    num_tokens: int  # words and one <eos> per sentence
    num_unknown: int  # words mapped to <unk>

    @property
    def perplexity(self) -> float:
        """``exp`` of the mean negative log-probability per token (``inf`` past a float)."""
        return lm.perplexity(-float(self.log_probs.sum()) / self.num_tokens)


def score_file(trained: TrainedLM, path: str) -> Scores:
    """Scores every non-empty line of ``path`` as one sentence (words split on spaces)."""
    if not os.path.isfile(path):
        raise UserError(f"text file {path} {not_a(path)}; pass --text_file=FILE, one sentence "
                        "a line")
    try:
        with open(path, encoding="utf-8-sig") as f:  # a leading byte-order mark is not a word
            sentences = [" ".join(line.split()) for line in f if line.strip()]
    except UnicodeDecodeError:
        raise UserError(f"text file {path} is not UTF-8 text; give one sentence a line") from None
    if not sentences:
        raise UserError(f"text file {path} holds no words")
    word_to_id = trained.word_to_id
    encoded = [encode_words(s.split(), word_to_id) for s in sentences]
    ids = [e[0] for e in encoded]
    return Scores(sentences, sentence_log_probs(trained, ids),
                  num_tokens=sum(len(s) + 1 for s in ids),
                  num_unknown=sum(e[1] for e in encoded))
