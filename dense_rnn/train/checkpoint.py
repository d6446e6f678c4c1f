"""Atomic orbax checkpoints with exact resume, tied to the config that wrote them.

A workdir holds ``checkpoints/<step>/`` (the latest training states, for resume) and
``best/<step>/`` (the parameters with the best validation metric). Orbax writes each
checkpoint to a temporary directory and renames it when complete, so a run killed while
saving leaves the previous checkpoint intact. A Ctrl-C while a save is being started is
held back until it has been, and closing the ``Checkpointer`` on the way out lets the save
finish. A workdir also keeps the run's identity (``run_identity.json``) and digests of its
data (``data_fingerprint.json``), which a resume must match.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp

from dense_rnn import files
from dense_rnn.errors import UserError
from dense_rnn.files import atomic_write

P = TypeVar("P")


class UnreadableCheckpoint(UserError):
    """A checkpoint that cannot be read: damaged, or of another structure."""

    def __init__(self, where: str, why: str):
        super().__init__(f"checkpoint {where} cannot be read ({why}): it is damaged or does "
                         "not fit this config; use a new --workdir")
        self.where, self.why = where, why


# What a restore may fail on for want of a resource, the checkpoint intact: the errno of
# an OSError, or the status code of a tensorstore error. Anything else (EIO, a file cut
# short or missing) counts as damage.
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.EACCES,
                    errno.EPERM, errno.ETIMEDOUT}
_RESOURCE_STATUSES = ("RESOURCE_EXHAUSTED", "PERMISSION_DENIED", "UNAVAILABLE",
                      "DEADLINE_EXCEEDED")


def _passing(e: Exception) -> bool:
    """Whether a restore failed for want of a resource (memory, file handles, time,
    permission) rather than because the checkpoint is damaged."""
    if isinstance(e, MemoryError | TimeoutError | PermissionError):
        return True
    if isinstance(e, OSError):
        return e.errno in _RESOURCE_ERRNOS
    return any(code in str(e) for code in _RESOURCE_STATUSES)


def _brief(e: BaseException, limit: int = 160) -> str:
    """``e``'s type and the first line of its message, cut at a word within ``limit``."""
    lines = str(e).splitlines()
    if not lines:
        return type(e).__name__
    msg = lines[0] if len(lines[0]) <= limit else lines[0][:limit].rsplit(" ", 1)[0] + " ..."
    return f"{type(e).__name__}: {msg}"


def _abandoned_work(e: BaseException | None) -> bool:
    """Whether ``e`` is what a failed orbax restore or save leaves behind once it has
    raised: its pending tensorstore callbacks' "Event loop is closed", or a shard read,
    abandoned half way, that answers being closed (``GeneratorExit``) with an error of its
    own."""
    if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
        return True
    return isinstance(e, Exception) and isinstance(e.__cause__, GeneratorExit) and str(
        e).startswith("Encountered error while reading array index")


# The warning an abandoned orbax metadata read gives when garbage collection finds it,
# at any later moment of the run (it gave two stray lines in a test's resume past a
# damaged best checkpoint)
ABANDONED_READ_WARNING = r"coroutine 'Store\._get_array_metadatas' was never awaited"


def _quiet_closed_loops() -> None:
    """Drops the unraisable errors of a failed orbax restore's or save's abandoned work
    (``_abandoned_work``; a save that fills the disk leaves the same: a dozen
    tracebacks, hundreds of lines, above the one line that explains the failure), and
    the warning of its abandoned metadata read (``ABANDONED_READ_WARNING``); every other
    unraisable error and warning is reported as before."""
    warnings.filterwarnings("ignore", ABANDONED_READ_WARNING, RuntimeWarning)
    previous = sys.unraisablehook
    if getattr(previous, "quiet_closed_loops", False):
        return

    def hook(u: Any) -> None:
        if not _abandoned_work(u.exc_value):
            previous(u)

    hook.quiet_closed_loops = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


