"""Atomic file writes: a killed process leaves the old file or the new one, never half."""

from __future__ import annotations

import os


def atomic_write(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file, flushed to disk, then renamed."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
