"""File helpers: atomic writes (a killed process leaves the old file or the new one, never
half), a directory's lock, and what is wrong with a path."""

from __future__ import annotations

import errno
import os
import socket
import uuid

from dense_rnn.errors import UserError

try:
    import fcntl
except ImportError:  # Windows: no flock, no lock
    fcntl = None

LOCK_FILE = "run.lock"


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


def lock(directory: str) -> int | None:
    """Takes ``directory``'s lock (an exclusive ``flock`` on its ``run.lock``, released when
    the descriptor it returns is closed or the process ends, however it ends); None where
    the file system (or the OS) has no locks. A lock held by another process, or a
    directory that cannot hold the lock file, is a ``UserError``."""
    if fcntl is None:
        return None
    path = os.path.join(directory, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UserError(f"cannot lock {directory}: {e.strerror}; use a writable "
                        "--workdir") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):  # no locks here (ENOLCK, ...)
                os.close(fd)
                return None
            holder = os.read(fd, 200).decode(errors="replace").strip() or "?"
            raise UserError(f"{directory} is in use by another run (process {holder}); wait "
                            "for it to finish, or use another --workdir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()}:{os.getpid()}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return fd


def not_a(path: str, directory: bool = False) -> str:
    """Why ``path`` is not the file (``directory``: the directory) a flag names: "does not
    exist", "is a directory, not a file" or "is a file, not a directory"."""
    if not os.path.exists(path):
        return "does not exist"
    return "is a file, not a directory" if directory else "is a directory, not a file"
