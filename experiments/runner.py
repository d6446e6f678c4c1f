"""What the reproduction drivers share: runs of a single-run binary, each in its own workdir
``ROOT/NAME``, started ``parallel`` at a time. A run has finished once it holds
``summary.json``; a driver rerun with other flags for it (``--extra=--max_epochs=60`` after a
shorter budget) launches it again, and the binary resumes it from its checkpoint. A driver
interrupted (Ctrl-C, SIGTERM) stops its runs, each with a checkpoint, and waits for them."""

from __future__ import annotations

import collections
import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NoReturn

from dense_rnn import cli, files, platform
from dense_rnn.errors import UserError

# A finished run's files while the same workdir runs under another command.
PREVIOUS = {"summary.json": "summary.previous.json", "command.txt": "command.previous.txt"}


def check(root: str, parallel: int, report_only: bool, record: str | None = None) -> None:
    """Rejects ``parallel`` below 1, a ``root`` that is a file or, when only reporting, does
    not exist, and output directories that cannot be made or written (``root`` unless only
    reporting, ``record`` if given, which may not be ``root``): before any run, not after
    the suite."""
    if parallel < 1:
        raise UserError(f"--parallel={parallel}: the runs at a time must be at least 1")
    if os.path.exists(root) and not os.path.isdir(root):
        raise UserError(f"--root={root} is a file; give a directory (made if missing)")
    if report_only and not os.path.isdir(root):
        raise UserError(f"--root={root} does not exist; --report_only reads the finished runs "
                        "under an existing root")
    if not report_only:
        _check_output_dir("root", root)
    if record and os.path.abspath(record) == os.path.abspath(root):
        raise UserError(f"--record={record} is --root itself; give another directory")
    if record:
        _check_output_dir("record", record)


def check_lists(**lists: Sequence[str] | None) -> None:
    """Rejects a list flag given empty (``--configs=``: it would name nothing) or naming an
    item twice (``--seeds=0,0``: one run counted as two); None is a flag left out."""
    for name, values in lists.items():
        if values is not None and not values:
            raise UserError(f"--{name}= names nothing; name at least one, or leave the flag "
                            "out")
        if twice := sorted(v for v, n in collections.Counter(values or ()).items() if n > 1):
            raise UserError(f"--{name}={','.join(values)} names {', '.join(twice)} twice; "
                            "name each once")


def _check_output_dir(flag: str, path: str) -> None:
    """Makes the directory ``--flag=path`` if need be; a ``UserError`` if it cannot be made
    or written."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise UserError(f"--{flag}={path} is a file; give a directory (made if missing)") from None
    except OSError as e:
        raise UserError(f"--{flag}={path} cannot be made ({e.strerror}); give a directory "
                        "you can write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"--{flag}={path} is not writable; give a directory you can write")


def check_parent(flag: str, path: str | None) -> None:
    """Rejects an output file ``--flag=path`` that is a directory or whose directory does not
    exist or cannot be written (before any run, not after the suite)."""
    if not path:
        return
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"--{flag}={path} is a directory; give a file path")
    if not os.path.isdir(parent):
        raise UserError(f"--{flag}={path}: its directory does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (
            os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UserError(f"--{flag}={path} cannot be written; give a path you can write")


EXTRA_HELP = ("Flags for every run, e.g. --extra=--max_epochs=20; several in one (split at "
              "each comma that starts a --flag: --extra=--depths=2,4,--max_epochs=20) or "
              "repeated.")


def flag_name(arg: str) -> str:
    """The name of a command-line flag ``--name=value`` (or ``--name``)."""
    return arg.lstrip("-").split("=", 1)[0]


def check_data_dir(data_dir: str | None, extra: Sequence[str], report_only: bool) -> None:
    """Rejects a ``--data_dir`` beside ``--extra=--hf_dataset`` (which names every run's
    data), and, unless only reporting, one that is not a directory."""
    if data_dir and any(flag_name(a) == "hf_dataset" for a in extra):
        raise UserError("--extra=--hf_dataset names every run's data: drop --data_dir")
    if data_dir and not report_only and not os.path.isdir(data_dir):
        raise UserError(f"--data_dir={data_dir} {files.not_a(data_dir, directory=True)}")


def extra_args(values: Sequence[str], reserved: Sequence[str]) -> list[str]:
    """The flags of every ``--extra`` value, each split at the commas that start another
    ``--flag`` (a comma inside a value, as in ``--depths=2,4``, stays). A flag of
    ``reserved``, which the driver sets for each run itself, is a ``UserError``: the binary
    would take the last one given, and a table row would report another run's numbers."""
    args = [arg for value in values for arg in re.split(r",(?=--)", value) if arg]
    for arg in args:
        name = flag_name(arg)
        if name in reserved or (name.startswith("no") and name[2:] in reserved):
            raise UserError(f"--extra={arg}: the driver sets --{name.removeprefix('no')} "
                            "for each run itself; leave it out of --extra")
    return args