@contextlib.contextmanager
def _interrupt_after() -> Iterator[None]:
    """Holds back Ctrl-C (SIGINT) until the block has run, then hands it to the handler it
    would have reached (Python's raises ``KeyboardInterrupt``). Orbax starts a save on
    threads of its own; cut off half-way, the save is neither finished by ``close()`` nor
    abandoned quietly at interpreter exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[tuple[int, Any]] = []
    previous = signal.signal(signal.SIGINT, lambda *args: received.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received and previous is not signal.SIG_IGN:
        if not callable(previous):  # SIG_DFL, or a handler set outside Python
            raise KeyboardInterrupt
        previous(*received[0])


def _manager(path: str, max_to_keep: int, create: bool = True) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create)
    return ocp.CheckpointManager(os.path.abspath(path), options=options)


IDENTITY_FILE = "run_identity.json"
DATA_FILE = "data_fingerprint.json"


def data_digests(splits: Mapping[str, Sequence[np.ndarray]]) -> dict[str, str]:
    """A SHA-256 digest of each split: its arrays (word ids, labels) in order, each as
    little-endian int64 values after its length, so that the same examples in another
    order, or split otherwise, give another digest."""
    out = {}
    for name, arrays in splits.items():
        h = hashlib.sha256()
        for a in arrays:
            a = np.asarray(a, "<i8").ravel()
            h.update(np.int64(a.size).astype("<i8").tobytes() + a.tobytes())
        out[name] = h.hexdigest()
    return out


def check_workdir_path(workdir: str) -> None:
    """A ``UserError`` for a path orbax cannot keep checkpoints under: one with a ``[``,
    which its merge of a save's parts reads as a glob pattern, so that every checkpoint
    saved there is written without its index and cannot be read back."""
    if "[" in os.path.abspath(workdir):
        raise UserError(f"--workdir={workdir}: the checkpoint library reads '[' in a path as "
                        "a pattern and could not read its checkpoints back; give a path "
                        "without '['")


def _lock(workdir: str) -> int | None:
    """Creates ``workdir`` if need be and takes its lock (``files.lock``) on the first
    process; the hosts of a multi-host run learn from it whether it could, and all raise or
    none does."""
    try:
        os.makedirs(workdir, exist_ok=True)
    except FileExistsError:
        raise UserError(f"--workdir={workdir} is a file, not a directory; give a directory "
                        "for the run") from None
    except OSError as e:
        raise UserError(f"cannot use --workdir={workdir}: {e.strerror}") from None
    fd, error = None, None
    if jax.process_index() == 0:
        try:
            fd = files.lock(workdir)
        except UserError as e:
            error = e
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        if multihost_utils.broadcast_one_to_all(np.int32(error is not None)) and error is None:
            error = UserError(f"{workdir} is in use by another run, or cannot be locked (the "
                              "first host's error says which)")
    if error is not None:
        if fd is not None:
            os.close(fd)
        raise error
    return fd


_run_locks: set[str] = set()  # the workdirs a ``locked`` block of this process holds


@contextlib.contextmanager
def _hold(workdir: str) -> Iterator[None]:
    """``workdir``'s lock (``_lock``) over the block."""
    fd = _lock(workdir)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def locked(workdir: str) -> Iterator[None]:
    """Holds ``workdir``'s lock over the block, for a run that writes its summary there once
    its training has finished: training in ``workdir`` itself (a ``Checkpointer`` opened
    there inside the block trains under this lock) or in its subdirectories (CV folds, a
    sweep's rates, each locked there too). The registry is the process's: a Checkpointer
    another thread opens there meanwhile shares the lock as well."""
    check_workdir_path(workdir)
    key = os.path.realpath(workdir)
    with _hold(workdir):
        _run_locks.add(key)
        try:
            yield
        finally:
            _run_locks.discard(key)


def read_identity(workdir: str) -> dict[str, Any] | None:
    """The identity of the run in ``workdir`` (``run_identity.json``), or None."""
    path = os.path.join(workdir, IDENTITY_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            identity = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is unreadable ({type(e).__name__}); restore it, or use a "
                        "new --workdir") from None
    if not isinstance(identity, dict):
        raise UserError(f"{path} is not a run identity; use a new --workdir")
    return identity


def binding_identity(workdir: str) -> dict[str, Any] | None:
    """The identity that the run in ``workdir`` holds it to: its ``run_identity.json`` once
    a checkpoint of it is complete (orbax renames a step's directory to its number when it
    is), else None. The identity is written just before the first save, so one left by a
    run killed inside that save binds nothing, and the next run's first save replaces it."""
    for sub in ("checkpoints", "best"):
        path = os.path.join(workdir, sub)
        if os.path.isdir(path) and any(d.isdigit() for d in os.listdir(path)):
            return read_identity(workdir)
    return None


def _read_digests(path: str) -> dict[str, str]:
    """The split digests kept at ``path`` (``Checkpointer.keep_data_digests``)."""
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = type(e).__name__
    else:
        if isinstance(stored, dict):
            return stored
        why = "not a JSON object"
    raise UserError(f"{path} is unreadable ({why}); restore it, or delete it to resume "
                    "without checking the data")


def runs_below(workdir: str) -> list[str]:
    """The subdirectories of ``workdir`` that hold a run (CV folds, a sweep's rates, runs
    of a table driver's root), sorted."""
    if not os.path.isdir(workdir):
        return []
    return sorted(d for d in os.listdir(workdir)
                  if os.path.isfile(os.path.join(workdir, d, IDENTITY_FILE)))


def identity_error(workdir: str, stored: dict[str, Any], identity: dict[str, Any],
                   ignored: Sequence[str] = (), where: str = "") -> UserError | None:
    """The error for ``workdir`` (``where``: its subdirectory that holds the run) when its
    ``stored`` run identity differs from ``identity`` in keys other than ``ignored``; else
    None."""
    diff = sorted(k for k in set(stored) | set(identity)
                  if k not in ignored and stored.get(k) != identity.get(k))
    if not diff:
        return None
    # a nested field (a classifier's model_args) by the keys that differ in it
    changes = [(f"{k}.{sub}" if sub else k, a, b) for k in diff
               for sub, a, b in _changed(stored.get(k), identity.get(k))]
    shown = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changes[:4]) + (
        f" and {len(changes) - 4} more" * (len(changes) > 4))
    keys = set(stored) | set(identity)
    # Most fields only on one side: a run of the other binary (ptb_lm / classify).
    what = ("another kind of model" if 2 * len(set(stored) ^ set(identity)) > len(keys)
            else "another config")
    return UserError(f"workdir {workdir} holds a run of {what}{where} ({shown}); use a new "
                     "--workdir, or the same config to resume")


