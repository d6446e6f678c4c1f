"""GloVe word vectors from a ``.txt`` or ``.txt.gz`` file of any dimension."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterable, Iterator

import numpy as np

from dense_rnn.errors import UserError
from dense_rnn.files import not_a


def _vector_lines(path: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of every non-blank line but a word2vec-style header line
    ``COUNT DIM``. Unreadable files, and lines with empty fields, end in a ``UserError``."""
    if not os.path.isfile(path):
        raise UserError(f"embeddings file {path} {not_a(path)}; pass --embeddings=PATH to a GloVe "
                        ".txt or .txt.gz file, or none for random embeddings (the table "
                        "drivers: --embeddings=)")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="strict") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                fields = line.rstrip("\n").rstrip(" ").split(" ")
                if "" in fields:
                    raise UserError(f"{path}:{n}: an empty field (two spaces in a row, or a "
                                    f"leading space): {line[:40]!r}; fields must be "
                                    "separated by single spaces")
                if not (n == 1 and len(fields) == 2 and all(x.isdigit() for x in fields)):
                    yield n, fields
    except (UnicodeDecodeError, OSError, EOFError, ValueError, zlib.error) as e:
        raise UserError(f"cannot read embeddings {path} ({type(e).__name__}: {e}); "
                        "expected a UTF-8 GloVe .txt or .txt.gz file") from None


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _empty(path: str) -> UserError:
    return UserError(f"embeddings file {path} has no vector lines 'word v_1 ... v_d' "
                     "(it is empty or blank); pass a GloVe .txt or .txt.gz file")


def _first_line_dim(path: str, n: int, fields: list[str]) -> int:
    """The dimension of the first vector line ``fields`` (line ``n``), which must be a word
    and numbers."""
    if len(fields) < 2 or not all(_is_number(x) for x in fields[1:]):
        raise UserError(f"{path}:{n} is not a GloVe line ({' '.join(fields)[:40]!r}); pass "
                        "--embeddings=PATH to a GloVe file: lines 'word v_1 ... v_d' of "
                        "numbers, separated by single spaces")
    return len(fields) - 1


def glove_dim(path: str) -> int:
    """The vector dimension of a GloVe file, read from its first vector line."""
    first = next(_vector_lines(path), None)
    if first is None:
        raise _empty(path)
    return _first_line_dim(path, *first)


def load_glove(
    path: str, words: Iterable[str] | None = None
) -> tuple[int, dict[str, np.ndarray]]:
    """``(dim, {word: float32 vector})`` for ``words`` (all words if None) found in the file.

    Lines are ``word v_1 ... v_d``, separated by single spaces; the dimension is taken from
    the first line, and the last ``d`` fields are the vector (a few GloVe releases have
    spaces inside words). Every line must have ``d`` values; those of the words returned
    must be finite numbers (the others are not parsed). A word2vec-style header line
    ``COUNT DIM`` is skipped.
    """
    wanted = None if words is None else set(words)
    vectors: dict[str, np.ndarray] = {}
    dim = None
    for n, fields in _vector_lines(path):
        if dim is None:
            dim = _first_line_dim(path, n, fields)
        # a longer row is a word with spaces, unless the extra field is a number
        if len(fields) < dim + 1 or (len(fields) > dim + 1 and _is_number(fields[-dim - 1])):
            raise UserError(f"{path}:{n}: {len(fields) - 1} values where the first "
                            f"line has {dim}; every line must be a word and {dim} numbers")
        word = " ".join(fields[: len(fields) - dim])
        if wanted is None or word in wanted:
            try:
                with np.errstate(over="ignore"):  # beyond float32: the check below says so
                    vectors[word] = np.asarray(fields[-dim:], dtype=np.float32)
            except ValueError as e:
                raise UserError(f"{path}:{n}: the vector of {word!r} is not numbers ({e}); "
                                "fix or remove that line") from None
            if not np.isfinite(vectors[word]).all():
                raise UserError(f"{path}:{n}: the vector of {word!r} is not finite (nan, inf or "
                                "beyond float32); fix or remove that line")
    if dim is None:
        raise _empty(path)
    return dim, vectors