def check_extra(module: str, args: Sequence[str], extra: Sequence[str]) -> None:
    """Parses one run's command line (``args``, then ``extra``) with the binary's
    ``--dry_run``, which trains and writes nothing: a misspelt or malformed flag in
    ``--extra`` is one error here, before any run starts, rather than one in every run's log
    and a table of runs "not run". ``--extra`` setting ``--mode`` or ``--dry_run`` itself is
    left to the runs."""
    if not extra or {flag_name(a) for a in extra} & {"mode", "dry_run", "nodry_run"}:
        return
    r = subprocess.run([sys.executable, "-m", module, *args, *extra, "--dry_run"],
                       capture_output=True, text=True, check=False)
    if r.returncode:
        errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        why = errors[-1].removeprefix("error: ") if errors else r.stderr.strip()[-300:]
        raise UserError(f"--extra={','.join(extra)}: {why}")


def summary(root: str, name: str, required: Sequence[str] = ()) -> dict | None:
    """The ``summary.json`` of run ``name``, or None while it has not finished; a file that
    is not a JSON object, or lacks a field of ``required``, is a ``UserError``."""
    path = os.path.join(root, name, "summary.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            s = json.load(f)
        why = (f"a JSON {type(s).__name__}" if not isinstance(s, dict) else
               f"no {', '.join(missing)}" if (missing := [k for k in required if k not in s])
               else None)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = str(e)[:60]
    if why:
        raise UserError(f"{path} is not a run summary ({why}); delete it and rerun the "
                        "command to finish that run again")
    return s


def launch(module: str, args: Sequence[str], workdir: str) -> subprocess.Popen | None:
    """Starts ``python -m MODULE ARGS --workdir=WORKDIR``, its command line written to
    ``WORKDIR/command.txt`` and its output appended to ``WORKDIR/train.log``; or returns None
    when the run has finished under this very command. A summary written under another
    command is kept as ``summary.previous.json`` (its command as ``command.previous.txt``)
    until the new run writes its own; they are put back if it cannot start, and ``run_all``
    puts them back if it fails or is stopped, and deletes them once it has finished."""
    os.makedirs(workdir, exist_ok=True)
    fd = files.lock(workdir)  # a run going there (another driver's) fails this one untouched
    if fd is not None:
        os.close(fd)
    cmd = [sys.executable, "-m", module, *args, f"--workdir={workdir}"]
    line = cli.command_line(cmd) + "\n"
    done, recorded = os.path.join(workdir, "summary.json"), os.path.join(workdir, "command.txt")
    if os.path.exists(done):
        with contextlib.suppress(FileNotFoundError), open(recorded) as f:
            if f.read() == line:
                return None
        os.replace(done, os.path.join(workdir, PREVIOUS["summary.json"]))
        with contextlib.suppress(FileNotFoundError):
            os.replace(recorded, os.path.join(workdir, PREVIOUS["command.txt"]))
    try:
        with open(recorded, "w") as f:
            f.write(line)
        with open(os.path.join(workdir, "train.log"), "a") as log:  # the child keeps its copy
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={
                **os.environ, cli.STOP_WITH_PARENT: str(os.getpid())})
    except BaseException:  # not started (a full disk, say): the finished run's files stay
        _restore_previous(workdir)
        raise


