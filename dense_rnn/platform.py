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
