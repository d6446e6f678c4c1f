"""File helpers: atomic writes (a killed process leaves the old file or the new one, never
half), and what is wrong with a path."""

from __future__ import annotations

import os
import uuid


def atomic_write(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file, flushed to disk, then renamed.
    The temporary file's name is unique, so processes writing the same file at once (the
    hosts of a multi-host run, on a shared workdir) each replace it whole."""
    tmp = f"{path}.{uuid.uuid4().hex[:12]}.tmp"  # (not mkstemp: it would make the file 0600)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def not_a(path: str, directory: bool = False) -> str:
    """Why ``path`` is not the file (``directory``: the directory) a flag names: "does not
    exist", "is a directory, not a file" or "is a file, not a directory"."""
    if not os.path.exists(path):
        return "does not exist"
    return "is a file, not a directory" if directory else "is a directory, not a file"