def run_all(root: str, names: Sequence[str],
            start: Callable[[str], subprocess.Popen | None], parallel: int,
            after: Mapping[str, str] | None = None) -> list[str]:
    """Runs ``start(name)`` (``launch``: None for a run already finished) for every run,
    ``parallel`` at a time; a run named in ``after`` waits until that run has finished, and
    is skipped if it failed (also when it kept an earlier command's results). Returns the runs
    that failed or were skipped, each with why. SIGINT or SIGTERM stops the runs going and,
    once they have exited, raises ``KeyboardInterrupt`` or exits with status 143 (``_stop``).
    Several runs at a time may share one GPU: each takes memory as it needs it
    (``platform.share_gpu_memory``), not 75% of the device up front."""
    after = after or {}
    if parallel > 1:
        platform.share_gpu_memory()  # the runs inherit the driver's environment
    os.makedirs(root, exist_ok=True)
    pending = list(dict.fromkeys(names))  # a run named twice would train one workdir twice
    running: dict[str, tuple[subprocess.Popen, int]] = {}  # name -> (process, its log's start)
    failed: dict[str, str] = {}  # name -> why
    with _signals_received() as received:
        while (pending or running) and not received:
            for name in list(pending):
                if len(running) >= parallel or received:
                    break
                first = after.get(name)
                log_from = _size(os.path.join(root, name, "train.log"))
                try:  # bad input of one run (a damaged summary.json) fails that run alone
                    waits = bool(first) and (first in failed or summary(root, first) is None)
                    proc = None if waits else start(name)
                except (UserError, OSError) as e:  # OSError: a full disk, say
                    _log(f"not started {name}: {e}")
                    failed[name] = f"not started: {e}"
                    pending.remove(name)
                    continue
                if waits:
                    if first not in running and first not in pending:
                        _log(f"skipped {name}: {first} failed")
                        failed[name] = f"skipped: {first} failed"
                        pending.remove(name)
                    continue
                pending.remove(name)
                if proc is None:
                    _log(f"{name} has finished (its summary.json is of this command)")
                else:
                    running[name] = proc, log_from
                    _log(f"started {name}")
            for _ in range(20):  # 2 s, cut short by a signal
                if received:
                    break
                time.sleep(0.1)
            for name, (proc, log_from) in list(running.items()):
                if proc.poll() is not None:
                    del running[name]
                    why = _ended(root, name, proc.returncode, log_from, "failed")
                    if why:
                        failed[name] = why
        if received:
            _stop(root, running, received)
    return [f"{name} ({why})" for name, why in failed.items()]


@contextlib.contextmanager
def _signals_received() -> Iterator[list[int]]:
    """Records SIGINT and SIGTERM in the list it yields instead of acting on them, so that
    ``run_all`` stops its runs between two of its steps (a run it has started is one it
    stops)."""
    received: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop(root: str, running: dict[str, tuple[subprocess.Popen, int]],
          received: list[int]) -> NoReturn:
    """Passes SIGTERM on to the runs going, which the binaries take as a first Ctrl-C (they
    stop with a checkpoint), waits for them and raises ``KeyboardInterrupt`` (for SIGINT) or
    exits with status 143 (128 + SIGTERM), as the binaries do. A signal
    received while waiting passes SIGINT on: to a binary asked to stop, a second Ctrl-C, which
    stops it at once. (Not SIGINT first: a Ctrl-C at the terminal has reached the runs too,
    and another SIGINT would be their second.)"""
    if running:
        _log(f"{signal.Signals(received[0]).name}: stopping {', '.join(running)}, each with a "
             "checkpoint (a second signal: at once)")
    passed = 0  # the signals received that have been passed on
    while running:
        if passed < len(received):
            for proc, _ in running.values():
                proc.send_signal(signal.SIGINT if passed else signal.SIGTERM)
            passed = len(received)
        time.sleep(0.1)
        for name, (proc, log_from) in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                _ended(root, name, proc.returncode, log_from, "stopped")
    if received[0] == signal.SIGTERM:
        sys.exit(128 + signal.SIGTERM)
    raise KeyboardInterrupt


