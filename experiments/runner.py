"""What the reproduction drivers share: runs of a single-run binary, each in its own workdir
``ROOT/NAME``, started ``parallel`` at a time. A run has finished once it holds
``summary.json``; a driver rerun with other flags for it (``--extra=--max_epochs=60`` after a
shorter budget) launches it again, and the binary resumes it from its checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from dense_rnn.errors import UserError

RECORDED_ENV = ("XLA_FLAGS",)  # environment that changes a run, written into command.txt
# A finished run's files while the same workdir runs under another command.
PREVIOUS = {"summary.json": "summary.previous.json", "command.txt": "command.previous.txt"}


def check(root: str, parallel: int, report_only: bool) -> None:
    """Rejects ``parallel`` below 1 and, when only reporting, a ``root`` that does not exist."""
    if parallel < 1:
        raise UserError(f"--parallel={parallel}: the runs at a time must be at least 1")
    if report_only and not os.path.isdir(root):
        raise UserError(f"--root={root} does not exist; --report_only reads the finished runs "
                        "under an existing root")


def check_parent(flag: str, path: str | None) -> None:
    """Rejects an output file ``--flag=path`` whose directory does not exist (before any
    run, not after the suite)."""
    if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise UserError(f"--{flag}={path}: its directory does not exist")


EXTRA_HELP = ("Flags for every run, e.g. --extra=--max_epochs=20; several in one (split at "
              "each comma that starts a --flag: --extra=--depths=2,4,--dry_run) or repeated.")


def extra_args(values: Sequence[str]) -> list[str]:
    """The flags of every ``--extra`` value, each split at the commas that start another
    ``--flag`` (a comma inside a value, as in ``--depths=2,4``, stays)."""
    return [arg for value in values for arg in re.split(r",(?=--)", value) if arg]


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


def launch(module: str, args: Sequence[str], workdir: str) -> subprocess.Popen | None:
    """Starts ``python -m MODULE ARGS --workdir=WORKDIR``, its command line written to
    ``WORKDIR/command.txt`` and its output appended to ``WORKDIR/train.log``; or returns None
    when the run has finished under this very command. A summary written under another
    command is kept as ``summary.previous.json`` (its command as ``command.previous.txt``)
    until the new run writes its own; ``run_all`` puts both back if the new run fails."""
    os.makedirs(workdir, exist_ok=True)
    cmd = [sys.executable, "-m", module, *args, f"--workdir={workdir}"]
    line = command_line(cmd) + "\n"
    done, recorded = os.path.join(workdir, "summary.json"), os.path.join(workdir, "command.txt")
    if os.path.exists(done):
        with contextlib.suppress(FileNotFoundError), open(recorded) as f:
            if f.read() == line:
                return None
        os.replace(done, os.path.join(workdir, PREVIOUS["summary.json"]))
        with contextlib.suppress(FileNotFoundError):
            os.replace(recorded, os.path.join(workdir, PREVIOUS["command.txt"]))
    with open(recorded, "w") as f:
        f.write(line)
    with open(os.path.join(workdir, "train.log"), "a") as log:  # the child keeps its copy
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def run_all(root: str, names: Sequence[str],
            start: Callable[[str], subprocess.Popen | None], parallel: int,
            after: Mapping[str, str] | None = None) -> list[str]:
    """Runs ``start(name)`` (``launch``: None for a run already finished) for every run,
    ``parallel`` at a time; a run named in ``after`` waits until that run has finished, and
    is skipped if it failed (also when it kept an earlier command's results). Returns the runs
    that failed or were skipped, each with why."""
    after = after or {}
    os.makedirs(root, exist_ok=True)
    pending = list(names)
    running: dict[str, subprocess.Popen] = {}
    failed: dict[str, str] = {}  # name -> why
    while pending or running:
        for name in list(pending):
            if len(running) >= parallel:
                break
            first = after.get(name)
            if first and (first in failed or summary(root, first) is None):
                if first not in running and first not in pending:
                    _log(f"skipped {name}: {first} failed")
                    failed[name] = f"skipped: {first} failed"
                    pending.remove(name)
                continue
            pending.remove(name)
            proc = start(name)
            if proc is None:
                _log(f"{name} has finished (its summary.json is of this command)")
            else:
                running[name] = proc
                _log(f"started {name}")
        time.sleep(2)
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                if proc.returncode == 0:
                    _log(f"finished {name}")
                    continue
                failed[name] = f"exit {proc.returncode}"
                kept = _restore_previous(os.path.join(root, name))
                _log(f"failed {name} (exit {proc.returncode}; its log: "
                     f"{os.path.join(root, name, 'train.log')})"
                     + ("; its previous results are kept" if kept else ""))
    return [f"{name} ({why})" for name, why in failed.items()]


def _restore_previous(workdir: str) -> bool:
    """Puts back the summary (and command) of a finished run that a failed relaunch moved
    aside; returns whether there was one."""
    moved = os.path.join(workdir, PREVIOUS["summary.json"])
    if os.path.exists(os.path.join(workdir, "summary.json")) or not os.path.exists(moved):
        return False
    for current, previous in PREVIOUS.items():
        if os.path.exists(os.path.join(workdir, previous)):
            os.replace(os.path.join(workdir, previous), os.path.join(workdir, current))
        else:  # the summary had no recorded command: it is not this command's either
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(workdir, current))
    return True


def check_all_finished(failed: Sequence[str], root: str) -> None:
    """After the report: a ``UserError`` (exit status 2) naming the runs that failed."""
    if failed:
        raise UserError(f"{len(failed)} run(s) did not finish: {', '.join(failed)}; each "
                        f"one's output is in {root}/NAME/train.log")


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)
