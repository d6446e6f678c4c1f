"""Penn Treebank for word-level language modelling (Mikolov's splits).

Read from the local ``ptb.{train,valid,test}.txt`` files, or through Hugging Face
``datasets`` from a hub dataset for users online (e.g. ``ptb_text_only@refs/convert/parquet``,
the hub's Parquet export of ``ptb_text_only``). The local files are read directly, not by
the ``text`` builder, which would take a directory name with ``[`` or ``*`` as a glob and
serve a file rewritten under its old mtime from its cache.
Each line is a sentence; ``<eos>`` ends it. The corpus is laid out as ``batch`` contiguous
streams and cut into windows of ``num_steps`` tokens for truncated BPTT (Zaremba et al.).
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import os

import numpy as np

from dense_rnn.errors import UserError
from dense_rnn.files import atomic_write, not_a

SPLITS = ("train", "valid", "test")
EOS = "<eos>"
UNK = "<unk>"
VOCAB_FILE = "vocab.txt"  # the training vocabulary, one word per line in id order
# Tokens (<eos> included) of Mikolov's splits, as ``encode`` counts them.
SIZES = {"train": 929_589, "valid": 73_760, "test": 82_430}


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Token ids of each split and the vocabulary (id -> word)."""

    vocab: list[str]
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray


# Where the files come from, for the errors that ask for them
WHERE = "the data/ folder of Mikolov's simple-examples.tgz; BUILD.md, \"Data\""


def _check_text_file(path: str) -> None:
    if not os.path.isfile(path):
        raise UserError(f"PTB file {path} {not_a(path)}; pass --data_dir=DIR holding "
                        f"ptb.train.txt, ptb.valid.txt and ptb.test.txt ({WHERE})")
    if os.path.getsize(path) == 0:
        raise UserError(f"PTB file {path} is empty; restore it from the PTB distribution")
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                if b"\0" in chunk:
                    raise UnicodeError
                decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except UnicodeError:
        raise UserError(f"PTB file {path} is not UTF-8 text; point --data_dir at the "
                        "plain-text PTB files") from None
    except OSError as e:
        raise UserError(f"cannot read PTB file {path}: {e.strerror}") from None


def _load_lines(data_dir: str | None, hf_dataset: str | None) -> dict[str, list[str]]:
    if hf_dataset:
        from dense_rnn.data import hub  # here: Hugging Face datasets only when data is read

        ds = hub.load(hf_dataset)
        names = {"train": "train", "valid": "validation", "test": "test"}
        if set(names.values()) - set(ds) or not {"sentence", "text"} & set(
                ds["train"].column_names):
            raise UserError(f"--hf_dataset={hf_dataset} needs train/validation/test splits "
                            f"with a sentence or text column; it has splits {', '.join(ds)}")
        column = "sentence" if "sentence" in ds["train"].column_names else "text"
        return {s: hub.texts(ds[names[s]], column, f"--hf_dataset={hf_dataset} split "
                                                  f"{names[s]}") for s in SPLITS}
    if not data_dir or not os.path.isdir(data_dir):
        raise UserError(f"PTB data dir {data_dir!r} {not_a(data_dir or '', directory=True)}; "
                        "pass --data_dir=DIR holding ptb.train.txt, ptb.valid.txt and "
                        f"ptb.test.txt ({WHERE})")
    files = {s: os.path.join(data_dir, f"ptb.{s}.txt") for s in SPLITS}
    lines = {}
    for s, path in files.items():
        _check_text_file(path)
        with open(path, encoding="utf-8") as f:  # decodes: checked just now
            lines[s] = f.read().splitlines()
    return lines


def build_vocab(lines: list[str]) -> list[str]:
    """Words by decreasing count, ties by word; ``<eos>`` counted once per line."""
    counts = collections.Counter(w for line in lines for w in line.split())
    counts[EOS] += len(lines)
    return sorted(counts, key=lambda w: (-counts[w], w))


def write_vocab(path: str, vocab: list[str]) -> None:
    """Writes ``vocab`` one word per line (id order), atomically."""
    atomic_write(path, "".join(w + "\n" for w in vocab))


def read_vocab(path: str) -> list[str]:
    """The vocabulary ``write_vocab`` wrote to ``path``."""
    if not os.path.isfile(path):
        raise UserError(f"no vocabulary file {path}; it is written by training runs "
                        "(experiments.ptb_lm) in their workdir")
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"vocabulary file {path} is unreadable ({type(e).__name__}); restore "
                        "it, or use a new --workdir") from None


def encode(lines: list[str], word_to_id: dict[str, int], source: str = "the text") -> np.ndarray:
    """Token ids of ``lines``, each line followed by ``EOS``; other words become ``UNK``
    (an error naming ``source`` without one)."""
    unk = word_to_id.get(UNK)
    ids = []
    for line in lines:
        for w in line.split() + [EOS]:
            i = word_to_id.get(w, unk)
            if i is None:
                raise UserError(f"word {w!r} of {source} is not in the training vocabulary, "
                                f"which has no {UNK} token to stand for it; map rare words "
                                f"to {UNK} in the training split too, as PTB's files do")
            ids.append(i)
    return np.asarray(ids, np.int32)


def load_ptb(data_dir: str | None, hf_dataset: str | None = None) -> Corpus:
    """Reads the three splits; the vocabulary comes from the training split."""
    lines = _load_lines(data_dir, hf_dataset)
    vocab = build_vocab(lines["train"])
    word_to_id = {w: i for i, w in enumerate(vocab)}
    source = f"--hf_dataset={hf_dataset}" if hf_dataset else f"the files in {data_dir}"
    splits = {s: encode(lines[s], word_to_id, f"the {s} split ({source})") for s in SPLITS}
    for s, ids in splits.items():
        if len(ids) < 2:
            raise UserError(f"PTB split {s!r} holds no text; check {source}")
    return Corpus(vocab=vocab, **splits)


def size_warning(corpus: Corpus) -> str | None:
    """A line naming the splits whose token counts are not those of Mikolov's splits (a
    file cut short, or another corpus), or None."""
    other = [f"{s} {len(getattr(corpus, s)):,} (Mikolov's: {n:,})"
             for s, n in SIZES.items() if len(getattr(corpus, s)) != n]
    return (f"warning: PTB tokens: {', '.join(other)}; is a file cut short, or is this "
            "another corpus?") if other else None


def batchify(ids: np.ndarray, batch: int, split: str = "a split",
             flag: str = "the batch size") -> np.ndarray:
    """Lays ``ids`` out as ``batch`` contiguous streams: ``(batch, len(ids) // batch)``; too
    few tokens for two a stream is a ``UserError`` naming ``split`` and the ``flag`` that
    set ``batch``."""
    n = len(ids) // batch
    if n < 2:
        raise UserError(f"{split} of {len(ids)} tokens is too short for batch size {batch}: "
                        f"each of the {batch} streams needs 2 tokens; lower {flag}")
    return ids[: batch * n].reshape(batch, n)


def num_windows(streams: np.ndarray, num_steps: int, drop_remainder: bool) -> int:
    """Windows per pass; the last, shorter one is kept unless ``drop_remainder``."""
    n = streams.shape[1] - 1
    return n // num_steps if drop_remainder else -(-n // num_steps)


def window(streams: np.ndarray, i: int, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and next-word targets of window ``i``: ``(batch, <= num_steps)`` each."""
    start = i * num_steps
    end = min(start + num_steps, streams.shape[1] - 1)
    return streams[:, start:end], streams[:, start + 1 : end + 1]
