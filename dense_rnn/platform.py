"""Process set-up that makes the binaries fast by default."""

from __future__ import annotations

import os
import sys

# glibc's malloc otherwise returns large buffers to the OS and re-faults them every
# training step (25-45% of a small LSTM step on CPU, JAX and PyTorch alike).
FAST_MALLOC_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": "2000000000",
    "MALLOC_TRIM_THRESHOLD_": "4000000000",
}


def reexec_with_fast_malloc() -> None:
    """Re-executes this process once with ``FAST_MALLOC_ENV`` unless it is already set.

    malloc reads these variables at start-up only, hence the re-exec. Values the user set
    are kept; ``DENSE_RNN_NO_REEXEC=1`` turns this off.
    """
    if not sys.platform.startswith("linux") or os.environ.get("DENSE_RNN_NO_REEXEC"):
        return
    missing = {k: v for k, v in FAST_MALLOC_ENV.items() if k not in os.environ}
    if not missing:
        return
    env = {**os.environ, **missing}
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def enable_compilation_cache() -> str | None:
    """Turns on JAX's persistent compilation cache, so a rerun (a resumed run, the next fold
    or dataset of a table) loads its compiled steps instead of compiling them again.

    The cache lives in ``$JAX_COMPILATION_CACHE_DIR`` if set, else in
    ``$XDG_CACHE_HOME/dense_rnn/jax`` (``~/.cache/dense_rnn/jax``); an explicitly empty
    ``JAX_COMPILATION_CACHE_DIR=`` turns it off. JAX's other settings apply: entries are
    written for compiles over ``jax_persistent_cache_min_compile_time_secs`` (1 s) and kept
    unbounded (JAX's size-bounded mode fails on any entry whose access-time file is missing,
    e.g. after a kill between its two writes). Returns the directory used, or ``None``.
    """
    import jax

    if jax.config.jax_compilation_cache_dir:  # set by the user (environment or code)
        return jax.config.jax_compilation_cache_dir
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:  # set, and empty: off
        return None
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(root, "dense_rnn", "jax")
    jax.config.update("jax_compilation_cache_dir", path)
    return path
