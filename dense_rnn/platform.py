"""Process set-up that makes the binaries fast by default."""

from __future__ import annotations

import ctypes
import os
import sys

# glibc's malloc otherwise returns large buffers to the OS and re-faults them every
# training step (25-45% of a small LSTM step on CPU, JAX and PyTorch alike).
FAST_MALLOC_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": "2000000000",
    "MALLOC_TRIM_THRESHOLD_": "4000000000",
}


# XLA's Triton GEMM autotuning compiles and times dozens of kernels for every matrix-product
# shape of a program. On an H200 (benchmarks/RESULTS.md, run W; the peers compiling at the
# same time) it took the DC-Bi-LSTM training step's compile from 52 s to 250 s, for a step
# 1.6x faster, and HM-DenseGRU's from 20 s to 84 s (1.4x); the LM training steps' from
# 10-19 s to 38-85 s, for steps 1.10-1.26x faster at hidden sizes 200 and 650 and 0.70x at
# 1500 (run AA, paired): off, no PTB run loses more than about two minutes. Only XLA's GPU
# compiler reads these flags.
GPU_XLA_FLAGS = {"xla_gpu_enable_triton_gemm": "false"}
ADDED_XLA_FLAGS = "DENSE_RNN_ADDED_XLA_FLAGS"  # what ``default_xla_flags`` put before the user's


def default_xla_flags() -> None:
    """Puts ``GPU_XLA_FLAGS`` in front of ``XLA_FLAGS``, each one unless the user's
    ``XLA_FLAGS`` sets it (``--xla_gpu_enable_triton_gemm=true`` gives XLA's own default
    back); a value that names a file of flags (XLA reads one that does not start with
    ``-`` so) is left alone. XLA reads the variable when JAX starts its backend, so this
    runs first."""
    given = os.environ.get("XLA_FLAGS", "")
    if given.strip() and not given.lstrip().startswith("-"):
        return
    names = {token.split("=", 1)[0].lstrip("-") for token in given.split()}
    added = " ".join(f"--{k}={v}" for k, v in GPU_XLA_FLAGS.items() if k not in names)
    if added:  # in front: XLA ignores what follows a token that is no --flag
        os.environ["XLA_FLAGS"] = f"{added} {given}" if given else added
        os.environ[ADDED_XLA_FLAGS] = added


def share_gpu_memory() -> None:
    """For processes that may share a GPU (an inference run beside a training run, a
    driver's runs started several at a time): JAX takes GPU memory as it needs it instead
    of 75% up front (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless the user set it). Runs
    before JAX starts its backend."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def user_xla_flags() -> str:
    """``XLA_FLAGS`` as the user set it, without what ``default_xla_flags`` added ("" if
    unset)."""
    value, added = os.environ.get("XLA_FLAGS", ""), os.environ.get(ADDED_XLA_FLAGS)
    if added and value.startswith(added):
        rest = value[len(added):]
        return rest[1:] if rest.startswith(" ") else rest
    return value


# mallopt's parameter numbers (glibc's malloc.h) for FAST_MALLOC_ENV's variables
_MALLOPT = {"MALLOC_ARENA_MAX": -8, "MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_TRIM_THRESHOLD_": -1}


def fast_malloc() -> bool:
    """Sets glibc's malloc in this running process as ``FAST_MALLOC_ENV`` sets it at start-up
    (``mallopt``; a threshold over an ``int`` is capped at 2**31 - 1), for the trainers
    called from Python (a notebook, a user's script), which no re-exec reaches:
    zaremba_small's first 600 steps on a 2-core EPYC ran at 8,600-9,500 tokens/s without it
    and 13,000-16,600 with it, as with the re-exec. A variable the user set is left to them.
    Returns whether every setting took (False off glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, min(int(FAST_MALLOC_ENV[name]), 2**31 - 1)) == 1
               for name, param in _MALLOPT.items() if name not in os.environ)


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
