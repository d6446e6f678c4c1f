"""What the reproduction drivers share: runs of a single-run binary, each in its own workdir
``ROOT/NAME`` and finished once it holds ``summary.json``, started ``parallel`` at a time."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from dense_rnn.errors import UserError

RECORDED_ENV = ("XLA_FLAGS",)  # environment that changes a run, written into command.txt


def check(root: str, parallel: int, report_only: bool) -> None:
    """Rejects ``parallel`` below 1 and, when only reporting, a ``root`` that does not exist."""
    if parallel < 1:
        raise UserError(f"--parallel={parallel}: the runs at a time must be at least 1")
    if report_only and not os.path.isdir(root):
        raise UserError(f"--root={root} does not exist; --report_only reads the finished runs "
                        "under an existing root")


def summary(root: str, name: str) -> dict | None:
    """The ``summary.json`` of run ``name``, or None while it has not finished."""
    path = os.path.join(root, name, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def command_line(cmd: Sequence[str]) -> str:
    """``cmd`` (``sys.executable`` first) as a shell line that reruns it, environment included."""
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in RECORDED_ENV if k in os.environ]
    return " ".join([*env, "python", shlex.join(cmd[1:])])


def launch(module: str, args: Sequence[str], workdir: str) -> subprocess.Popen:
    """Starts ``python -m MODULE ARGS --workdir=WORKDIR``, its command line written to
    ``WORKDIR/command.txt`` and its output appended to ``WORKDIR/train.log``."""
    os.makedirs(workdir, exist_ok=True)
    cmd = [sys.executable, "-m", module, *args, f"--workdir={workdir}"]
    with open(os.path.join(workdir, "command.txt"), "w") as f:
        f.write(command_line(cmd) + "\n")
    with open(os.path.join(workdir, "train.log"), "a") as log:  # the child keeps its copy
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def run_all(root: str, names: Sequence[str], start: Callable[[str], subprocess.Popen],
            parallel: int, after: Mapping[str, str] | None = None) -> None:
    """Runs ``start(name)`` for every unfinished run, ``parallel`` at a time; a run named in
    ``after`` waits until that run has finished, and is skipped if it failed."""
    after = after or {}
    os.makedirs(root, exist_ok=True)
    pending = [n for n in names if summary(root, n) is None]
    running: dict[str, subprocess.Popen] = {}
    while pending or running:
        for name in list(pending):
            if len(running) >= parallel:
                break
            first = after.get(name)
            if first and summary(root, first) is None:
                if first not in running and first not in pending:
                    _log(f"skipped {name}: {first} failed")
                    pending.remove(name)
                continue
            pending.remove(name)
            running[name] = start(name)
            _log(f"started {name}")
        time.sleep(2)
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                _log(f"finished {name} (exit {proc.returncode})")
                del running[name]


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)
