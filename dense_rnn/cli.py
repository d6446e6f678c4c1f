"""The shared entry point of the experiment binaries."""

from __future__ import annotations

import sys
from collections.abc import Callable

from absl import app, logging

from dense_rnn.errors import UserError
from dense_rnn.platform import enable_compilation_cache, reexec_with_fast_malloc


def run_binary(run: Callable[[], None]) -> None:
    """Runs ``run`` as an absl program: fast malloc, the persistent compilation cache,
    parsed flags, and bad input reported as one ``error: ...`` line on stderr with exit
    status 2."""
    reexec_with_fast_malloc()
    enable_compilation_cache()

    def main(argv: list[str]) -> None:
        logging.set_verbosity(logging.ERROR)
        try:
            if len(argv) > 1:
                raise UserError(f"unexpected arguments {' '.join(argv[1:])!r}; every option is "
                                "a --flag=value (--helpfull lists them)")
            run()
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    app.run(main)


def run_script(main: Callable[[], object]) -> None:
    """Runs an argparse ``main`` (the benchmark tools): fast malloc, and bad input reported as
    one ``error: ...`` line on stderr with exit status 2."""
    reexec_with_fast_malloc()
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