def _changed(a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """``(key, a's value, b's value)`` for each key where dicts ``a`` and ``b`` differ
    (missing: None), or ``[("", a, b)]`` if either is not a dict."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [("", a, b)]
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


class Checkpointer:
    """Latest and best checkpoints of one run; a context manager that closes them.

    ``identity`` is the part of the config that must not change across a resume (the
    model and its data); a workdir written under another identity is refused. Its
    ``descriptive`` keys (the paper's numbers beside a config) are stored but not compared,
    so correcting one leaves the runs resumable. The identity is written as the first
    checkpoint is saved and binds only once one is complete, so a run that fails before that
    (killed inside that save, too) leaves the workdir free for any config. One process at a
    time trains in a workdir: it is locked until ``close`` (or the process's end), unless a
    ``locked`` block around it holds the lock already. ``read_only`` (inference) creates,
    writes and locks nothing there. ``added``: identity keys that older versions left out; a
    stored identity without one is not compared on it.
    """

    def __init__(self, workdir: str, identity: dict[str, Any], max_to_keep: int = 2,
                 descriptive: tuple[str, ...] = (), read_only: bool = False,
                 added: tuple[str, ...] = ()):
        self.workdir = workdir
        self.identity = json.loads(json.dumps(identity))  # as stored: tuples become lists
        self.descriptive = descriptive
        self.added = added
        self.resumed_config: dict[str, Any] | None = None  # the latest checkpoint's (resume)
        check_workdir_path(workdir)
        _quiet_closed_loops()  # a failing save's or restore's callbacks
        self._held = contextlib.ExitStack()  # the workdir's lock, until close
        if not read_only and os.path.realpath(workdir) not in _run_locks:
            self._held.enter_context(_hold(workdir))
        try:
            stored = binding_identity(workdir)
            if stored is not None:
                self._check_identity(stored)
            self._identity_written = stored is not None
            self._latest = _manager(os.path.join(workdir, "checkpoints"), max_to_keep,
                                    not read_only)
            # two: a resume drops one saved after the latest checkpoint (``resume``)
            self._best = _manager(os.path.join(workdir, "best"), 2, not read_only)
        except BaseException:
            self._held.close()
            raise

    def _check_identity(self, stored: dict[str, Any]) -> None:
        older = tuple(k for k in self.added if k not in stored)  # a run from before them
        error = identity_error(self.workdir, stored, self.identity, self.descriptive + older)
        if error:
            raise error

    def _write_identity(self) -> None:
        if self._identity_written:
            return
        if jax.process_index() == 0:  # a multi-host run's hosts share the workdir
            atomic_write(os.path.join(self.workdir, IDENTITY_FILE),
                         json.dumps(self.identity, indent=1, sort_keys=True))
        self._identity_written = True

    def keep_data_file(self, path: str, load: Callable[[str], Any], save: Callable[[str], None],
                       current: Any, problem: str | Callable[[Any], str]) -> None:
        """Keeps the run's data description ``current`` (a vocabulary, digests) at ``path``,
        written by ``save`` on the first process, after refusing to resume on other data:
        when the workdir holds a checkpoint and the file (as ``load`` reads it) differs from
        ``current``, raises ``UserError(problem)`` (a function of the stored value: its
        result). A run from before the file has none, and is not checked."""
        if self.latest_step() is not None and os.path.isfile(path):
            stored = load(path)
            if stored != current:
                raise UserError(problem(stored) if callable(problem) else problem)
        if jax.process_index() == 0:  # a multi-host run's hosts share the workdir
            save(path)

    def keep_data_digests(self, digests: dict[str, str], fix: str) -> None:
        """``keep_data_file`` for the digests of the run's splits (``data_digests``) in
        ``DATA_FILE``: other digests are refused naming their splits, the error ending in
        ``fix``."""
        def differs(stored: dict[str, str]) -> str:
            changed = sorted(k for k in set(stored) | set(digests)
                             if stored.get(k) != digests.get(k))
            return (f"{self.workdir} was trained on other data (its {DATA_FILE} differs in "
                    f"the {', '.join(changed)} split(s)); {fix}")

        self.keep_data_file(
            os.path.join(self.workdir, DATA_FILE), _read_digests,
            lambda path: atomic_write(path, json.dumps(digests, indent=1, sort_keys=True)),
            digests, differs)

    def latest_step(self) -> int | None:
        """The step of the latest checkpoint, or None before the first."""
        return self._latest.latest_step()

    def _save(self, manager: ocp.CheckpointManager, step: int, args: ocp.args.Composite) -> None:
        """Saves ``step``, replacing a checkpoint of that step: a run killed after its best
        checkpoint of step S but before its latest one replays that epoch and saves S again."""
        with _interrupt_after():
            self._write_identity()
            if step in manager.all_steps():
                manager.wait_until_finished()
                manager.delete(step)
            manager.save(step, args=args, force=True)

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Saves the training ``state`` and its metadata as the latest checkpoint of ``step``."""
        self._save(self._latest, step, ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

    def save_progress(self, state: Any, progress: Any, config: dict[str, Any]) -> None:
        """Saves ``state`` as the latest checkpoint of step ``progress.global_step``, with
        ``progress`` (a dataclass: what ``resume`` gives back) and ``config`` as metadata."""
        jax.block_until_ready(state)
        self.save(progress.global_step, state,
                  {"progress": dataclasses.asdict(progress), "config": config})

    def _restore(self, manager: ocp.CheckpointManager, item: str, like: Any,
                 step: int | None = None) -> tuple[Any, dict[str, Any]] | None:
        """``item`` of ``manager``'s checkpoint ``step`` (default: the latest), structured like
        ``like``, and its metadata, or None without a checkpoint; one that cannot be read
        is an ``UnreadableCheckpoint`` (a ``UserError`` that says so where the reason is a
        want of memory, file handles or permission: ``_passing``)."""
        step = manager.latest_step() if step is None else step
        if step is None:
            return None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        args = {item: ocp.args.StandardRestore(abstract), "meta": ocp.args.JsonRestore()}
        try:
            with warnings.catch_warnings():  # orbax < 0.12, on restoring without shardings
                warnings.filterwarnings("ignore", "Sharding info not provided", UserWarning)
                out = manager.restore(step, args=ocp.args.Composite(**args))
        except Exception as e:  # orbax raises bare Exceptions for damaged files
            why = _brief(e)
            where = f"{self.workdir}/{manager.directory.name}/{step}"
            if _passing(e):
                raise UserError(f"checkpoint {where} could not be read ({why}), which is no "
                                "sign of damage (nothing was moved): fix its cause and rerun "
                                "the same command") from None
            raise UnreadableCheckpoint(where, why) from None
        # orbax restores an array in its stored shape, whatever the one asked for
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(out[item]),
                                jax.tree.leaves(abstract), strict=True):
            if np.shape(a) != tuple(b.shape):
                raise UnreadableCheckpoint(
                    f"{self.workdir}/{manager.directory.name}/{step}",
                    f"{jax.tree_util.keystr(path)} has shape {np.shape(a)}, this model's "
                    f"{b.shape}")
        return out[item], out.meta

    def restore(self, like: Any) -> tuple[Any, dict[str, Any]] | None:
        """The latest state (structured like ``like``) and its metadata, or None. When the
        latest checkpoints cannot be read (a file cut short, say) and an older one can, the
        older one is restored and only then are the newer ones reported on stderr and moved
        to ``WORKDIR/unreadable_checkpoints/``; when none can, the latest one's error is
        raised and nothing is moved."""
        unreadable: list[tuple[int, UnreadableCheckpoint]] = []
        for step in sorted(self._latest.all_steps(), reverse=True):
            try:
                restored = self._restore(self._latest, "state", like, step)
            except UnreadableCheckpoint as e:
                unreadable.append((step, e))
                continue
            for bad, e in unreadable:
                print(f"warning: checkpoint {e.where} cannot be read ({e.why}): it is damaged or "
                      f"does not fit this config; moved to {self._set_aside(bad)}, resuming "
                      f"from checkpoint {step}", file=sys.stderr, flush=True)
            return restored
        if unreadable:
            raise unreadable[0][1]
        return None

    def _aside(self, name: str) -> str:
        """A timestamped path for ``name`` in ``WORKDIR/unreadable_checkpoints/`` (made)."""
        aside = os.path.join(self.workdir, "unreadable_checkpoints")
        os.makedirs(aside, exist_ok=True)
        return os.path.join(aside, f"{name}.{time.strftime('%Y%m%d-%H%M%S')}")

    def _set_aside(self, step: int) -> str:
        """Moves latest checkpoint ``step`` out of the checkpoint directory; returns where."""
        dest = self._aside(str(step))
        try:
            os.replace(os.path.join(self._latest.directory, str(step)), dest)
        except FileNotFoundError:  # moved already by another process of a multi-host run
            pass
        self._latest.reload()
        return dest

    def discard_from(self, step: int) -> int | None:
        """Removes the latest checkpoints of ``step`` and later (those of weights a diverged
        loss came from); returns the step of the latest one left, or None."""
        with _interrupt_after():
            self._latest.wait_until_finished()
            for s in self._latest.all_steps():
                if s >= step:
                    self._latest.delete(s)
        return self._latest.latest_step()

    def resume(self, state: Any, progress: P) -> tuple[Any, P]:
        """The latest training state and the ``progress`` saved with it (metadata key
        ``"progress"``, a dataclass of ``progress``'s type), or both as given before the
        first checkpoint; the config saved with them becomes ``resumed_config``."""
        restored = self.restore(state)
        self._drop_best_after(self._latest.latest_step())
        if restored is None:
            return state, progress
        state, meta = restored
        fields = {f.name for f in dataclasses.fields(progress)}
        if not isinstance(meta.get("progress"), dict) or set(meta["progress"]) - fields:
            raise UnreadableCheckpoint(f"{self.workdir}/checkpoints/{self._latest.latest_step()}",
                                       "its progress record is not this version's")
        self.resumed_config = meta.get("config")
        return state, type(progress)(**meta["progress"])

    def _drop_best_after(self, step: int | None) -> None:
        """Deletes the best checkpoints after ``step``, the latest one (all without one): a
        run killed between saving its best and its latest checkpoint of a step left one, of
        weights the resumed run may not reach again (changed flags, nondeterministic
        kernels); the best before it, the one the resumed run's progress records, stays."""
        with _interrupt_after():
            self._best.wait_until_finished()
            for s in self._best.all_steps():
                if step is None or s > step:
                    self._best.delete(s)

    def save_best(self, step: int, params: Any, meta: dict[str, Any]) -> None:
        """Saves ``params`` and their metadata as the best checkpoint, finished before it
        returns: a latest checkpoint saved after it never records a best that is not there."""
        self._save(self._best, step, ocp.args.Composite(
            params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)))
        with _interrupt_after():
            self._best.wait_until_finished()

    def has_best(self) -> bool:
        """Whether a best checkpoint is there."""
        return self._best.latest_step() is not None

    def restore_best(self, like: Any) -> tuple[Any, dict[str, Any]] | None:
        """The best parameters (structured like ``like``) and their metadata, or None."""
        return self._restore(self._best, "params", like)

    def best_readable(self, like: Any) -> bool:
        """Whether the best parameters, if any, can be read (structured like ``like``); when
        they cannot (a file cut short, say), every best checkpoint is reported on stderr and
        moved to ``WORKDIR/unreadable_checkpoints/best.*``, so that the resumed run chooses
        its best parameters anew (their progress record no longer stands)."""
        error = None
        try:
            self.restore_best(like)
        except UnreadableCheckpoint as e:
            error = e
        multihost = jax.process_count() > 1
        if multihost:  # the first host's verdict for all, before any of them moves a file
            from jax.experimental import multihost_utils

            if not multihost_utils.broadcast_one_to_all(np.int32(error is not None)):
                return True
        elif error is None:
            return True
        self._best.wait_until_finished()
        self._best.close()
        if jax.process_index() == 0:
            aside = self._aside("best")
            os.replace(self._best.directory, aside)
            print(f"warning: best checkpoint {error.where} cannot be read ({error.why}): "
                  f"moved {len(os.listdir(aside))} best checkpoint(s) to {aside}; the best "
                  "parameters are chosen anew from the validations to come",
                  file=sys.stderr, flush=True)
        if multihost:
            multihost_utils.sync_global_devices("dense_rnn: best checkpoints set aside")
        self._best = _manager(str(self._best.directory), 2)
        return False

    def wait(self) -> None:
        """Blocks until every pending (asynchronous) save has finished."""
        self._latest.wait_until_finished()
        self._best.wait_until_finished()

    def close(self) -> None:
        """Finishes pending saves, releases both checkpoint managers and the workdir."""
        try:
            try:
                self._latest.close()
            finally:
                self._best.close()
        finally:
            self._held.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Closes, also when the run stops on an error or an interrupt (Ctrl-C): a save in
        flight finishes rather than being cut off at interpreter exit."""
        self.close()


def early_stopped(bad_epochs: int, patience: int) -> bool:
    """Whether ``bad_epochs`` without a better validation metric stop a run under ``patience``
    (0: never). Asked again on resume, where the patience may have changed."""
    return bool(patience) and bad_epochs >= patience


def finished_because(early_stopped: bool, epoch: int, max_epochs: int, step: int = 0,
                     max_steps: int = 0) -> str | None:
    """Why a run has nothing left to train, or None while it has."""
    if early_stopped:
        return "stopped early"
    if 0 < max_steps <= step:
        return f"--max_steps={max_steps} reached; a larger value trains on"
    if epoch >= max_epochs:
        return f"--max_epochs={max_epochs} reached; a larger value trains on"
    return None


BUDGET = ("max_epochs", "max_steps", "early_stopping_patience")


def reported_config(config: dict[str, Any], resumed: dict[str, Any] | None,
                    finished: str | None) -> dict[str, Any]:
    """``config`` as a run's summary records it. A run ``finished`` before this call (why,
    from ``finished_because``) only reports: the summary keeps the training budget
    (``BUDGET``) of ``resumed``, its latest checkpoint's config, so rerun with a smaller
    ``--max_steps`` to see its results, the run still records the one it trained to."""
    if finished is None or not resumed:
        return config
    return config | {k: resumed[k] for k in BUDGET if k in config and k in resumed}


def check_steps_per_epoch(workdir: str, progress: Any, steps_per_epoch: int) -> None:
    """Refuses to resume a run (``progress``: its ``step_in_epoch`` and recorded
    ``steps_per_epoch``, 0 where not recorded) on a training split of another length, then
    records ``steps_per_epoch`` in ``progress``."""
    if progress.step_in_epoch > steps_per_epoch or progress.steps_per_epoch not in (
            0, steps_per_epoch):
        raise UserError(f"{workdir} was trained on another training split "
                        f"({progress.steps_per_epoch or 'more'} steps per epoch, this one "
                        f"gives {steps_per_epoch}); pass the run's data (its --data_dir or "
                        "--hf_dataset) or use a new --workdir")
    progress.steps_per_epoch = steps_per_epoch


def resume_line(workdir: str, step: int, epoch: int, position: str,
                finished: str | None) -> str:
    """The line a run prints when it starts from its latest checkpoint: where training picks
    up (``position``: the step within epoch ``epoch + 1``) or, for a run with nothing left
    to train (``finished``: why, from ``finished_because``), that it only reports."""
    if finished is None:
        return f"resumed from {workdir}/checkpoints/{step} at epoch {epoch + 1} {position}"
    return (f"{workdir} holds a finished run (step {step}; {finished}): "
            "nothing to train, reporting its results")


def load_best(workdir: str, identity: dict[str, Any], like: Any, written: str) -> Any:
    """The best parameters of the run in ``workdir`` (structured like ``like``), for
    inference, onto this process's first device (whatever devices trained them);
    ``written`` says when training writes them, for the error without any."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=device),
                        like)
    with Checkpointer(workdir, identity, read_only=True) as ckpt:  # writes nothing there
        try:
            best = ckpt.restore_best(like)
        except UnreadableCheckpoint as e:
            raise UserError(f"best checkpoint {e.where} cannot be read ({e.why}): it is "
                            "damaged or does not fit this run's config; a damaged one is set "
                            "aside, and the best parameters saved anew, by the run's training "
                            "command rerun on this --workdir") from None
    if best is None:
        raise UserError(f"no checkpoint in {workdir}/best (written {written}); train longer "
                        "or pass another --workdir")
    return best[0]
