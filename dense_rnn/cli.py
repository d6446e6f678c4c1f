"""The shared entry point of the experiment binaries."""

from __future__ import annotations

import contextlib
import errno
import logging as pylogging
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Sequence

from absl import app, flags, logging

from dense_rnn.errors import Interrupted, UserError
from dense_rnn.platform import (
    default_xla_flags,
    enable_compilation_cache,
    reexec_with_fast_malloc,
    user_xla_flags,
)

# What an interrupted binary says: training checkpoints are atomic, and pending saves finish
# before exit (``Checkpointer`` closes on the way out).
RESUME_HINT = "run the same command again to resume training"
STOPPING = "stopping after this step, with a checkpoint (Ctrl-C again: at once)"
TERMINATING = "SIGTERM: stopping after this step, with a checkpoint (Ctrl-C: at once)"
INTERRUPTED_HINT = "the same command resumes a training run from its last checkpoint"
# Set by a table driver for its runs (experiments/runner.py): the driver's process id.
STOP_WITH_PARENT = "DENSE_RNN_STOP_WITH_PARENT"


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Callable[[], bool]]:
    """Turns Ctrl-C (SIGINT) and SIGTERM into a request to stop, for a training loop's
    ``should_stop``: the loop checkpoints the step it is on and raises ``Interrupted``, which
    leaves with the signal's number (the binary exits with 128 + it). The signal itself
    only sets a flag, so it cannot be lost in a callback that swallows
    exceptions. A second Ctrl-C interrupts at once. In a run of several processes (a TPU
    pod, ``--multihost``) the signals keep the handlers they had (a binary's: exit at
    once, a save in flight lost, none damaged): the processes would have to agree on the
    step to stop at, and a save by one of them alone would wait forever."""
    import jax

    if jax.process_count() > 1:
        yield lambda: False
        return
    received: list[int] = []

    def request(signum: int, frame: object) -> None:
        if not received:
            print(TERMINATING if signum == signal.SIGTERM else STOPPING, file=sys.stderr,
                  flush=True)
        received.append(signum)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {s: signal.signal(s, request) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(received)
    except Interrupted as e:
        e.signum = received[0] if received else signal.SIGINT
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_at_once(signum: int, frame: object) -> None:
    """Ctrl-C outside a training loop: one line and exit status 130, at once. Raising
    ``KeyboardInterrupt`` instead can be lost (JAX's garbage-collection callback swallows
    it) or end in a traceback (during an import); nothing here needs cleaning up, as
    checkpoints are written atomically."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()  # what a sample or score run has printed so far
    sys.stderr.write(f"interrupted; {INTERRUPTED_HINT}\n")
    sys.stderr.flush()
    os._exit(130)


def command_line(argv: Sequence[str] | None = None) -> str:
    """``argv`` (the interpreter first; default this process's own, ``sys.orig_argv``) as a
    shell line that reruns it, with the user's ``XLA_FLAGS``, which can change a run (not
    those the binaries add themselves): what a run's ``summary.json`` records."""
    argv = sys.orig_argv if argv is None else argv
    xla_flags = user_xla_flags()
    env = [f"XLA_FLAGS={shlex.quote(xla_flags)}"] if xla_flags else []
    return " ".join([*env, "python", shlex.join(argv[1:])])


def _stop_with_parent() -> None:
    """In a table driver's run (``STOP_WITH_PARENT`` set to the driver's id): SIGTERM once
    the driver dies, even killed outright, so the run stops with a checkpoint and the
    driver's rerun resumes it, rather than training on with nobody to wait for it (Linux's
    ``PR_SET_PDEATHSIG``; elsewhere nothing)."""
    parent = os.environ.pop(STOP_WITH_PARENT, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if str(os.getppid()) != parent:  # the driver died before that
        os.kill(os.getpid(), signal.SIGTERM)


def run_binary(run: Callable[[], None]) -> None:
    """Runs ``run`` as an absl program: XLA flags for a quick GPU compile
    (``platform.GPU_XLA_FLAGS``), fast malloc, the persistent compilation cache,
    parsed flags, bad input reported as one ``error: ...`` line on stderr with exit
    status 2, and an interrupted run as one line saying how to resume, exit status 130
    (143 for a training loop stopped by SIGTERM; ``stop_on_signals`` makes it checkpoint
    first); a table driver's run also on its driver's death (``_stop_with_parent``)."""
    signal.signal(signal.SIGINT, _exit_at_once)
    default_xla_flags()
    reexec_with_fast_malloc()
    _stop_with_parent()  # after the re-exec: the variable reaches the process that runs
    enable_compilation_cache()

    def main(argv: list[str]) -> None:
        logging.set_verbosity(logging.ERROR)
        logging.get_absl_handler().addFilter(_not_the_checkpoint_library)
        if len(argv) > 1:
            raise UserError(f"unexpected arguments {' '.join(argv[1:])!r}; every option is a "
                            "--flag=value (--helpfull lists them)")
        run()

    app.run(lambda argv: _one_line_errors(
        main, argv, interrupted=f"interrupted; {INTERRUPTED_HINT}"),
        flags_parser=_parse_flags)


def _not_the_checkpoint_library(record: pylogging.LogRecord) -> bool:
    """Drops orbax's logs of an exception with its traceback (a write failed in a
    background thread): the exception reaches the binaries, which report it in one line."""
    return not (record.exc_info and
                "orbax" in record.pathname.replace(os.sep, "/").split("/"))


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, a bad flag or value reported as one ``error: ...`` line with
    exit status 2 (absl's own prints two lines and exits 1)."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"error: {str(e).splitlines()[0]} (--helpfull lists every flag)", file=sys.stderr)
        sys.exit(2)


def run_script(main: Callable[[], object]) -> None:
    """Runs an argparse ``main`` (the benchmark tools): the binaries' XLA flags and fast
    malloc, bad input reported as one ``error: ...`` line on stderr with exit status 2,
    Ctrl-C as one line, exit status 130."""
    default_xla_flags()
    reexec_with_fast_malloc()
    _one_line_errors(main)


def _one_line_errors(fn: Callable[..., object], *args: object,
                     interrupted: str = "interrupted") -> None:
    """Calls ``fn(*args)``; a ``UserError`` becomes one ``error: ...`` line, exit status 2,
    a stop on request (``Interrupted``) the line ``interrupted: ...`` (``terminated: ...``
    for SIGTERM), exit status 128 + the signal's number, Ctrl-C the line
    ``interrupted ...``, exit status 130 (128 + SIGINT), and output into a closed pipe
    nothing more, exit status 141 (128 + SIGPIPE, as a shell tool's)."""
    try:
        fn(*args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as e:
        word = "terminated" if e.signum == signal.SIGTERM else "interrupted"
        print(f"{word}: {e}; {RESUME_HINT} from there", file=sys.stderr)
        sys.exit(128 + e.signum)
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # stdout's reader has gone (``--mode=sample | head``): quietly
        with contextlib.suppress(Exception):  # no second error at the interpreter's flush
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except Exception as e:
        full = _no_space(e)
        if full is not None:
            where = _written_path(full)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            print(f"error: no space left on device{f' writing {where}' if where else ''}; "
                  "free some space and rerun the same command (a training run resumes from its "
                  "last complete checkpoint)", file=sys.stderr)
            sys.stderr.flush()
            os._exit(2)  # not the checkpointer's pending writes' tracebacks on the way out
        if not _out_of_memory(e):
            raise
        print(f"error: out of memory on {_device()}: {_first_line(e)}; if other processes "
              "share the device, start each with XLA_PYTHON_CLIENT_PREALLOCATE=false (the "
              "drivers' --parallel does), else use a smaller --batch_size (a training run "
              "resumes from its last checkpoint)", file=sys.stderr)
        sys.exit(2)


def _no_space(e: BaseException | None) -> BaseException | None:
    """``e``, or the exception it was raised from, that is a full disk (``ENOSPC``; the
    checkpoint library reports it in its message), or None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e):
            return e
        e = e.__cause__ or e.__context__
    return None


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is XLA's failure to allocate device (or host) memory."""
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text and "out of memory" in text.lower()


def _first_line(e: BaseException) -> str:
    """The first line of ``e``'s message, without XLA's empty ``RESOURCE_EXHAUSTED: :``."""
    return re.sub(r"^RESOURCE_EXHAUSTED:( :)? ?", "", str(e).strip().splitlines()[0])


def _device() -> str:
    """The default device's kind (``NVIDIA H200``, ``cpu``), for an error line."""
    try:
        import jax

        return jax.devices()[0].device_kind
    except Exception:  # an error line must not fail on the way
        return "the device"


def _written_path(e: BaseException) -> str | None:
    """The file a full disk's error ``e`` names: an ``OSError``'s, or the first quoted
    absolute path in the checkpoint library's message."""
    if getattr(e, "filename", None):
        return str(e.filename)
    quoted = re.search(r'"(/[^"]+)"', str(e))
    return quoted.group(1) if quoted else None
