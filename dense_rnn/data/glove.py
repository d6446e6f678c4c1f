"""GloVe word vectors from a ``.txt`` or ``.txt.gz`` file of any dimension."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable

import numpy as np

from dense_rnn.errors import UserError


def load_glove(
    path: str, words: Iterable[str] | None = None
) -> tuple[int, dict[str, np.ndarray]]:
    """``(dim, {word: float32 vector})`` for ``words`` (all words if None) found in the file.

    Lines are ``word v_1 ... v_d``; the dimension is taken from the first line, and the
    last ``d`` fields are the vector (a few GloVe releases have spaces inside words). A
    word2vec-style header line ``COUNT DIM`` is skipped.
    """
    if not os.path.isfile(path):
        raise UserError(f"embeddings file {path} not found; pass --embeddings=PATH to a GloVe "
                        ".txt or .txt.gz file, or --embeddings= for random embeddings")
    wanted = None if words is None else set(words)
    opener = gzip.open if path.endswith(".gz") else open
    vectors: dict[str, np.ndarray] = {}
    dim = None
    try:
        with opener(path, "rt", encoding="utf-8", errors="strict") as f:
            for n, line in enumerate(f, 1):
                fields = line.rstrip("\n").rstrip(" ").split(" ")
                if len(fields) < 2 or (n == 1 and _is_header(fields)):
                    continue
                if dim is None:
                    dim = len(fields) - 1
                if len(fields) < dim + 1:
                    raise UserError(f"{path}:{n}: {len(fields) - 1} values where the first "
                                    f"line has {dim}; the file is not a GloVe text file")
                word = " ".join(fields[: len(fields) - dim])
                if wanted is None or word in wanted:
                    vectors[word] = np.asarray(fields[-dim:], dtype=np.float32)
    except (UnicodeDecodeError, OSError, EOFError, ValueError) as e:
        raise UserError(f"cannot read embeddings {path} ({type(e).__name__}: {e}); "
                        "expected a UTF-8 GloVe .txt or .txt.gz file") from None
    if dim is None:
        raise UserError(f"embeddings file {path} is empty; pass a GloVe .txt or .txt.gz file")
    return dim, vectors



def _is_header(fields: list[str]) -> bool:
    return len(fields) == 2 and all(f.isdigit() for f in fields)


def glove_dim(path: str) -> int:
    """The vector dimension of a GloVe file, read from its first vector line."""
    if not os.path.isfile(path):
        raise UserError(f"embeddings file {path} not found; pass --embeddings=PATH to a GloVe "
                        ".txt or .txt.gz file, or --embeddings= for random embeddings")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="strict") as f:
            for n, line in enumerate(f, 1):
                fields = line.rstrip("\n").rstrip(" ").split(" ")
                if len(fields) >= 2 and not (n == 1 and _is_header(fields)):
                    return len(fields) - 1
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise UserError(f"cannot read embeddings {path} ({type(e).__name__}: {e}); "
                        "expected a UTF-8 GloVe .txt or .txt.gz file") from None
    raise UserError(f"embeddings file {path} is empty; pass a GloVe .txt or .txt.gz file")
