"""The shared entry point of the experiment binaries."""

from __future__ import annotations

import sys
from collections.abc import Callable

from absl import app, logging

from dense_rnn.errors import UserError
from dense_rnn.platform import enable_compilation_cache, reexec_with_fast_malloc

# What an interrupted binary says: training checkpoints are atomic, and pending saves finish
# before exit (``Checkpointer`` closes on the way out).
RESUME_HINT = "run the same command again to resume training from the last checkpoint"


def run_binary(run: Callable[[], None]) -> None:
    """Runs ``run`` as an absl program: fast malloc, the persistent compilation cache,
    parsed flags, bad input reported as one ``error: ...`` line on stderr with exit
    status 2, and Ctrl-C as one line saying how to resume, exit status 130."""
    reexec_with_fast_malloc()
    enable_compilation_cache()

    def main(argv: list[str]) -> None:
        logging.set_verbosity(logging.ERROR)
        if len(argv) > 1:
            raise UserError(f"unexpected arguments {' '.join(argv[1:])!r}; every option is a "
                            "--flag=value (--helpfull lists them)")
        run()

    app.run(lambda argv: _one_line_errors(main, argv, interrupted=f"interrupted; {RESUME_HINT}"))


def run_script(main: Callable[[], object]) -> None:
    """Runs an argparse ``main`` (the benchmark tools): fast malloc, bad input reported as one
    ``error: ...`` line on stderr with exit status 2, Ctrl-C as one line, exit status 130."""
    reexec_with_fast_malloc()
    _one_line_errors(main)


def _one_line_errors(fn: Callable[..., object], *args: object,
                     interrupted: str = "interrupted") -> None:
    """Calls ``fn(*args)``; a ``UserError`` becomes one ``error: ...`` line, exit status 2,
    and Ctrl-C the line ``interrupted``, exit status 130 (128 + SIGINT)."""
    try:
        fn(*args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        sys.exit(130)