def _ended(root: str, name: str, returncode: int, log_from: int, verb: str) -> str | None:
    """Logs that run ``name`` has exited: finished, or ``verb`` (failed, stopped) with the
    last line it wrote to its log (a binary's one-line error) and its previous results put
    back (``_restore_previous``; finished, the results it replaced are deleted). Returns why
    it did not finish, or None if it did."""
    if returncode == 0 and os.path.exists(os.path.join(root, name, "summary.json")):
        for previous in PREVIOUS.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(root, name, previous))
        _log(f"finished {name}")
        return None
    log = os.path.join(root, name, "train.log")
    said = _last_line(log, log_from)
    kept = _restore_previous(os.path.join(root, name))
    status = _status(returncode)
    _log(f"{verb} {name} ({status}{f': {said}' if said else ''}; its log: {log})"
         + ("; its previous results are kept" if kept else ""))
    return status


def _status(returncode: int) -> str:
    """How a run that did not finish exited: ``exit N``, ``killed by SIGNAL`` (Popen's
    negative return code; a second Ctrl-C, say) or ``exit 0 without a summary.json`` (the
    run did not train: ``--dry_run`` or ``--mode`` in ``--extra``, say)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}" if returncode else "exit 0 without a summary.json"


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def _last_line(path: str, start: int) -> str:
    """The last non-empty line of ``path`` after byte ``start`` (in its last 4 KiB), or ""."""
    try:
        with open(path, "rb") as f:
            f.seek(max(start, f.seek(0, os.SEEK_END) - 4096))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def not_finished(root: str, names: Sequence[str]) -> str:
    """What a report says of runs ``names`` under ``root`` that have no summary:
    "unfinished" where one has trained (a checkpoint, its own, a fold's or a rate's), else
    "not run"."""
    started = any(glob.glob(os.path.join(root, glob.escape(n), "**", "checkpoints", "*"),
                            recursive=True) for n in names)
    return "unfinished" if started else "not run"


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


RECORDS = ("command.txt", "summary.json", "metrics.jsonl", "curves.png")


def record(root: str, names: Sequence[str], dest: str, subdirs: Sequence[str] = ("",)) -> None:
    """Copies the records (``RECORDS``: command, summary, per-epoch metrics, curves) of each
    finished run of ``names`` under ``root``, and of its ``subdirs`` (glob patterns: a
    sweep's rates, CV folds), to ``dest/NAME/`` (``check`` has refused ``dest == root``)."""
    for name in names:
        if summary(root, name) is None:
            continue
        src = os.path.join(root, name)
        for sub in subdirs:
            for d in glob.glob(os.path.join(src, sub)):
                out = os.path.join(dest, name, os.path.relpath(d, src))
                os.makedirs(out, exist_ok=True)
                for f in RECORDS:
                    if os.path.exists(os.path.join(d, f)):
                        shutil.copy2(os.path.join(d, f), os.path.join(out, f))


def check_all_finished(failed: Sequence[str], root: str) -> None:
    """After the report: a ``UserError`` (exit status 2) naming the runs that failed."""
    if failed:
        raise UserError(f"{len(failed)} run(s) did not finish: {', '.join(failed)}; each "
                        f"one's output is in {root}/NAME/train.log")


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)
